package ucx

import (
	"encoding/binary"
	"fmt"
	"io"

	"github.com/hmc-go/hmc/status"
)

// The bootstrap exchange (docs/wire/ucx.md), little-endian, over the server's TCP socket:
//
//	hello   (initiator → target): "HMCU" u16 version u16 flags(0) u32 rank u32 listenPort
//	                              u32 addrLen, the initiator's worker address
//	welcome (target → initiator): "HMCU" u16 version u16 flags(0) u32 rank u64 regionAddr
//	                              u64 regionSize u32 rkeyLen, packed rkey, u32 addrLen, the
//	                              target's worker address
//
// Lengths are capped (maxBlob) before anything is allocated.

const (
	magic      = "HMCU"
	version    = 1
	maxBlob    = 64 << 10
	helloFixed = 20
)

type hello struct {
	rank, listenPort uint32
	workerAddr       []byte
}

type welcome struct {
	rank                   uint32
	regionAddr, regionSize uint64
	rkey, workerAddr       []byte
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
	b = binary.LittleEndian.AppendUint16(b, version)
	b = binary.LittleEndian.AppendUint16(b, 0)
	b = binary.LittleEndian.AppendUint32(b, w.rank)
	b = binary.LittleEndian.AppendUint64(b, w.regionAddr)
	b = binary.LittleEndian.AppendUint64(b, w.regionSize)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(w.rkey)))
	b = append(b, w.rkey...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(w.workerAddr)))
	return append(b, w.workerAddr...)
}

func readHeader(r io.Reader, what string) error {
	var b [8]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return fmt.Errorf("ucx: reading %s: %w: %w", what, status.ErrPeerClosed, err)
	}
	if string(b[:4]) != magic {
		return fmt.Errorf("ucx: bad %s magic %q: %w", what, b[:4], status.ErrProtocol)
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != version {
		return fmt.Errorf("ucx: peer speaks bootstrap version %d, we %d: %w", v, version, status.ErrUnsupported)
	}
	if f := binary.LittleEndian.Uint16(b[6:]); f != 0 {
		return fmt.Errorf("ucx: %s flags %#x: %w", what, f, status.ErrProtocol)
	}
	return nil
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
	if err := readHeader(r, "hello"); err != nil {
		return h, err
	}
	var err error
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
	if err := readHeader(r, "welcome"); err != nil {
		return w, err
	}
	var err error
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
	w.workerAddr, err = readBlob(r, "worker address")
	return w, err
}
