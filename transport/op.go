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
type Op struct {
	spin  time.Duration // Wait polls this long before blocking (SetPoll)
	poll  func()        // called on each poll, if set
	parts atomic.Int32
	done  chan struct{}
	once  sync.Once
	mu    sync.Mutex
	err   error // first error; guarded by mu
}

// NewOp returns an Op that completes after parts calls to Finish. parts 0 gives a completed Op.
func NewOp(parts int) *Op {
	o := &Op{done: make(chan struct{})}
	o.parts.Store(int32(parts))
	if parts <= 0 {
		close(o.done)
	}
	return o
}

// Finish records the completion of one part. Transports call it exactly once per part.
func (o *Op) Finish(err error) {
	if err != nil {
		o.mu.Lock()
		if o.err == nil {
			o.err = err
		}
		o.mu.Unlock()
	}
	if o.parts.Add(-1) == 0 {
		o.once.Do(func() { close(o.done) })
	}
}

// Done returns a channel closed when the Op completes.
func (o *Op) Done() <-chan struct{} { return o.done }

// Err returns the Op's error once it is done (nil before, or on success).
func (o *Op) Err() error {
	select {
	case <-o.done:
		o.mu.Lock()
		defer o.mu.Unlock()
		return o.err
	default:
		return nil
	}
}

// SetPoll makes Wait poll for up to d before it blocks, calling fn (if not nil) on each poll:
// for transports where the waiter can drive completion itself (UCX progress), so a short
// operation does not pay a thread wake-up (tens of µs on a VM) on top of a few µs of work. Call
// it before handing the Op out.
func (o *Op) SetPoll(d time.Duration, fn func()) { o.spin, o.poll = d, fn }

// Wait blocks until the Op completes or ctx ends, and returns the Op's error or the context's
// (wrapped with status.ErrTimeout or status.ErrCanceled).
func (o *Op) Wait(ctx context.Context) error {
	select {
	case <-o.done:
		return o.Err()
	default:
	}
	if o.spin > 0 {
		for until := time.Now().Add(o.spin); time.Now().Before(until); {
			select {
			case <-o.done:
				return o.Err()
			default:
			}
			if o.poll != nil {
				o.poll()
			}
		}
	}
	select {
	case <-o.done:
		return o.Err()
	case <-ctx.Done():
		return status.FromContext(ctx)
	}
}
