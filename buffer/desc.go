package buffer

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/hmc-go/hmc/status"
)

// Desc describes a registered region to peers: what they need to name its bytes (key, address
// range) and what a transport adds to reach it (Extra: a UCX rkey, for one). Its encoding is
// plain bytes that travel through any channel (store, control message, file), as NIXL's
// metadata blobs do; docs/wire/region.md gives the layout.
type Desc struct {
	Key   Key
	Addr  uint64 // the region's start address in its owner
	Size  uint64
	Extra []byte // transport-specific, at most MaxDescExtra bytes
}

// Desc returns the region's descriptor (without Extra).
func (r *Region) Desc() Desc { return Desc{Key: r.key, Addr: r.Addr(), Size: r.Size()} }

// Descriptor layout constants (docs/wire/region.md).
const (
	descMagic   = "HMCR"
	descVersion = 1
	descHeader  = 36
	// MaxDescExtra bounds a descriptor's transport-specific part (a UCX rkey is well under it).
	MaxDescExtra = 4096
)

// MarshalBinary encodes d (docs/wire/region.md).
func (d Desc) MarshalBinary() ([]byte, error) {
	if len(d.Extra) > MaxDescExtra {
		return nil, fmt.Errorf("region descriptor: extra of %d bytes (at most %d): %w", len(d.Extra), MaxDescExtra, status.ErrInvalidConfig)
	}
	b := make([]byte, descHeader, descHeader+len(d.Extra))
	copy(b, descMagic)
	binary.LittleEndian.PutUint16(b[4:], descVersion)
	// b[6:8] flags, zero
	binary.LittleEndian.PutUint32(b[8:], uint32(d.Key))
	binary.LittleEndian.PutUint64(b[12:], d.Addr)
	binary.LittleEndian.PutUint64(b[20:], d.Size)
	binary.LittleEndian.PutUint32(b[28:], uint32(len(d.Extra)))
	// b[32:36] reserved, zero
	return append(b, d.Extra...), nil
}

// ParseDesc decodes a descriptor made by MarshalBinary, checking every field before use: magic,
// version, reserved bits, a non-zero key and size, an address range that does not wrap, and
// the extra's length against both MaxDescExtra and the bytes present.
func ParseDesc(b []byte) (Desc, error) {
	bad := func(what string) (Desc, error) {
		return Desc{}, fmt.Errorf("region descriptor: %s: %w", what, status.ErrProtocol)
	}
	if len(b) < descHeader || !bytes.Equal(b[:4], []byte(descMagic)) {
		return bad("bad magic or short")
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != descVersion {
		return Desc{}, fmt.Errorf("region descriptor: version %d (this side reads %d): %w", v, descVersion, status.ErrUnsupported)
	}
	if binary.LittleEndian.Uint16(b[6:]) != 0 || binary.LittleEndian.Uint32(b[32:]) != 0 {
		return bad("reserved bits set")
	}
	d := Desc{Key: Key(binary.LittleEndian.Uint32(b[8:])), Addr: binary.LittleEndian.Uint64(b[12:]),
		Size: binary.LittleEndian.Uint64(b[20:])}
	n := binary.LittleEndian.Uint32(b[28:])
	switch {
	case d.Key == 0 || d.Key > maxKey:
		return bad(fmt.Sprintf("key %d", d.Key))
	case d.Size == 0 || d.Addr+d.Size < d.Addr:
		return bad(fmt.Sprintf("range [%#x, +%d)", d.Addr, d.Size))
	case n > MaxDescExtra || int(n) != len(b)-descHeader:
		return bad(fmt.Sprintf("extra of %d bytes with %d present", n, len(b)-descHeader))
	}
	if n > 0 {
		d.Extra = bytes.Clone(b[descHeader:])
	}
	return d, nil
}
