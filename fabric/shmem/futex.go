package shmem

import (
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Waiting on a word of shared memory sleeps in the kernel (futex on the word's low half, keyed
// by the mapping's file, so it works across processes that map the same memfd) rather than
// spinning: ranks often outnumber cores, and a spinning waiter then holds a core that the rank
// it waits for needs. A co-located rank that changes the word wakes the sleepers; a change
// made by a transport (a remote rank's atomic) is seen when the bounded sleep ends.

const (
	futexWait = 0 // FUTEX_WAIT, shared (not FUTEX_PRIVATE_FLAG)
	futexWake = 1
	// futexNap bounds one sleep: how late a change nobody woke us for is seen.
	futexNap = 50 * time.Microsecond
)

// low32 is the address of a 64-bit word's low half (little-endian), the futex word.
func low32(w *atomic.Uint64) *uint32 { return (*uint32)(unsafe.Pointer(w)) }

// sleepOn sleeps while the low half of w still reads was, at most futexNap.
func sleepOn(w *atomic.Uint64, was uint32) {
	ts := unix.NsecToTimespec(int64(futexNap))
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(low32(w))), futexWait, uintptr(was),
		uintptr(unsafe.Pointer(&ts)), 0, 0) // EAGAIN (changed), ETIMEDOUT and EINTR all mean: look again
}

// wake wakes every sleeper on w (a word of a mapping shared with them).
func wake(w *atomic.Uint64) {
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(low32(w))), futexWake, uintptr(1<<31-1), 0, 0, 0)
}
