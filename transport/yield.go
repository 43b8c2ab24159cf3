package transport

import (
	"runtime"
	"sync/atomic"
	"time"
)

// Spinning goroutines and the Go runtime's sysmon.
//
// A goroutine that spins without ever blocking (a waiter driving UCX progress, a progress loop
// while traffic flows) runs on one scheduling tick for as long as it spins. After 10 ms sysmon
// preempts it; when it is in a cgo call right then (UCX progress: most of the time), sysmon
// takes its P away, counts that as work done and goes back to waking every 20 µs, and takes
// about 20 ms to back off to 10 ms again, by which time the goroutine has been on one tick for
// 10 ms once more. On a two-core machine each of
// those 2,000-3,000 wake-ups a second preempts one of the two threads that move the data, and a
// P taken away moves the spinning goroutine to another thread. A 64 KiB UCX stream over tcp
// measured it: 14,000 context switches in the initiator (6,000 sysmon sleeps) per 100,000 puts,
// and one step in eight taking 30-60 µs instead of 13.
//
// SpinYield passes the spinning goroutine through the scheduler every couple of milliseconds,
// which starts a new tick: sysmon then finds nothing to do and sleeps its 10 ms.

// yieldEvery is how often SpinYield yields: well under sysmon's 10 ms, rare enough that the
// yield itself (a trip through the run queue, which may wake an idle thread) costs nothing.
const yieldEvery = 2 * time.Millisecond

var (
	yieldEpoch = time.Now()
	nextYield  atomic.Int64 // nanoseconds since yieldEpoch
)

// SpinYield is called from a spin loop with the time just read; every yieldEvery (across all
// spinning goroutines: one shared clock, which is enough for a few spinners) it yields the
// processor with runtime.Gosched. It costs a subtraction and an atomic load otherwise.
func SpinYield(now time.Time) {
	t := int64(now.Sub(yieldEpoch))
	next := nextYield.Load()
	if t < next || !nextYield.CompareAndSwap(next, t+int64(yieldEvery)) {
		return
	}
	runtime.Gosched()
}
