package shm

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/transporttest"
)

// TestSlotsReused: regions registered, reached by a peer and deregistered in turn (a server
// that registers a buffer per request) keep reusing one control word, where each used to take
// one of the control page's 131,072 for good; a peer that still caches a region whose word went
// to another is refused by the word's generation, not let into the memory.
func TestSlotsReused(t *testing.T) {
	p := transporttest.Options{New: newSHM, Addr: abstractName}.NewRMAPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := buffer.New(0, 4096, memory.CPU)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	mem := b.Bytes()
	writeTo := func(r transport.RMA, k buffer.Key, v byte) error {
		op, err := r.WriteAsync(ctx, []byte{v}, transport.Remote{Key: k})
		if err != nil {
			return err
		}
		return op.Wait(ctx)
	}
	write := func(k buffer.Key, v byte) error { return writeTo(p.RMA, k, v) }
	for i := range 2000 {
		r, err := p.Table.RegisterBuffer(b)
		if err != nil {
			t.Fatal(err)
		}
		if err := write(r.Key(), byte(i)); err != nil || mem[0] != byte(i) {
			t.Fatalf("cycle %d: %v", i, err)
		}
		if err := p.Table.Deregister(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	rs := p.Server.(*server).regions
	rs.mu.Lock()
	used := rs.next
	rs.mu.Unlock()
	if used > 2 {
		t.Fatalf("2,000 regions in turn took %d control words", used)
	}

	// A second endpoint caches region a; a is deregistered and c, on the same memory, gets a's
	// word. The second endpoint's a is refused by generation (its word is live, for c).
	ep2, err := newSHM(t).Dial(ctx, transport.DialConfig{Addr: p.Server.Addr(), Local: b, Rank: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer ep2.Close()
	rma2 := ep2.(transport.RMA)
	a, err := p.Table.RegisterBuffer(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeTo(rma2, a.Key(), 1); err != nil {
		t.Fatal(err)
	}
	if err := p.Table.Deregister(ctx, a); err != nil {
		t.Fatal(err)
	}
	c, err := p.Table.RegisterBuffer(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := write(c.Key(), 2); err != nil || mem[0] != 2 {
		t.Fatalf("c: %v", err)
	}
	rs.mu.Lock()
	ua, uc := rs.slots[c.Key()], used
	rs.mu.Unlock()
	if ua.slot >= uc || ua.gen == 0 {
		t.Fatalf("c took word %d generation %d: not a reused one", ua.slot, ua.gen)
	}
	if err := writeTo(rma2, a.Key(), 3); !errors.Is(err, status.ErrNotFound) || mem[0] != 2 {
		t.Fatalf("a stale region through a reused word: %v, byte %d", err, mem[0])
	}
}

// TestLegacySlotsKept: a word a version-2 peer was given (it does not check generations) is
// never reused; a word only version-3 peers had is, with the next generation; a region
// deregistered before it was ever given a word gets none.
func TestLegacySlotsKept(t *testing.T) {
	tb := buffer.NewTable()
	rs, err := newRegionServer(tb, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer rs.close()
	b, err := buffer.New(0, 4096, memory.CPU)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	give := func(legacy bool) (*buffer.Region, uint32, uint32) {
		r, err := tb.RegisterBuffer(b)
		if err != nil {
			t.Fatal(err)
		}
		s, gen, st := rs.slot(r, legacy)
		if st != lstOK {
			t.Fatalf("slot: status %d", st)
		}
		return r, s, gen
	}
	r1, s1, _ := give(true)
	if err := tb.Deregister(ctx, r1); err != nil {
		t.Fatal(err)
	}
	r2, s2, g2 := give(false)
	if s2 == s1 {
		t.Fatalf("the word of a version-2 peer's region went to another (generation %d)", g2)
	}
	if err := tb.Deregister(ctx, r2); err != nil {
		t.Fatal(err)
	}
	r3, s3, g3 := give(false)
	if s3 != s2 || g3 != g2+1 {
		t.Fatalf("word %d generation %d, want %d and %d", s3, g3, s2, g2+1)
	}
	// Given to a version-3 peer, then also to a version-2 one: kept from then on.
	if s, _, _ := rs.slot(r3, true); s != s3 {
		t.Fatal("a region's word changed")
	}
	if err := tb.Deregister(ctx, r3); err != nil {
		t.Fatal(err)
	}
	r4, s4, _ := give(false)
	if s4 == s3 {
		t.Fatal("a word a version-2 peer had was reused")
	}
	if err := tb.Deregister(ctx, r4); err != nil {
		t.Fatal(err)
	}
	if _, _, st := rs.slot(r4, false); st != lstNotFound {
		t.Fatalf("a deregistered region got a word: status %d", st)
	}
}

// TestCacheForgetsDeregistered: regions the target registered on fresh memory, the peer
// reached once and the target deregistered do not stay in the peer's cache (each would hold a
// mapping of memory the target freed); the cache stays within twice the live regions.
func TestCacheForgetsDeregistered(t *testing.T) {
	p := transporttest.Options{New: newSHM, Addr: abstractName}.NewRMAPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 500 {
		b, err := buffer.New(0, 4096, memory.CPU) // memfd-backed: the peer maps it
		if err != nil {
			t.Fatal(err)
		}
		r, err := p.Table.RegisterBuffer(b)
		if err != nil {
			t.Fatal(err)
		}
		op, err := p.RMA.WriteAsync(ctx, []byte{byte(i)}, transport.Remote{Key: r.Key()})
		if err == nil {
			err = op.Wait(ctx)
		}
		if err != nil || b.Bytes()[0] != byte(i) {
			t.Fatalf("region %d: %v", i, err)
		}
		if err := p.Table.Deregister(ctx, r); err != nil {
			t.Fatal(err)
		}
		defer b.Close() // kept till the end: each region at its own address
	}
	ep := p.EP.(*endpoint)
	ep.peer.mu.Lock()
	n := ep.peer.index.Len()
	ep.peer.mu.Unlock()
	if n > minSweep {
		t.Fatalf("the peer still caches %d regions, all deregistered", n)
	}
}
