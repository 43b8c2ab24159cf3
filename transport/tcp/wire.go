package tcp

import (
	"encoding/binary"
	"fmt"

	"github.com/hmc-go/hmc/status"
)

// Protocol constants (docs/wire/tcp.md).
const (
	magic       = "HMCT"
	version     = 1
	helloSize   = 32
	welcomeSize = 24
	reqSize     = 32
	respSize    = 16
)

// Request and response opcodes.
const (
	opPut     = 1
	opGet     = 2
	opPutAck  = 0x81
	opGetData = 0x82
)

// Response status bytes.
const (
	stOK         = 0
	stOutOfRange = 1
)

// hello is the first message of every lane, initiator → target.
type hello struct {
	lane, lanes uint16
	rank        uint32
	session     uint64
	listenPort  uint16
}

func (h hello) encode(b *[helloSize]byte) {
	*b = [helloSize]byte{}
	copy(b[0:4], magic)
	binary.LittleEndian.PutUint16(b[4:], version)
	binary.LittleEndian.PutUint16(b[6:], h.lane)
	binary.LittleEndian.PutUint16(b[8:], h.lanes)
	// b[10:12] flags, zero
	binary.LittleEndian.PutUint32(b[12:], h.rank)
	binary.LittleEndian.PutUint64(b[16:], h.session)
	binary.LittleEndian.PutUint16(b[24:], h.listenPort)
	// b[26:32] reserved, zero
}

func decodeHello(b []byte) (hello, error) {
	if len(b) != helloSize || string(b[0:4]) != magic {
		return hello{}, fmt.Errorf("tcp: bad hello magic: %w", status.ErrProtocol)
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != version {
		return hello{}, fmt.Errorf("tcp: initiator speaks version %d, target %d: %w", v, version, status.ErrUnsupported)
	}
	h := hello{
		lane:       binary.LittleEndian.Uint16(b[6:]),
		lanes:      binary.LittleEndian.Uint16(b[8:]),
		rank:       binary.LittleEndian.Uint32(b[12:]),
		session:    binary.LittleEndian.Uint64(b[16:]),
		listenPort: binary.LittleEndian.Uint16(b[24:]),
	}
	if binary.LittleEndian.Uint16(b[10:]) != 0 || binary.LittleEndian.Uint16(b[26:]) != 0 || binary.LittleEndian.Uint32(b[28:]) != 0 {
		return hello{}, fmt.Errorf("tcp: reserved hello bits set: %w", status.ErrProtocol)
	}
	if h.lanes == 0 || h.lane >= h.lanes {
		return hello{}, fmt.Errorf("tcp: hello lane %d of %d: %w", h.lane, h.lanes, status.ErrProtocol)
	}
	return h, nil
}

// welcome is the target's answer to a hello.
type welcome struct {
	rank       uint32
	regionSize uint64
}

func (w welcome) encode(b *[welcomeSize]byte) {
	*b = [welcomeSize]byte{}
	copy(b[0:4], magic)
	binary.LittleEndian.PutUint16(b[4:], version)
	binary.LittleEndian.PutUint32(b[8:], w.rank)
	binary.LittleEndian.PutUint64(b[16:], w.regionSize)
}

func decodeWelcome(b []byte) (welcome, error) {
	if len(b) != welcomeSize || string(b[0:4]) != magic {
		return welcome{}, fmt.Errorf("tcp: bad welcome magic: %w", status.ErrProtocol)
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != version {
		return welcome{}, fmt.Errorf("tcp: target speaks version %d, initiator %d: %w", v, version, status.ErrUnsupported)
	}
	return welcome{rank: binary.LittleEndian.Uint32(b[8:]), regionSize: binary.LittleEndian.Uint64(b[16:])}, nil
}

// request is a PUT or GET, initiator → target; a PUT's payload follows it.
type request struct {
	op     uint8
	id     uint64
	offset uint64
	length uint64
}

func (r request) encode(b *[reqSize]byte) {
	b[0] = r.op
	b[1], b[2], b[3], b[4], b[5], b[6], b[7] = 0, 0, 0, 0, 0, 0, 0
	binary.LittleEndian.PutUint64(b[8:], r.id)
	binary.LittleEndian.PutUint64(b[16:], r.offset)
	binary.LittleEndian.PutUint64(b[24:], r.length)
}

func decodeRequest(b *[reqSize]byte) (request, error) {
	r := request{op: b[0], id: binary.LittleEndian.Uint64(b[8:]), offset: binary.LittleEndian.Uint64(b[16:]),
		length: binary.LittleEndian.Uint64(b[24:])}
	if r.op != opPut && r.op != opGet {
		return r, fmt.Errorf("tcp: unknown request op %#x: %w", r.op, status.ErrProtocol)
	}
	if binary.LittleEndian.Uint64(b[0:8])>>8 != 0 {
		return r, fmt.Errorf("tcp: reserved request bits set: %w", status.ErrProtocol)
	}
	return r, nil
}

// response answers one request; a successful GET's data (the requested length) follows it.
type response struct {
	op     uint8
	status uint8
	id     uint64
}

func (r response) encode(b *[respSize]byte) {
	b[0], b[1] = r.op, r.status
	b[2], b[3], b[4], b[5], b[6], b[7] = 0, 0, 0, 0, 0, 0
	binary.LittleEndian.PutUint64(b[8:], r.id)
}

func decodeResponse(b *[respSize]byte) (response, error) {
	r := response{op: b[0], status: b[1], id: binary.LittleEndian.Uint64(b[8:])}
	if r.op != opPutAck && r.op != opGetData {
		return r, fmt.Errorf("tcp: unknown response op %#x: %w", r.op, status.ErrProtocol)
	}
	if r.status != stOK && r.status != stOutOfRange {
		return r, fmt.Errorf("tcp: unknown response status %d: %w", r.status, status.ErrProtocol)
	}
	return r, nil
}
