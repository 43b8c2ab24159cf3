package comm

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/ctrl"
	"github.com/hmc-go/hmc/internal/netnstest"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/transporttest"
)

// connectAcross starts the child in a network namespace of its own and connects to it with
// AUTO, which must take TCP: the child's address is not one of ours, and its shared-memory
// socket, abstract, lives in its own namespace.
func connectAcross(t *testing.T) (*session, *Peer, *netnstest.NS) {
	t.Helper()
	ns := netnstest.New(t)
	ch := startChildIn(t, ns.Name, ns.NSIP)
	buf, err := buffer.New(0, parentBufSize, memory.CPU)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { buf.Close() })
	c, err := New(buf, Config{NumChannels: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	t.Cleanup(cancel)
	if err := c.ConnectTo(ctx, 0, 1, ns.NSIP, ch.dataPort, CtrlLink{Transport: ctrl.TCP, IP: ns.NSIP, Port: ch.ctrlPort}, transport.AUTO); err != nil {
		t.Fatal(err)
	}
	s := &session{t: t, ct: transport.AUTO, c: c, buf: buf, ch: ch, ctx: ctx}
	p := c.Peer(ns.NSIP, ch.dataPort, transport.AUTO)
	if route, err := p.Route(); err != nil || route != transport.TCP {
		t.Fatalf("AUTO to another namespace took %v (%v), want tcp", route, err)
	}
	return s, p, ns
}

// guarded fills 4 KiB on each side of the child's [off, off+n) with their own patterns and
// returns a check that they are unchanged.
func (s *session) guarded(off, n uint64, seed uint32) (unchanged func() bool) {
	s.t.Helper()
	s.ask(cmdFill, request{Off: off - 4096, Len: 4096, Seed: seed + 1000})
	s.ask(cmdFill, request{Off: off + n, Len: 4096, Seed: seed + 2000})
	return func() bool {
		return s.ask(cmdCheck, request{Off: off - 4096, Len: 4096, Seed: seed + 1000}) &&
			s.ask(cmdCheck, request{Off: off + n, Len: 4096, Seed: seed + 2000})
	}
}

// putChecked puts n bytes of pattern seed from the parent's offset 0 to the child's off and
// checks them there, and that the 4 KiB on each side are untouched.
func (s *session) putChecked(p *Peer, seed uint32, off, n uint64) {
	s.t.Helper()
	unchanged := s.guarded(off, n, seed)
	s.fillLocal(0, n, seed)
	if err := p.Put(s.ctx, 0, off, n); err != nil {
		s.t.Fatal(err)
	}
	if !s.ask(cmdCheck, request{Off: off, Len: n, Seed: seed}) {
		s.t.Fatalf("put of %d bytes across namespaces: the child's region differs", n)
	}
	if !unchanged() {
		s.t.Fatalf("put of %d bytes at %d wrote outside its range", n, off)
	}
}

// getChecked has the child fill [off, off+n) with seed, gets it into the parent's offset 0
// and checks it.
func (s *session) getChecked(p *Peer, seed uint32, off, n uint64) {
	s.t.Helper()
	s.ask(cmdFill, request{Off: off, Len: n, Seed: seed})
	if err := p.Get(s.ctx, 0, off, n); err != nil {
		s.t.Fatal(err)
	}
	if !s.localIs(0, n, seed) {
		s.t.Fatalf("get of %d bytes across namespaces differs", n)
	}
}

// A peer in another network namespace is another host to AUTO: it takes TCP, and the bytes
// arrive; with delay, jitter, loss and reordering on the link they still arrive, whole.
func TestAutoAcrossNetworkNamespaces(t *testing.T) {
	s, p, ns := connectAcross(t)
	s.putChecked(p, 41, 4096, 5<<20+3)
	heal := ns.Impair(t, netnstest.Impairment{Delay: 5 * time.Millisecond, Jitter: time.Millisecond, Loss: 0.01, Reorder: 0.05})
	s.putChecked(p, 42, 16<<20, 3<<20+1)
	s.getChecked(p, 44, 24<<20, 2<<20+5)
	heal()
	src := make([]byte, 1<<20)
	transporttest.Fill(src, 43)
	if err := p.PutFrom(s.ctx, src, 8<<20); err != nil {
		t.Fatal(err)
	}
	if !s.ask(cmdCheck, request{Off: 8 << 20, Len: 1 << 20, Seed: 43}) {
		t.Fatal("put from across namespaces differs")
	}
	if err := s.c.CtrlSend(s.ctx, 0, cmdExit); err != nil {
		t.Fatal(err)
	}
}

// Faults on the link to another host, each its own case: an operation that cannot finish in
// time fails with ErrTimeout within its deadline, nothing lands outside the requested range,
// and once the fault heals the same connection moves and verifies bytes again.
func TestFaultsAcrossNamespaces(t *testing.T) {
	s, p, ns := connectAcross(t)
	s.putChecked(p, 1, 4096, 1<<20)

	// expectTimeout runs op under a deadline of d and wants ErrTimeout within 1 s of it.
	expectTimeout := func(t *testing.T, what string, d time.Duration, op func(ctx context.Context) error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		start := time.Now()
		err := op(ctx)
		took := time.Since(start)
		if !errors.Is(err, status.ErrTimeout) {
			t.Fatalf("%s: got %v, want ErrTimeout", what, err)
		}
		if took > d+time.Second {
			t.Fatalf("%s: the %v deadline took %v to surface", what, d, took)
		}
		t.Logf("%s: %v after %v", what, err, took.Round(time.Millisecond))
	}

	t.Run("delay past the deadline", func(t *testing.T) {
		const off, n = 2 << 20, 64 << 10
		unchanged := s.guarded(off, n, 10)
		s.fillLocal(0, n, 10)
		heal := ns.Impair(t, netnstest.Impairment{Delay: 300 * time.Millisecond})
		expectTimeout(t, "put delayed 300 ms each way", 100*time.Millisecond, func(ctx context.Context) error { return p.Put(ctx, 0, off, n) })
		expectTimeout(t, "get delayed 300 ms each way", 100*time.Millisecond, func(ctx context.Context) error { return p.Get(ctx, 4<<20, 4096, 4096) })
		heal()
		s.putChecked(p, 11, 6<<20, 1<<20+7) // after the late put, on the same connection
		if !unchanged() {
			t.Fatal("the put that timed out wrote outside its range")
		}
		t.Logf("the timed-out put landed later, whole: %v", s.ask(cmdCheck, request{Off: off, Len: n, Seed: 10}))
	})

	t.Run("loss, jitter and reordering", func(t *testing.T) {
		ns.Impair(t, netnstest.Impairment{Delay: 2 * time.Millisecond, Jitter: 2 * time.Millisecond, Loss: 0.03, Reorder: 0.2})
		s.putChecked(p, 20, 8<<20, 2<<20+1)
		s.getChecked(p, 21, 12<<20, 1<<20+3)
		for i := range uint32(16) { // small transfers, one packet or a few each
			s.putChecked(p, 22+i, 14<<20+uint64(i)*16384, 1000+uint64(i)*500)
		}
	})

	t.Run("partition and heal", func(t *testing.T) {
		const off, n = 20 << 20, 256 << 10
		unchanged := s.guarded(off, n, 40)
		s.fillLocal(0, n, 40)
		relink := ns.Partition(t)
		expectTimeout(t, "put across a partition", 300*time.Millisecond, func(ctx context.Context) error { return p.Put(ctx, 0, off, n) })
		expectTimeout(t, "get across a partition", 300*time.Millisecond, func(ctx context.Context) error { return p.Get(ctx, 4<<20, 4096, 4096) })
		expectTimeout(t, "control message across a partition", 300*time.Millisecond, func(ctx context.Context) error {
			_, err := s.c.CtrlRecv(ctx, 0) // nothing is coming: the child only answers
			return err
		})
		time.Sleep(time.Second)
		relink()
		s.putChecked(p, 41, 24<<20, 3<<20+9)
		s.getChecked(p, 42, 28<<20, 1<<20)
		if !unchanged() {
			t.Fatal("the put cut off by the partition wrote outside its range")
		}
	})

	if err := s.c.CtrlSend(s.ctx, 0, cmdExit); err != nil {
		t.Fatal(err)
	}
}
