package ctrl

import (
	"encoding/binary"
	"fmt"

	"github.com/hmc-go/hmc/status"
)

// MsgType is the type field of a control frame.
type MsgType uint16

// Message types. TypeInt and TypeStruct are upstream's CTRL_INT and CTRL_STRUCT; types from
// FirstInternalType up are reserved for HMC-Go's own protocols (the SendData stream) and are
// delivered only to RecvType.
const (
	TypeInt           MsgType = 0x0001
	TypeStruct        MsgType = 0x0002
	FirstInternalType MsgType = 0x0100
)

// FlagHello marks the HELLO frame (type TypeStruct, payload the dialer's rank as u32).
const FlagHello uint16 = 0x8000

// HeaderSize is the size of a frame header.
const HeaderSize = 8

// Header field offsets.
const (
	offType   = 0
	offFlags  = 2
	offLength = 4
)

// Header is an encoded frame header: type u16, flags u16, length u32, little-endian.
type Header [HeaderSize]byte

// MakeHeader encodes a header.
func MakeHeader(t MsgType, flags uint16, length uint32) Header {
	var h Header
	binary.LittleEndian.PutUint16(h[offType:], uint16(t))
	binary.LittleEndian.PutUint16(h[offFlags:], flags)
	binary.LittleEndian.PutUint32(h[offLength:], length)
	return h
}

// Type returns the message type.
func (h Header) Type() MsgType { return MsgType(binary.LittleEndian.Uint16(h[offType:])) }

// Flags returns the flags.
func (h Header) Flags() uint16 { return binary.LittleEndian.Uint16(h[offFlags:]) }

// Length returns the payload length.
func (h Header) Length() uint32 { return binary.LittleEndian.Uint32(h[offLength:]) }

// IsHello reports whether h is a HELLO header.
func (h Header) IsHello() bool { return h.Type() == TypeStruct && h.Flags()&FlagHello != 0 }

// Check validates a header received on an established connection against the frame cap: the
// length must not exceed maxFrame and HELLO is not allowed after the handshake. It is a pure
// function, so it can be fuzzed.
func (h Header) Check(maxFrame uint32) error {
	if h.Length() > maxFrame {
		return fmt.Errorf("ctrl: frame of %d bytes exceeds the cap of %d: %w", h.Length(), maxFrame, status.ErrProtocol)
	}
	if h.IsHello() {
		return fmt.Errorf("ctrl: HELLO on an established connection: %w", status.ErrProtocol)
	}
	return nil
}

// helloLen is the payload of a HELLO: the rank as u32.
const helloLen = 4

// ParseHello validates a HELLO frame (header, with no flag but FlagHello, and payload) and
// returns the rank it carries.
func ParseHello(h Header, payload []byte) (uint32, error) {
	if !h.IsHello() {
		return 0, fmt.Errorf("ctrl: first frame is type %#x flags %#x, not HELLO: %w", h.Type(), h.Flags(), status.ErrProtocol)
	}
	if h.Flags() != FlagHello {
		return 0, fmt.Errorf("ctrl: HELLO with reserved flag bits %#x set: %w", h.Flags()&^FlagHello, status.ErrProtocol)
	}
	if h.Length() != helloLen || len(payload) != helloLen {
		return 0, fmt.Errorf("ctrl: HELLO of %d bytes, want %d: %w", h.Length(), helloLen, status.ErrProtocol)
	}
	return binary.LittleEndian.Uint32(payload), nil
}

// AppendHello appends an encoded HELLO frame for rank to b.
func AppendHello(b []byte, rank uint32) []byte {
	h := MakeHeader(TypeStruct, FlagHello, helloLen)
	b = append(b, h[:]...)
	return binary.LittleEndian.AppendUint32(b, rank)
}
