package buffer

import (
	"fmt"

	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
)

// AtomicOp is an atomic operation on an aligned 64-bit word of registered memory, as peers
// request it of a region's owner (remote atomics) or run it on a shared mapping.
type AtomicOp uint8

// The atomic operations. Each returns the word's value before the operation.
const (
	AtomicLoad     AtomicOp = iota + 1 // reads the word
	AtomicStore                        // sets the word to operand
	AtomicFetchAdd                     // adds operand (wrapping)
	AtomicSwap                         // sets the word to operand (as Store; named for OpenSHMEM's swap)
	AtomicCAS                          // sets the word to operand if it equals compare
	AtomicFetchAnd                     // ANDs operand in
	AtomicFetchOr                      // ORs operand in
	AtomicFetchXor                     // XORs operand in
	atomicEnd
)

var atomicNames = [...]string{"", "load", "store", "fetch-add", "swap", "compare-swap", "fetch-and", "fetch-or", "fetch-xor"}

// String names the operation.
func (op AtomicOp) String() string {
	if op.Valid() {
		return atomicNames[op]
	}
	return fmt.Sprintf("atomic op %d", uint8(op))
}

// Valid reports whether op is one of the operations above.
func (op AtomicOp) Valid() bool { return op >= AtomicLoad && op < atomicEnd }

// Atomic runs op on the 8-byte word of host memory b at off with sync/atomic, so it is atomic
// with respect to every other atomic on that word, from this process or from any process that
// maps the same memory. It returns the word's previous value. The word must lie in b
// (ErrOutOfRange) and be 8-byte aligned (ErrInvalidConfig).
func Atomic(b []byte, off uint64, op AtomicOp, operand, compare uint64) (uint64, error) {
	if !op.Valid() {
		return 0, fmt.Errorf("%v: %w", op, status.ErrInvalidConfig)
	}
	w, err := memory.Word64(b, off)
	if err != nil {
		return 0, fmt.Errorf("%v: %w", op, err)
	}
	switch op {
	case AtomicLoad:
		return w.Load(), nil
	case AtomicStore, AtomicSwap:
		return w.Swap(operand), nil
	case AtomicFetchAdd:
		return w.Add(operand) - operand, nil
	case AtomicCAS:
		for {
			old := w.Load()
			if old != compare || w.CompareAndSwap(old, operand) {
				return old, nil
			}
		}
	case AtomicFetchAnd:
		return w.And(operand), nil
	case AtomicFetchOr:
		return w.Or(operand), nil
	default: // AtomicFetchXor
		for {
			old := w.Load()
			if w.CompareAndSwap(old, old^operand) {
				return old, nil
			}
		}
	}
}
