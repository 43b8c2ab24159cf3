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

// Before it sleeps a waiter yields its core (sched_yield) for a while. When ranks outnumber
// cores the rank it waits for is often runnable on the same core, and a yield runs it at once,
// where a sleep and a wake-up cost two context switches and an interprocessor interrupt (tens
// of microseconds in a VM: an 8-rank barrier on 2 cores took 55 µs sleeping, 5 yielding). On an
// idle core a yield returns at once: a short spin.
//
// A yield to a thread of another program that wants the core too (a busy machine) does not come
// back until that thread's time slice ends, milliseconds later; sleeping is then far better (a
// wake-up preempts it). So a yield that takes longer than slowYield turns yielding off for the
// whole process for a while, twice as long each time it happens again (yieldOffMin to
// yieldOffMax), and a wait that yielding ended resets the back-off.
const (
	yieldFor    = 50 * time.Microsecond // the most one wait yields before it sleeps
	slowYield   = 200 * time.Microsecond
	yieldOffMin = 10 * time.Millisecond
	yieldOffMax = time.Second
)

var (
	yieldOffUntil atomic.Int64 // unix nanoseconds; no yielding before then
	yieldOff      atomic.Int64 // the current back-off (0: yieldOffMin next)
)

// yielder is one wait's yielding phase.
type yielder struct {
	start, end time.Time
	used       bool // it yielded, none slow
	stopped    bool
}

// yield yields once and says true, or says false when this wait should sleep instead.
func (y *yielder) yield() bool {
	if y.stopped {
		return false
	}
	now := time.Now()
	if y.start.IsZero() {
		if now.UnixNano() < yieldOffUntil.Load() {
			y.stopped = true
			return false
		}
		y.start, y.end = now, now.Add(yieldFor)
	} else if now.After(y.end) {
		y.stopped = true
		return false
	}
	_, _, _ = unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
	if d := time.Since(now); d > slowYield {
		off := min(max(2*time.Duration(yieldOff.Load()), yieldOffMin), yieldOffMax)
		yieldOff.Store(int64(off))
		yieldOffUntil.Store(time.Now().Add(off).UnixNano())
		y.stopped, y.used = true, false
		return false
	}
	y.used = true
	return true
}

// done ends the wait: one that yielding served resets the back-off.
func (y *yielder) done() {
	if y.used && !y.stopped && yieldOff.Load() != 0 {
		yieldOff.Store(0)
	}
}
