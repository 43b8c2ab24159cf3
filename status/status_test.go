package status

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"
)

func TestCodeValuesPinned(t *testing.T) {
	// The integers cross the C and Python edges: they must equal upstream's status_t.
	want := map[Code]int{Success: 0, Error: 1, Unsupported: 2, InvalidConfig: 3, Timeout: 4, NotFound: 5}
	for c, v := range want {
		if int(c) != v {
			t.Errorf("%v = %d, want %d", c, int(c), v)
		}
	}
	if got := Timeout.String(); got != "TIMEOUT" {
		t.Errorf("Timeout.String() = %q", got)
	}
	if got := Code(42).String(); got != "Code(42)" {
		t.Errorf("Code(42).String() = %q", got)
	}
}

func TestRoundTripEveryCode(t *testing.T) {
	for c := Success; c <= NotFound; c++ {
		err := c.Err()
		if c == Success {
			if err != nil {
				t.Fatalf("Success.Err() = %v", err)
			}
			continue
		}
		if got := CodeOf(err); got != c {
			t.Errorf("CodeOf(%v.Err()) = %v", c, got)
		}
		wrapped := fmt.Errorf("op rank %d: %w", 3, err)
		if got := CodeOf(wrapped); got != c {
			t.Errorf("CodeOf(wrapped %v) = %v", c, got)
		}
		if !errors.Is(wrapped, err) {
			t.Errorf("errors.Is(wrapped, %v) = false", err)
		}
	}
	if CodeOf(Code(99).Err()) != Error {
		t.Error("unknown code should map to ERROR")
	}
}

func TestFinerSentinelsMatchTheirCode(t *testing.T) {
	cases := []struct {
		err  error
		base error
		code Code
	}{
		{ErrOutOfRange, ErrInvalidConfig, InvalidConfig},
		{ErrClosed, ErrFailed, Error},
		{ErrPeerClosed, ErrFailed, Error},
		{ErrProtocol, ErrFailed, Error},
		{ErrCanceled, ErrFailed, Error},
		{ErrPermission, ErrFailed, Error},
	}
	for _, c := range cases {
		w := fmt.Errorf("put off %d: %w", 7, c.err)
		if !errors.Is(w, c.base) || !errors.Is(w, c.err) {
			t.Errorf("%v: errors.Is base/self failed", c.err)
		}
		if CodeOf(w) != c.code {
			t.Errorf("%v: CodeOf = %v, want %v", c.err, CodeOf(w), c.code)
		}
		// A base sentinel does not match a finer one, nor do finer ones match each other.
		if errors.Is(c.base, c.err) {
			t.Errorf("base %v matches finer %v", c.base, c.err)
		}
	}
	if errors.Is(ErrClosed, ErrPeerClosed) {
		t.Error("ErrClosed matches ErrPeerClosed")
	}
	if errors.Is(ErrTimeout, ErrNotFound) {
		t.Error("distinct codes match")
	}
}

func TestContextErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()
	err := FromContext(ctx)
	if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) || CodeOf(err) != Timeout {
		t.Fatalf("deadline: %v", err)
	}
	if ContextError(err) != err {
		t.Error("ContextError should not wrap twice")
	}
	c2, cancel2 := context.WithCancel(context.Background())
	if FromContext(c2) != nil {
		t.Error("live context gave an error")
	}
	cancel2()
	err = FromContext(c2)
	if !errors.Is(err, ErrCanceled) || !errors.Is(err, context.Canceled) || CodeOf(err) != Error {
		t.Fatalf("cancel: %v", err)
	}
	if CodeOf(context.DeadlineExceeded) != Timeout {
		t.Error("bare DeadlineExceeded")
	}
	if CodeOf(os.ErrDeadlineExceeded) != Timeout {
		t.Error("os.ErrDeadlineExceeded should be a timeout")
	}
	if CodeOf(errors.New("x")) != Error || CodeOf(nil) != Success {
		t.Error("plain/nil")
	}
	other := errors.New("other")
	if ContextError(other) != other {
		t.Error("ContextError changed a non-context error")
	}
}
