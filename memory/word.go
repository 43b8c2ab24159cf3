package memory

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/hmc-go/hmc/status"
)

// AddrOf returns the address of host memory b's first byte (0 for an empty slice): the
// number by which peers name bytes of a registered region.
func AddrOf(b []byte) uint64 {
	if len(b) == 0 {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
}

// Word64 returns the 8-byte word of host memory b at off for sync/atomic use. The word must lie
// in b (ErrOutOfRange) and be 8-byte aligned in memory (ErrInvalidConfig): an unaligned word
// is not atomic on every CPU, and a word straddling a cache line is not atomic anywhere. The
// pointer is valid while b's memory is.
func Word64(b []byte, off uint64) (*atomic.Uint64, error) {
	if off > uint64(len(b)) || uint64(len(b))-off < 8 {
		return nil, fmt.Errorf("word at %d of %d bytes: %w", off, len(b), status.ErrOutOfRange)
	}
	p := unsafe.Pointer(&b[off])
	if uintptr(p)%8 != 0 {
		return nil, fmt.Errorf("word at %#x: not 8-byte aligned: %w", uintptr(p), status.ErrInvalidConfig)
	}
	// atomic.Uint64 is a struct holding one uint64 (plus a zero-size alignment marker): its
	// layout is the word's, and the alignment was checked above.
	return (*atomic.Uint64)(p), nil
}
