package group

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/hmc-go/hmc/coord/store"
)

// msgs is a slog handler that passes each record's message on.
type msgs chan string

func (m msgs) Enabled(context.Context, slog.Level) bool { return true }
func (m msgs) Handle(_ context.Context, r slog.Record) error {
	select {
	case m <- r.Message:
	default:
	}
	return nil
}
func (m msgs) WithAttrs([]slog.Attr) slog.Handler { return m }
func (m msgs) WithGroup(string) slog.Handler      { return m }

// trio is three members (ranks 0-2) of one group on an embedded store, joined and seeing all
// three; member 0 logs to log0.
type trio struct {
	ctx  context.Context
	open func(rank int) store.Client
	cs   []store.Client
	gs   []*Group
	log0 msgs
}

func newTrio(t *testing.T, name string) *trio {
	t.Helper()
	srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	tr := &trio{ctx: ctx, cs: make([]store.Client, 3), gs: make([]*Group, 3), log0: make(msgs, 64)}
	tr.open = func(rank int) store.Client {
		c, err := store.Open(ctx, srv.URL(), store.Config{Ranking: store.Explicit, Rank: rank, WorldSize: 8})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	for i := range tr.gs {
		cfg := Config{}
		if i == 0 {
			cfg.Logger = slog.New(tr.log0)
		}
		tr.cs[i] = tr.open(i)
		tr.gs[i] = tr.join(t, tr.cs[i], name, cfg)
	}
	for _, g := range tr.gs {
		if _, err := g.WaitView(ctx, func(v View) bool { return v.Size() == 3 }); err != nil {
			t.Fatal(err)
		}
	}
	return tr
}

// join makes a member of group name on c and joins it.
func (tr *trio) join(t *testing.T, c store.Client, name string, cfg Config) *Group {
	t.Helper()
	g, err := New(tr.ctx, c, name, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	if _, err := g.Join(tr.ctx); err != nil {
		t.Fatal(err)
	}
	return g
}

// barrier runs a barrier of the three with deadline d and returns each member's error.
func (tr *trio) barrier(d time.Duration) []error {
	ctx, cancel := context.WithTimeout(tr.ctx, d)
	defer cancel()
	errs := make([]error, len(tr.gs))
	var wg sync.WaitGroup
	for i, g := range tr.gs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = g.Barrier(ctx) }()
	}
	wg.Wait()
	return errs
}

// logged waits up to 10 s for member 0 to log one of msgs and fails the test if it logs bad
// first (bad may be empty).
func (tr *trio) logged(t *testing.T, bad string, msgs ...string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case m := <-tr.log0:
			if bad != "" && m == bad {
				t.Fatalf("member 0 logged %q (view now %+v)", m, tr.gs[0].View())
			}
			for _, w := range msgs {
				if m == w {
					return
				}
			}
		case <-deadline:
			t.Fatalf("member 0 logged none of %q", msgs)
		}
	}
}

// A rank-down report that reaches a member after the dead rank's restarted process took the rank
// back and joined is known for a past process's (the store says the rank is live): the member
// does not remove the live rank (it did, and the new process was dropped and joined again), and
// the three keep working together in the view the restarted process's Join made.
func TestLateReportKeepsRestartedRank(t *testing.T) {
	tr := newTrio(t, "late")
	gs := tr.gs
	// Rank 1's process dies; the others remove it (the store's report, on time), and a new
	// process takes rank 1 and joins.
	_ = gs[1].Close()
	_ = tr.cs[1].Close()
	for _, g := range []*Group{gs[0], gs[2]} {
		if _, err := g.WaitView(tr.ctx, func(v View) bool { return !v.Has(1) }); err != nil {
			t.Fatal(err)
		}
	}
	tr.logged(t, "", "group: dead ranks removed", "group: dead ranks already removed by another member",
		"group: a reported death was handled already") // member 0 done with the on-time report
	gs[1] = tr.join(t, tr.open(1), "late", Config{})
	if v := gs[1].View(); !v.Has(1) || v.Size() != 3 {
		t.Fatalf("restarted rank 1 joined view %+v: want the three", v)
	}
	// Member 0 hears of rank 1's death again, late (as when its report comes after the view
	// that removed the dead process, or a second report of one death).
	gs[0].rankDown(1)
	tr.logged(t, "group: dead ranks removed", "group: a reported death is of a past process: the rank is live again")
	// All three in one view, rank 1 not marked down, and a barrier across them works.
	want := gs[1].View().Version
	for i, g := range gs {
		if _, err := g.WaitView(tr.ctx, func(v View) bool { return v.Version >= want }); err != nil {
			t.Fatal(err)
		}
		if v := g.View(); v.Version != want || v.Size() != 3 {
			t.Fatalf("member %d: view %+v, want version %d of three", i, v, want)
		}
	}
	if err := errors.Join(tr.barrier(10 * time.Second)...); err != nil {
		t.Fatalf("barrier after the late report: %v", err)
	}
}

// A process that joins while the view still holds its rank from a process before it makes a new
// view of the same members, so that every member's collectives start again together: the
// others are past their first rounds, the newcomer is not.
func TestJoinOverOldEntryMakesNewView(t *testing.T) {
	tr := newTrio(t, "over")
	for range 3 { // the members are a few rounds in
		if err := errors.Join(tr.barrier(10 * time.Second)...); err != nil {
			t.Fatal(err)
		}
	}
	old := tr.gs[1].View()
	_ = tr.gs[1].Close() // no Leave: its entry stays, as a dead process's would
	tr.gs[1] = tr.join(t, tr.cs[1], "over", Config{})
	v := tr.gs[1].View()
	if v.Version != old.Version+1 || v.Size() != 3 {
		t.Fatalf("the new process joined view %+v over %+v: want version %d of the same three", v, old, old.Version+1)
	}
	if again, err := tr.gs[1].Join(tr.ctx); err != nil || again.Version != v.Version {
		t.Fatalf("a second Join by the same member: view %+v, %v; want version %d unchanged", again, err, v.Version)
	}
	for _, g := range tr.gs {
		if _, err := g.WaitView(tr.ctx, func(w View) bool { return w.Version >= v.Version }); err != nil {
			t.Fatal(err)
		}
	}
	if err := errors.Join(tr.barrier(10 * time.Second)...); err != nil {
		t.Fatalf("barrier with the new process: %v", err)
	}
}

// A member that fails a collective at once for a rank it holds down (a mark a moment behind or
// ahead of the view) uses up the round as the others do, so the next collective meets in one
// round (it met a round behind, for good, and every later barrier of the view timed out).
func TestFailedFastCollectiveKeepsRounds(t *testing.T) {
	tr := newTrio(t, "fast")
	g0 := tr.gs[0]
	g0.mu.Lock()
	g0.down[1] = true // a stale mark: rank 1 is alive and in the barrier
	g0.mu.Unlock()
	errs := tr.barrier(time.Second)
	var mde *MemberDownError
	if !errors.As(errs[0], &mde) || mde.Rank != 1 || errs[1] == nil || errs[2] == nil {
		t.Fatalf("barrier with member 0 holding rank 1 down: %v; want member 0 failed for rank 1, the others timed out", errs)
	}
	g0.mu.Lock()
	delete(g0.down, 1)
	g0.mu.Unlock()
	if err := errors.Join(tr.barrier(10 * time.Second)...); err != nil {
		t.Fatalf("the next barrier: %v", err)
	}
}
