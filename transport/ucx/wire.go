package ucx

import (
	"encoding/binary"
	"fmt"
	"io"
	"slices"

	"github.com/hmc-go/hmc/status"
)

// The bootstrap exchange (docs/wire/ucx.md), little-endian, over the server's TCP socket:
//
//	hello   (initiator → target): "HMCU" u16 version u16 flags(0) u32 rank u32 listenPort
//	                              u32 addrLen, the initiator's worker address
//	welcome (target → initiator): "HMCU" u16 version u16 flags(0) u32 rank u64 regionAddr
//	                              u64 regionSize u32 rkeyLen, packed rkey, u32 addrLen, the
//	                              target's worker address; version 3: u64 link token (not 0)
//
// Lengths are capped (maxBlob) before anything is allocated.

const (
	magic = "HMCU"
	// version is the highest bootstrap version this side speaks: the initiator offers it, the
	// target's welcome carries the highest both speak. Version 2 adds region messages on the
	// link after the welcome; version 3, vector puts as active messages (am.go), the welcome
	// giving the link's token; version 4, PUTVs sent as rendezvous messages too.
	version    = 4
	minVersion = 1
	maxBlob    = 64 << 10
	helloFixed = 20
)

type hello struct {
	version          uint16 // decoded: the version both sides run
	rank, listenPort uint32
	workerAddr       []byte
}

type welcome struct {
	version                uint16 // the version the link runs
	rank                   uint32
	regionAddr, regionSize uint64
	rkey, workerAddr       []byte
	token                  uint64 // version 3: the link's, which its PUTVs carry
}

func (h hello) encode() []byte {
	b := make([]byte, 0, helloFixed+len(h.workerAddr))
	b = append(b, magic...)
	b = binary.LittleEndian.AppendUint16(b, version)
	b = binary.LittleEndian.AppendUint16(b, 0)
	b = binary.LittleEndian.AppendUint32(b, h.rank)
	b = binary.LittleEndian.AppendUint32(b, h.listenPort)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(h.workerAddr)))
	return append(b, h.workerAddr...)
}

func (w welcome) encode() []byte {
	b := make([]byte, 0, 40+len(w.rkey)+len(w.workerAddr))
	b = append(b, magic...)
	b = binary.LittleEndian.AppendUint16(b, w.version)
	b = binary.LittleEndian.AppendUint16(b, 0)
	b = binary.LittleEndian.AppendUint32(b, w.rank)
	b = binary.LittleEndian.AppendUint64(b, w.regionAddr)
	b = binary.LittleEndian.AppendUint64(b, w.regionSize)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(w.rkey)))
	b = append(b, w.rkey...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(w.workerAddr)))
	b = append(b, w.workerAddr...)
	if w.version >= 3 {
		b = binary.LittleEndian.AppendUint64(b, w.token)
	}
	return b
}

// readHeader reads a hello's or welcome's header and returns its version: at least
// minVersion; a welcome's at most version (a hello may offer more).
func readHeader(r io.Reader, what string) (uint16, error) {
	var b [8]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, fmt.Errorf("ucx: reading %s: %w: %w", what, status.ErrPeerClosed, err)
	}
	if string(b[:4]) != magic {
		return 0, fmt.Errorf("ucx: bad %s magic %q: %w", what, b[:4], status.ErrProtocol)
	}
	v := binary.LittleEndian.Uint16(b[4:])
	if v < minVersion || (what == "welcome" && v > version) {
		return 0, fmt.Errorf("ucx: peer's %s has bootstrap version %d, we speak %d..%d: %w", what, v, minVersion, version, status.ErrUnsupported)
	}
	if f := binary.LittleEndian.Uint16(b[6:]); f != 0 {
		return 0, fmt.Errorf("ucx: %s flags %#x: %w", what, f, status.ErrProtocol)
	}
	return v, nil
}

func readU32(r io.Reader) (uint32, error) {
	var b [4]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, fmt.Errorf("ucx: bootstrap truncated: %w: %w", status.ErrProtocol, err)
	}
	return binary.LittleEndian.Uint32(b[:]), nil
}

func readU64(r io.Reader) (uint64, error) {
	var b [8]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, fmt.Errorf("ucx: bootstrap truncated: %w: %w", status.ErrProtocol, err)
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

func readBlob(r io.Reader, what string) ([]byte, error) {
	n, err := readU32(r)
	if err != nil {
		return nil, err
	}
	if n == 0 || n > maxBlob {
		return nil, fmt.Errorf("ucx: %s of %d bytes (1..%d): %w", what, n, maxBlob, status.ErrProtocol)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, fmt.Errorf("ucx: %s truncated: %w: %w", what, status.ErrProtocol, err)
	}
	return b, nil
}

func readHello(r io.Reader) (hello, error) {
	var h hello
	v, err := readHeader(r, "hello")
	if err != nil {
		return h, err
	}
	h.version = min(v, version)
	if h.rank, err = readU32(r); err != nil {
		return h, err
	}
	if h.listenPort, err = readU32(r); err != nil {
		return h, err
	}
	if h.listenPort > 65535 {
		return h, fmt.Errorf("ucx: hello listen port %d: %w", h.listenPort, status.ErrProtocol)
	}
	h.workerAddr, err = readBlob(r, "worker address")
	return h, err
}

func readWelcome(r io.Reader) (welcome, error) {
	var w welcome
	var err error
	if w.version, err = readHeader(r, "welcome"); err != nil {
		return w, err
	}
	if w.rank, err = readU32(r); err != nil {
		return w, err
	}
	if w.regionAddr, err = readU64(r); err != nil {
		return w, err
	}
	if w.regionSize, err = readU64(r); err != nil {
		return w, err
	}
	if w.regionAddr+w.regionSize < w.regionAddr {
		return w, fmt.Errorf("ucx: welcome region %#x+%d wraps: %w", w.regionAddr, w.regionSize, status.ErrProtocol)
	}
	if w.rkey, err = readBlob(r, "rkey"); err != nil {
		return w, err
	}
	if w.workerAddr, err = readBlob(r, "worker address"); err != nil || w.version < 3 {
		return w, err
	}
	if w.token, err = readU64(r); err == nil && w.token == 0 {
		err = fmt.Errorf("ucx: welcome link token 0: %w", status.ErrProtocol)
	}
	return w, err
}

// Region messages (version 2) on the bootstrap link after the welcome, each a 32-byte header,
// a RESOLVED with status OK followed by a u32 length and the packed rkey:
//
//	RESOLVE  (initiator → target) 0x01: u8 type, 3 reserved, u32 key (0: by address), u64 id,
//	                                   u64 offset or address, u64 length
//	REVOKED  (initiator → target) 0x04: u8 type, 3 reserved, u32 key, 24 reserved
//	RESOLVED (target → initiator) 0x81: u8 type, u8 status, 2 reserved, u32 key, u64 id,
//	                                   u64 region address, u64 region size
//	REVOKE   (target → initiator) 0x84: u8 type, 3 reserved, u32 key, 24 reserved
const (
	linkMsgSize = 32

	lmResolve  = 0x01
	lmRevoked  = 0x04
	lmResolved = 0x81
	lmRevoke   = 0x84

	lsOK         = 0
	lsOutOfRange = 1
	lsNotFound   = 2
	lsFailed     = 3 // the target could not register the region with UCX
)

// linkMsg is one region message.
type linkMsg struct {
	typ, status uint8
	key         uint32
	id          uint64
	a, b        uint64 // RESOLVE: offset or address, length; RESOLVED: region address, size
}

func (m linkMsg) encode() []byte {
	b := make([]byte, linkMsgSize)
	b[0], b[1] = m.typ, m.status
	binary.LittleEndian.PutUint32(b[4:], m.key)
	binary.LittleEndian.PutUint64(b[8:], m.id)
	binary.LittleEndian.PutUint64(b[16:], m.a)
	binary.LittleEndian.PutUint64(b[24:], m.b)
	return b
}

// readLinkMsg reads one region message of the types in want, checking its fields.
func readLinkMsg(r io.Reader, want ...uint8) (linkMsg, error) {
	var b [linkMsgSize]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return linkMsg{}, err
	}
	m := linkMsg{typ: b[0], status: b[1], key: binary.LittleEndian.Uint32(b[4:]), id: binary.LittleEndian.Uint64(b[8:]),
		a: binary.LittleEndian.Uint64(b[16:]), b: binary.LittleEndian.Uint64(b[24:])}
	bad := func(what string) (linkMsg, error) {
		return m, fmt.Errorf("ucx: link message %#x: %s: %w", m.typ, what, status.ErrProtocol)
	}
	if !slices.Contains(want, m.typ) {
		return bad("unexpected type")
	}
	if b[2] != 0 || b[3] != 0 || (m.typ != lmResolved && m.status != 0) || m.status > lsFailed {
		return bad("reserved bits or status")
	}
	if (m.typ == lmRevoke || m.typ == lmRevoked) && (m.key == 0 || m.id != 0 || m.a != 0 || m.b != 0) {
		return bad("revoke fields")
	}
	if m.typ == lmResolved && m.status == lsOK && (m.key == 0 || m.b == 0 || m.a+m.b < m.a) {
		return bad("resolved region")
	}
	return m, nil
}
