package auth

// DecodeForTest runs both decoders on b and checks that what decodes re-encodes to b.
func DecodeForTest(b []byte) {
	for _, reply := range []bool{false, true} {
		if m, err := decode(b, reply); err == nil {
			if string(m.encode(reply)) != string(b) {
				panic("decoded message does not re-encode to its bytes")
			}
		}
	}
}
