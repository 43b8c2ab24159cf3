package transport

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hmc-go/hmc/status"
)

// Op is the completion of a non-blocking transfer, possibly made of several parts (chunks on
// several lanes). It completes when every part has finished; its error is the first part's error.
// Checking a completed Op and its error costs atomic loads: the channel behind Done is only
// made for a caller that blocks, so a stream of operations that complete before anyone waits
// (shared memory) makes none, and one that completed while it was posted need not be allocated
// at all (Succeeded).
type Op struct {
	spin   time.Duration         // Wait polls this long before blocking (SetPoll)
	poller Poller                // drives completion while Wait polls, if set
	parts  atomic.Int32          // parts not finished; the Op is done at 0
	err    atomic.Pointer[error] // the first error, set before parts reaches 0

	mu     sync.Mutex
	done   chan struct{} // made by the first blocking caller, closed once done; guarded by mu
	closed bool          // done was closed (by Done or the last Finish, whichever saw both); guarded by mu
}

// NewOp returns an Op that completes after parts calls to Finish. parts 0 gives a completed Op.
func NewOp(parts int) *Op {
	o := &Op{}
	o.parts.Store(int32(max(parts, 0)))
	return o
}

// succeeded is the Op that Succeeded returns: completed, no error, never written again (SetPoll
// leaves a completed Op alone; Done makes and closes its channel once, under its lock).
var succeeded = NewOp(0)

// Succeeded returns a completed, successful Op shared by every caller: what a transport
// returns for an operation that completed while it was posted, without allocating. Nothing may
// call Finish on it.
func Succeeded() *Op { return succeeded }

// Failed returns a completed Op whose error is err.
func Failed(err error) *Op {
	o := NewOp(1)
	o.Finish(err)
	return o
}

// Finish records the completion of one part. Transports call it exactly once per part.
func (o *Op) Finish(err error) {
	if err != nil {
		e := err // only an error escapes: taking err's own address would move every call's to the heap
		o.err.CompareAndSwap(nil, &e)
	}
	if o.parts.Add(-1) == 0 {
		o.mu.Lock()
		o.closeDone()
		o.mu.Unlock()
	}
}

// closeDone closes the channel, if made and not closed yet. Caller holds mu.
func (o *Op) closeDone() {
	if o.done != nil && !o.closed {
		close(o.done)
		o.closed = true
	}
}

// completed says whether every part has finished.
func (o *Op) completed() bool { return o.parts.Load() <= 0 }

// Completed says whether the Op is done (without waiting, and without making Done's channel).
func (o *Op) Completed() bool { return o.completed() }

// Done returns a channel closed when the Op completes.
func (o *Op) Done() <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.done == nil {
		o.done = make(chan struct{})
		if o.completed() { // the last Finish may have come before the channel
			o.closeDone()
		}
	}
	return o.done
}

// Err returns the Op's error once it is done (nil before, or on success).
func (o *Op) Err() error {
	if !o.completed() {
		return nil
	}
	if p := o.err.Load(); p != nil {
		return *p
	}
	return nil
}

// A Poller lets the goroutine waiting for an Op drive its completion itself (UCX progress), so
// that a short operation does not pay a thread wake-up (tens of µs on a VM) on top of a few µs
// of work. Wait calls Begin before its first Poll and End after its last; End's done says
// whether the Op completed meanwhile (if not, the waiter is about to block, and whatever else
// progresses the transport should take over at once).
type Poller interface {
	Begin()
	Poll()
	End(done bool)
}

// SetPoll makes Wait poll for up to d before it blocks, driving p (if not nil) on each poll.
// Call it before handing the Op out. A completed Op (Succeeded's among them) is left as it is:
// its Wait never polls.
func (o *Op) SetPoll(d time.Duration, p Poller) {
	if !o.completed() {
		o.spin, o.poller = d, p
	}
}

// Wait blocks until the Op completes or ctx ends, and returns the Op's error or the context's
// (wrapped with status.ErrTimeout or status.ErrCanceled).
func (o *Op) Wait(ctx context.Context) error {
	if o.completed() {
		return o.Err()
	}
	if o.spin > 0 && o.poll() {
		return o.Err()
	}
	select {
	case <-o.Done():
		return o.Err()
	case <-ctx.Done():
		return status.FromContext(ctx)
	}
}

// poll polls for up to o.spin and reports whether the Op completed meanwhile.
func (o *Op) poll() (done bool) {
	if o.poller != nil {
		o.poller.Begin()
		defer func() { o.poller.End(done) }()
	}
	for until := time.Now().Add(o.spin); ; {
		now := time.Now()
		if !now.Before(until) {
			break
		}
		SpinYield(now) // a stream of waits never blocks: see SpinYield
		if o.poller != nil {
			o.poller.Poll()
		}
		if o.completed() {
			return true
		}
	}
	return false
}
