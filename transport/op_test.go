package transport

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/hmc-go/hmc/status"
)

func TestOpCompletesAfterEveryPart(t *testing.T) {
	o := NewOp(3)
	o.Finish(nil)
	boom := errors.New("boom")
	o.Finish(boom)
	select {
	case <-o.Done():
		t.Fatal("done after 2 of 3 parts")
	default:
	}
	if o.Err() != nil {
		t.Fatalf("Err before completion: %v", o.Err())
	}
	o.Finish(errors.New("later"))
	<-o.Done()
	if err := o.Wait(context.Background()); !errors.Is(err, boom) {
		t.Fatalf("Wait: %v, want the first error", err)
	}
}

func TestOpZeroPartsIsDone(t *testing.T) {
	o := NewOp(0)
	<-o.Done()
	if err := o.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Done made while the last Finish runs is closed once (the channel may be made between the
// count reaching zero and Finish taking the lock).
func TestOpDoneRacesLastFinish(t *testing.T) {
	for range 20000 {
		o := NewOp(1)
		go o.Finish(nil)
		<-o.Done()
	}
}

// Done made before, during and after the last Finish is closed; Wait blocked on it wakes.
func TestOpDoneAnyTime(t *testing.T) {
	for range 1000 {
		o := NewOp(2)
		early := o.Done()
		var wg sync.WaitGroup
		wg.Add(3)
		go func() { defer wg.Done(); o.Finish(nil) }()
		go func() { defer wg.Done(); o.Finish(nil) }()
		go func() { defer wg.Done(); <-o.Done() }()
		if err := o.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		<-early
		<-o.Done()
	}
}

func TestOpWaitContext(t *testing.T) {
	o := NewOp(1)
	p := &countPoller{}
	o.SetPoll(time.Millisecond, p)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := o.Wait(ctx); !errors.Is(err, status.ErrTimeout) {
		t.Fatalf("Wait: %v, want ErrTimeout", err)
	}
	if p.polls == 0 || p.begins != 1 || p.ends != 1 || p.endedDone {
		t.Fatalf("Wait polled %d times between %d Begin and %d End (done %v), want some between one of each, not done", p.polls, p.begins, p.ends, p.endedDone)
	}
	o.Finish(nil)
	if err := o.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
}

type countPoller struct {
	begins, polls, ends int
	endedDone           bool
	finish              *Op // Poll finishes it, if set
}

func (p *countPoller) Begin() { p.begins++ }
func (p *countPoller) Poll() {
	p.polls++
	if p.finish != nil {
		p.finish.Finish(nil)
		p.finish = nil
	}
}
func (p *countPoller) End(done bool) { p.ends++; p.endedDone = done }

// A poll that completes the Op tells the Poller so at End.
func TestOpPollCompletes(t *testing.T) {
	o := NewOp(1)
	p := &countPoller{finish: o}
	o.SetPoll(time.Second, p)
	if err := o.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if p.begins != 1 || p.ends != 1 || !p.endedDone {
		t.Fatalf("%d Begin, %d End (done %v); want one each, done", p.begins, p.ends, p.endedDone)
	}
}

// The shared successful Op: done, no error, and SetPoll / Done from many goroutines at once
// leave it so (no writes to it: the race detector would say).
func TestSucceededShared(t *testing.T) {
	o := Succeeded()
	if o != Succeeded() {
		t.Fatal("Succeeded made a new Op")
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o.SetPoll(time.Second, &countPoller{})
			<-o.Done()
			if err := o.Wait(context.Background()); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if o.spin != 0 || o.poller != nil {
		t.Fatal("SetPoll changed a completed Op")
	}
}

func TestFailed(t *testing.T) {
	boom := errors.New("boom")
	o := Failed(boom)
	<-o.Done()
	if err := o.Wait(context.Background()); !errors.Is(err, boom) {
		t.Fatalf("Wait: %v, want boom", err)
	}
}
