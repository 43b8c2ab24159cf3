package cabi

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// lazyDeadline is a context with a deadline whose timer starts only when something waits on
// it (Done, Err at or past the deadline, or a child context that must be cancelled with it).
// A C call that completes without waiting (a shared-memory batch, a call to a known peer)
// then costs no timer: context.WithTimeout and its cancel took 0.35 us and 4 allocations per
// call, most of the C entry's fixed cost against the Go engine's. The first wait builds the
// ordinary context.WithDeadline, which Value, Done and Err hand on to, so that the context
// package sees a cancelCtx parent for children (no goroutine per child).
type lazyDeadline struct {
	d    time.Time
	once sync.Once
	in   atomic.Pointer[deadlineCtx]
	done atomic.Bool // cancel ran
}

type deadlineCtx struct {
	ctx    context.Context
	cancel context.CancelFunc
}

// canceled stands for a lazyDeadline's context once its cancel ran before anything waited.
var canceled = func() *deadlineCtx {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return &deadlineCtx{ctx, cancel}
}()

func (l *lazyDeadline) get() context.Context {
	l.once.Do(func() {
		ctx, cancel := context.WithDeadline(context.Background(), l.d)
		l.in.Store(&deadlineCtx{ctx, cancel})
	})
	if in := l.in.Load(); in != nil {
		return in.ctx
	}
	return canceled.ctx // cancelled before the first wait
}

func (l *lazyDeadline) Deadline() (time.Time, bool) { return l.d, true }

func (l *lazyDeadline) Done() <-chan struct{} { return l.get().Done() }

func (l *lazyDeadline) Err() error {
	if l.in.Load() == nil && !l.done.Load() && time.Now().Before(l.d) {
		return nil // nothing waited, nothing cancelled, the deadline ahead: no timer for this
	}
	return l.get().Err()
}

func (l *lazyDeadline) Value(key any) any {
	if in := l.in.Load(); in != nil {
		return in.ctx.Value(key)
	}
	return nil
}

func (l *lazyDeadline) cancel() {
	l.done.Store(true)
	l.once.Do(func() {}) // nothing waited: nothing to stop, and nothing will start
	if in := l.in.Load(); in != nil {
		in.cancel()
	}
}
