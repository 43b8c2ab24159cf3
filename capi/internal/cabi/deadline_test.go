package cabi

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A C call's deadline behaves as context.WithTimeout's: it expires (Done closed, Err
// DeadlineExceeded), a child context ends with it without a goroutine of its own, and cancel
// ends it; a call that never waits starts no timer.
func TestLazyDeadline(t *testing.T) {
	ctx, cancel := Deadline(20)
	defer cancel()
	if d, ok := ctx.Deadline(); !ok || time.Until(d) <= 0 || time.Until(d) > 20*time.Millisecond {
		t.Fatalf("deadline %v, %v", d, ok)
	}
	if err := ctx.Err(); err != nil {
		t.Fatalf("Err before the deadline, nothing waiting: %v", err)
	}
	if ctx.(*lazyDeadline).in.Load() != nil {
		t.Fatal("a timer started though nothing waited")
	}
	child, stop := context.WithTimeout(ctx, time.Hour)
	defer stop()
	select {
	case <-child.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the child context did not end with its parent's deadline")
	}
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) || !errors.Is(child.Err(), context.DeadlineExceeded) {
		t.Fatalf("Err after the deadline: %v, child %v", ctx.Err(), child.Err())
	}

	// Past the deadline without anything having waited: Err says so, and Done is closed.
	late, cancelLate := Deadline(1)
	defer cancelLate()
	time.Sleep(5 * time.Millisecond)
	if !errors.Is(late.Err(), context.DeadlineExceeded) {
		t.Fatalf("Err past the deadline: %v", late.Err())
	}
	<-late.Done()

	// cancel before any wait, and after one.
	for _, wait := range []bool{false, true} {
		c, cancelC := Deadline(60_000)
		if wait {
			_ = c.Done()
		}
		cancelC()
		select {
		case <-c.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("Done not closed by cancel (waited first: %v)", wait)
		}
		if !errors.Is(c.Err(), context.Canceled) {
			t.Fatalf("Err after cancel (waited first: %v): %v", wait, c.Err())
		}
	}
	none, cancelNone := Deadline(0)
	defer cancelNone()
	if _, ok := none.Deadline(); ok {
		t.Fatal("a timeout of 0 has a deadline")
	}
}

func BenchmarkDeadline(b *testing.B) {
	for b.Loop() {
		ctx, cancel := Deadline(10_000)
		_, _ = ctx.Deadline()
		cancel()
	}
}
