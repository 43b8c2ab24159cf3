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
// it waits for needs. A co-located rank that signals or arrives at a barrier wakes the
// sleepers; any other change (a remote rank's put or atomic through a transport, a co-located
// atomic) is seen when the bounded sleep ends.
//
// The bound grows with the wait: futexNap at first, then an eighth of the time waited so far,
// up to futexNapMax. A change nobody wakes us for is then seen at most 12.5 % (or futexNap)
// late, and a rank that waits long for a slow one (a barrier behind a long computation) wakes
// about a thousand times a second, not twenty thousand, leaving the cores to the ranks that
// work (each wake-up costs a Go process about 20 µs of CPU).

const (
	futexWait   = 0 // FUTEX_WAIT, shared (not FUTEX_PRIVATE_FLAG)
	futexWake   = 1
	futexNap    = 50 * time.Microsecond // the first sleeps' bound
	futexNapMax = time.Millisecond
	// wokenNapMax bounds the sleeps on a word whose every writer wakes the sleepers (a central
	// barrier's counter): they end early only if a wake-up were lost.
	wokenNapMax = 10 * time.Millisecond
)

// napFor is the bound of a sleep after waiting for waited, at most most.
func napFor(waited, most time.Duration) time.Duration {
	return min(max(waited/8, futexNap), most)
}

// low32 is the address of a 64-bit word's low half (little-endian), the futex word.
func low32(w *atomic.Uint64) *uint32 { return (*uint32)(unsafe.Pointer(w)) }

// sleepOn sleeps while the low half of w still reads was, at most nap.
func sleepOn(w *atomic.Uint64, was uint32, nap time.Duration) {
	ts := unix.NsecToTimespec(int64(nap))
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
	end     time.Time // when this wait stops yielding; zero before its first yield
	used    bool      // it yielded, none slow
	stopped bool
}

// yield yields once and says true, or says false when this wait should sleep instead.
func (y *yielder) yield() bool {
	if y.stopped {
		return false
	}
	now := time.Now()
	if y.end.IsZero() {
		if now.UnixNano() < yieldOffUntil.Load() {
			y.stopped = true
			return false
		}
		y.end = now.Add(yieldFor)
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
