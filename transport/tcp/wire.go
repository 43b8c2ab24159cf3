package tcp

import (
	"encoding/binary"
	"fmt"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/status"
)

// Protocol constants (docs/wire/tcp.md).
const (
	magic = "HMCT"
	// version is the highest wire version this side speaks; an initiator offers it, the target
	// answers with the highest it shares (minVersion at least), and both run that one.
	version     = 3
	minVersion  = 1
	helloSize   = 32
	welcomeSize = 24
	reqSize     = 32
	respSize    = 16
)

// Request and response opcodes.
const (
	opPut       = 1
	opGet       = 2
	opAtomic    = 3 // version 2: payload operand, compare (16 bytes)
	opPutV      = 4 // version 3: a piece table, then every piece's bytes; one ack
	opGetV      = 5 // version 3: a piece table; one reply with every piece's bytes
	opPutAck    = 0x81
	opGetData   = 0x82
	opAtomicAck = 0x83 // followed by the word's previous value (8 bytes) when the status is OK
)

// Addressing modes of a request (version 2; version 1 has only modeDefault).
const (
	modeDefault = 0 // offset in the region the server was started with
	modeKey     = 1 // key + offset in a registered region
	modeAddr    = 2 // an address in the target's memory, looked up in its region table
)

// atomicPayload is the size of an ATOMIC request's payload.
const atomicPayload = 16

// Vector requests (version 3): offset is the piece count, length the pieces' total bytes; a
// table of pieceSize-byte entries follows the header (then, for PUTV, the bytes).
const (
	pieceSize = 24
	maxPieces = 4096     // pieces in one vector request
	maxVector = 64 << 20 // bytes in one vector request
)

// piece is one entry of a vector request's table: key (0: addr is an address in the target's
// region table; DefaultRegion's key: an offset in the server's own region; else a region key
// and an offset in it), reserved u32, addr u64, length u64.
type piece struct {
	key    uint32
	addr   uint64
	length uint64
}

func (p piece) encode(b []byte) {
	binary.LittleEndian.PutUint32(b[0:], p.key)
	binary.LittleEndian.PutUint32(b[4:], 0)
	binary.LittleEndian.PutUint64(b[8:], p.addr)
	binary.LittleEndian.PutUint64(b[16:], p.length)
}

func decodePiece(b []byte) (piece, error) {
	p := piece{key: binary.LittleEndian.Uint32(b[0:]), addr: binary.LittleEndian.Uint64(b[8:]), length: binary.LittleEndian.Uint64(b[16:])}
	if binary.LittleEndian.Uint32(b[4:]) != 0 || p.length == 0 || p.addr+p.length < p.addr {
		return p, fmt.Errorf("tcp: vector piece of %d bytes at %#x (key %d): %w", p.length, p.addr, p.key, status.ErrProtocol)
	}
	return p, nil
}

// Response status bytes.
const (
	stOK         = 0
	stOutOfRange = 1
	stNotFound   = 2 // version 2: no such region (unknown, stale or deregistered key; no region at the address)
	stMisaligned = 3 // version 2: an atomic on a word that is not 8-byte aligned
)

// hello is the first message of every lane, initiator → target.
type hello struct {
	version     uint16 // decoded: the version both sides run (encode offers version)
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
	v := binary.LittleEndian.Uint16(b[4:])
	if v < minVersion {
		return hello{}, fmt.Errorf("tcp: initiator speaks versions up to %d, target %d..%d: %w", v, minVersion, version, status.ErrUnsupported)
	}
	h := hello{
		version:    min(v, version),
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
	version    uint16 // the version the lane runs
	rank       uint32
	regionSize uint64
}

func (w welcome) encode(b *[welcomeSize]byte) {
	*b = [welcomeSize]byte{}
	copy(b[0:4], magic)
	binary.LittleEndian.PutUint16(b[4:], w.version)
	binary.LittleEndian.PutUint32(b[8:], w.rank)
	binary.LittleEndian.PutUint64(b[16:], w.regionSize)
}

func decodeWelcome(b []byte) (welcome, error) {
	if len(b) != welcomeSize || string(b[0:4]) != magic {
		return welcome{}, fmt.Errorf("tcp: bad welcome magic: %w", status.ErrProtocol)
	}
	v := binary.LittleEndian.Uint16(b[4:])
	if v < minVersion || v > version {
		return welcome{}, fmt.Errorf("tcp: target runs version %d, initiator %d..%d: %w", v, minVersion, version, status.ErrUnsupported)
	}
	if binary.LittleEndian.Uint16(b[6:]) != 0 || binary.LittleEndian.Uint32(b[12:]) != 0 {
		return welcome{}, fmt.Errorf("tcp: reserved welcome bits set: %w", status.ErrProtocol)
	}
	return welcome{version: v, rank: binary.LittleEndian.Uint32(b[8:]), regionSize: binary.LittleEndian.Uint64(b[16:])}, nil
}

// request is a PUT, GET or ATOMIC, initiator → target; a PUT's payload (length bytes) or an
// ATOMIC's (operand, compare) follows it.
type request struct {
	op     uint8
	mode   uint8 // addressing (version 2)
	aop    uint8 // the atomic operation (buffer.AtomicOp) of an ATOMIC
	key    uint32
	id     uint64
	offset uint64 // an offset (modeDefault, modeKey) or an address (modeAddr)
	length uint64
}

func (r request) encode(b *[reqSize]byte) {
	b[0], b[1], b[2], b[3] = r.op, r.mode, r.aop, 0
	binary.LittleEndian.PutUint32(b[4:], r.key)
	binary.LittleEndian.PutUint64(b[8:], r.id)
	binary.LittleEndian.PutUint64(b[16:], r.offset)
	binary.LittleEndian.PutUint64(b[24:], r.length)
}

// decodeRequest decodes a request of a lane running version v, checking every field that
// version defines and that the rest is zero.
func decodeRequest(b *[reqSize]byte, v uint16) (request, error) {
	r := request{op: b[0], mode: b[1], aop: b[2], key: binary.LittleEndian.Uint32(b[4:]), id: binary.LittleEndian.Uint64(b[8:]),
		offset: binary.LittleEndian.Uint64(b[16:]), length: binary.LittleEndian.Uint64(b[24:])}
	bad := func(what string) (request, error) {
		return r, fmt.Errorf("tcp: request %s (version %d): %w", what, v, status.ErrProtocol)
	}
	vector := r.op == opPutV || r.op == opGetV
	switch {
	case r.op != opPut && r.op != opGet && (r.op != opAtomic || v < 2) && (!vector || v < 3):
		return bad(fmt.Sprintf("op %#x", r.op))
	case vector && (r.mode != 0 || r.key != 0 || r.aop != 0 || b[3] != 0):
		return bad("addressing on a vector request")
	case vector && (r.offset == 0 || r.offset > maxPieces || r.length < r.offset || r.length > maxVector):
		return bad(fmt.Sprintf("vector of %d pieces, %d bytes", r.offset, r.length))
	case b[3] != 0 || (v < 2 && (r.mode != 0 || r.aop != 0 || r.key != 0)):
		return bad("reserved bits set")
	case r.mode > modeAddr:
		return bad(fmt.Sprintf("addressing mode %d", r.mode))
	case (r.mode == modeKey) != (r.key != 0):
		return bad(fmt.Sprintf("key %d with addressing mode %d", r.key, r.mode))
	case r.op == opAtomic && (!buffer.AtomicOp(r.aop).Valid() || r.length != 8):
		return bad(fmt.Sprintf("atomic op %d on %d bytes", r.aop, r.length))
	case r.op != opAtomic && r.aop != 0:
		return bad("atomic op on a transfer")
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
	if r.op != opPutAck && r.op != opGetData && r.op != opAtomicAck {
		return r, fmt.Errorf("tcp: unknown response op %#x: %w", r.op, status.ErrProtocol)
	}
	if binary.LittleEndian.Uint16(b[2:]) != 0 || binary.LittleEndian.Uint32(b[4:]) != 0 {
		return r, fmt.Errorf("tcp: reserved response bits set: %w", status.ErrProtocol)
	}
	if r.status > stMisaligned {
		return r, fmt.Errorf("tcp: unknown response status %d: %w", r.status, status.ErrProtocol)
	}
	return r, nil
}
