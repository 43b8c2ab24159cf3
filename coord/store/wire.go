package store

import (
	"encoding/binary"
	"fmt"
	"io"
)

// The embedded store's wire format (docs/wire/store.md), memfabric's acc_links framing:
// a 16-byte connect request, a 2-byte answer, then frames of a 16-byte header and a packed
// message body. Little-endian throughout.

// Op is a store operation code.
type Op int16

// Operation codes (upstream values; opCancel is ours).
const (
	OpSet           Op = 0
	OpGet           Op = 1
	OpAdd           Op = 2
	OpRemove        Op = 3
	OpAppend        Op = 4
	OpCAS           Op = 5
	OpWrite         Op = 6
	OpWatchRankDown Op = 7
	OpHeartbeat     Op = 8
	opCancel        Op = 9 // cancel the parked Get whose seq is in UserDef (extension)
)

const (
	connectReqLen    = 16
	headerLen        = 16
	maxKeys          = 10
	maxValues        = 10
	resultChallenge  = 1 // connect answer: an authentication challenge follows (extension)
	nonceLen         = 32
	macLen           = 32
	protocolVersion0 = 0
)

// connectReq is the first thing a client sends.
type connectReq struct {
	Magic   int16
	Version int16
	Rank    uint32 // 0xFFFFFFFF: none
	World   uint32
}

const noRankWire = 0xFFFFFFFF

func (r connectReq) encode() []byte {
	b := make([]byte, connectReqLen)
	binary.LittleEndian.PutUint16(b[0:], uint16(r.Magic))
	binary.LittleEndian.PutUint16(b[2:], uint16(r.Version))
	binary.LittleEndian.PutUint64(b[8:], uint64(r.World)<<32|uint64(r.Rank))
	return b
}

func decodeConnectReq(b []byte) (connectReq, error) {
	if len(b) != connectReqLen {
		return connectReq{}, fmt.Errorf("%w: connect request of %d bytes", ErrInvalidMessage, len(b))
	}
	w := binary.LittleEndian.Uint64(b[8:])
	r := connectReq{
		Magic:   int16(binary.LittleEndian.Uint16(b[0:])),
		Version: int16(binary.LittleEndian.Uint16(b[2:])),
		Rank:    uint32(w),
		World:   uint32(w >> 32),
	}
	if r.Magic != 0 || (r.Version != 0 && r.Version != 1) {
		return r, fmt.Errorf("%w: connect request magic %d version %d", ErrInvalidMessage, r.Magic, r.Version)
	}
	if r.World > MaxWorldSize || (r.Rank != noRankWire && (r.Rank >= MaxWorldSize || (r.World > 0 && r.Rank >= r.World))) {
		return r, fmt.Errorf("%w: connect request rank %d world %d", ErrInvalidKey, r.Rank, r.World)
	}
	return r, nil
}

// header precedes every frame.
type header struct {
	Type    int16 // always 0 for the store
	Result  Code
	BodyLen uint32
	Seq     uint32
	CRC     uint32 // reserved, 0
}

func (h header) put(b []byte) {
	binary.LittleEndian.PutUint16(b[0:], uint16(h.Type))
	binary.LittleEndian.PutUint16(b[2:], uint16(h.Result))
	binary.LittleEndian.PutUint32(b[4:], h.BodyLen)
	binary.LittleEndian.PutUint32(b[8:], h.Seq)
	binary.LittleEndian.PutUint32(b[12:], h.CRC)
}

func decodeHeader(b []byte) (header, error) {
	h := header{
		Type:    int16(binary.LittleEndian.Uint16(b[0:])),
		Result:  Code(int16(binary.LittleEndian.Uint16(b[2:]))),
		BodyLen: binary.LittleEndian.Uint32(b[4:]),
		Seq:     binary.LittleEndian.Uint32(b[8:]),
		CRC:     binary.LittleEndian.Uint32(b[12:]),
	}
	if h.Type != 0 || h.BodyLen > maxBody {
		return h, fmt.Errorf("%w: frame type %d body %d bytes (max %d)", ErrInvalidMessage, h.Type, h.BodyLen, maxBody)
	}
	return h, nil
}

// message is a frame body: upstream's packed record.
type message struct {
	UserDef int64
	Op      Op
	Keys    [][]byte
	Values  [][]byte
}

// bodyLen returns the encoded size of m.
func (m *message) bodyLen() int {
	n := 8 + 8 + 2 + 8 + 8
	for _, k := range m.Keys {
		n += 8 + len(k)
	}
	for _, v := range m.Values {
		n += 8 + len(v)
	}
	return n
}

// frame encodes the header and body of m into one buffer (one write per frame).
func (m *message) frame(seq uint32, result Code) []byte {
	n := m.bodyLen()
	b := make([]byte, headerLen+n)
	header{Result: result, BodyLen: uint32(n), Seq: seq}.put(b)
	p := b[headerLen:]
	le := binary.LittleEndian
	le.PutUint64(p[0:], uint64(n))
	le.PutUint64(p[8:], uint64(m.UserDef))
	le.PutUint16(p[16:], uint16(m.Op))
	off := 18
	putList := func(list [][]byte) {
		le.PutUint64(p[off:], uint64(len(list)))
		off += 8
		for _, x := range list {
			le.PutUint64(p[off:], uint64(len(x)))
			off += 8
			off += copy(p[off:], x)
		}
	}
	putList(m.Keys)
	putList(m.Values)
	return b
}

// decodeMessage parses a body, checking every count and length against the body before use.
// The returned slices alias b.
func decodeMessage(b []byte) (*message, error) {
	bad := func(what string) error {
		return fmt.Errorf("%w: body of %d bytes: %s", ErrInvalidMessage, len(b), what)
	}
	if len(b) < 26 {
		return nil, bad("shorter than the fixed fields")
	}
	le := binary.LittleEndian
	if le.Uint64(b[0:]) != uint64(len(b)) {
		return nil, bad(fmt.Sprintf("total size field says %d", le.Uint64(b[0:])))
	}
	m := &message{UserDef: int64(le.Uint64(b[8:])), Op: Op(int16(le.Uint16(b[16:])))}
	off := 18
	getList := func(max int, maxLen uint64, what string) ([][]byte, error) {
		if len(b)-off < 8 {
			return nil, bad("truncated " + what + " count")
		}
		n := le.Uint64(b[off:])
		off += 8
		if n > uint64(max) {
			return nil, bad(fmt.Sprintf("%d %s (max %d)", n, what, max))
		}
		list := make([][]byte, 0, n)
		for i := uint64(0); i < n; i++ {
			if len(b)-off < 8 {
				return nil, bad("truncated " + what + " length")
			}
			l := le.Uint64(b[off:])
			off += 8
			if l > maxLen || l > uint64(len(b)-off) {
				return nil, bad(fmt.Sprintf("%s of %d bytes", what, l))
			}
			list = append(list, b[off:off+int(l)])
			off += int(l)
		}
		return list, nil
	}
	var err error
	if m.Keys, err = getList(maxKeys, maxServerKey, "keys"); err != nil {
		return nil, err
	}
	if m.Values, err = getList(maxValues, maxBody, "values"); err != nil {
		return nil, err
	}
	if off != len(b) {
		return nil, bad(fmt.Sprintf("%d trailing bytes", len(b)-off))
	}
	return m, nil
}

// readFrame reads one frame; the body is allocated only after the header's length is checked.
func readFrame(r io.Reader, hdr []byte) (header, []byte, error) {
	if _, err := io.ReadFull(r, hdr[:headerLen]); err != nil {
		return header{}, nil, err
	}
	h, err := decodeHeader(hdr)
	if err != nil {
		return h, nil, err
	}
	body := make([]byte, h.BodyLen)
	if _, err := io.ReadFull(r, body); err != nil {
		return h, nil, fmt.Errorf("%w: truncated frame body: %w", ErrInvalidMessage, err)
	}
	return h, body, nil
}

// casExisted is the bit of a CompareAndSwap reply's userDef that says the key existed
// (an extension: upstream's reply carries an empty value for an absent key and for an empty one).
const casExisted = 1

// subscribedKey is read right after the rank-down subscription: its answer (NOT_EXIST) says the
// server has the subscription, since a link's requests are served in order.
const subscribedKey = "hmc#subscribed"

// bareFrame is a reply whose body is raw bytes rather than a packed message, as upstream answers
// Set, Add, Append, Remove, Write, a missing key, a timed-out Get and errors.
func bareFrame(seq uint32, result Code, body string) []byte {
	f := make([]byte, headerLen+len(body))
	header{Result: result, BodyLen: uint32(len(body)), Seq: seq}.put(f)
	copy(f[headerLen:], body)
	return f
}
