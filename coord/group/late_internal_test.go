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

// A rank-down report that reaches a member after the dead rank's restarted process took the rank
// back and joined is known for a past process's (the store says the rank is live): the member
// does not remove the live rank (it did, and the new process was dropped and joined again), and
// the three keep working together in the view the restarted process's Join made.
func TestLateReportKeepsRestartedRank(t *testing.T) {
	srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	open := func(rank int) store.Client {
		c, err := store.Open(ctx, srv.URL(), store.Config{Ranking: store.Explicit, Rank: rank, WorldSize: 8})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	log0 := make(msgs, 64)
	gs := make([]*Group, 3)
	for i := range gs {
		cfg := Config{}
		if i == 0 {
			cfg.Logger = slog.New(log0)
		}
		if gs[i], err = New(ctx, open(i), "late", cfg); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = gs[i].Close() })
		if _, err := gs[i].Join(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, g := range gs {
		if _, err := g.WaitView(ctx, func(v View) bool { return v.Size() == 3 }); err != nil {
			t.Fatal(err)
		}
	}
	// Rank 1's process dies; the others remove it (the store's report, on time), and a new
	// process takes rank 1 and joins.
	_ = gs[1].Close()
	_ = gs[1].st.Close()
	for _, g := range []*Group{gs[0], gs[2]} {
		if _, err := g.WaitView(ctx, func(v View) bool { return !v.Has(1) }); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.After(10 * time.Second); ; { // member 0 done with the on-time report
		select {
		case m := <-log0:
			switch m {
			case "group: dead ranks removed", "group: dead ranks already removed by another member",
				"group: a reported death was handled already":
			default:
				continue
			}
		case <-deadline:
			t.Fatal("member 0 did not act on rank 1's death")
		}
		break
	}
	gs[1], err = New(ctx, open(1), "late", Config{})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := gs[1].Join(ctx); err != nil || !v.Has(1) || v.Size() != 3 {
		t.Fatalf("restarted rank 1 joined view %+v, %v: want the three", v, err)
	}
	// Member 0 hears of rank 1's death again, late (as when its report comes after the view
	// that removed the dead process, or a second report of one death).
	gs[0].rankDown(1)
	for deadline := time.After(10 * time.Second); ; {
		select {
		case m := <-log0:
			if m == "group: dead ranks removed" {
				t.Fatalf("member 0 removed rank 1, which a live process holds (view now %+v)", gs[0].View())
			}
			if m != "group: a reported death is of a past process: the rank is live again" {
				continue
			}
		case <-deadline:
			t.Fatal("member 0 did not act on the late report")
		}
		break
	}
	// All three in one view, rank 1 not marked down, and a barrier across them works.
	want := gs[1].View().Version
	for i, g := range gs {
		if _, err := g.WaitView(ctx, func(v View) bool { return v.Version >= want }); err != nil {
			t.Fatal(err)
		}
		if v := g.View(); v.Version != want || v.Size() != 3 {
			t.Fatalf("member %d: view %+v, want version %d of three", i, v, want)
		}
	}
	bctx, bcancel := context.WithTimeout(ctx, 10*time.Second)
	defer bcancel()
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i, g := range gs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = g.Barrier(bctx) }()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("barrier after the late report: %v", err)
	}
}

// A process that joins while the view still holds its rank from a process before it makes a new
// view of the same members, so that every member's collectives start again together: the
// others are past their first rounds, the newcomer is not.
func TestJoinOverOldEntryMakesNewView(t *testing.T) {
	srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cs := make([]store.Client, 3)
	gs := make([]*Group, 3)
	for i := range gs {
		if cs[i], err = store.Open(ctx, srv.URL(), store.Config{Ranking: store.Explicit, Rank: i, WorldSize: 8}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cs[i].Close() })
		if gs[i], err = New(ctx, cs[i], "over", Config{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = gs[i].Close() })
		if _, err := gs[i].Join(ctx); err != nil {
			t.Fatal(err)
		}
	}
	barrier := func() error {
		bctx, bcancel := context.WithTimeout(ctx, 10*time.Second)
		defer bcancel()
		errs := make([]error, 3)
		var wg sync.WaitGroup
		for i, g := range gs {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = g.Barrier(bctx) }()
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	for _, g := range gs {
		if _, err := g.WaitView(ctx, func(v View) bool { return v.Size() == 3 }); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 { // the members are a few rounds in
		if err := barrier(); err != nil {
			t.Fatal(err)
		}
	}
	old := gs[1].View()
	_ = gs[1].Close() // no Leave: its entry stays, as a dead process's would
	if gs[1], err = New(ctx, cs[1], "over", Config{}); err != nil {
		t.Fatal(err)
	}
	v, err := gs[1].Join(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v.Version != old.Version+1 || v.Size() != 3 {
		t.Fatalf("the new process joined view %+v over %+v: want version %d of the same three", v, old, old.Version+1)
	}
	if again, err := gs[1].Join(ctx); err != nil || again.Version != v.Version {
		t.Fatalf("a second Join by the same member: view %+v, %v; want version %d unchanged", again, err, v.Version)
	}
	for _, g := range gs {
		if _, err := g.WaitView(ctx, func(w View) bool { return w.Version >= v.Version }); err != nil {
			t.Fatal(err)
		}
	}
	if err := barrier(); err != nil {
		t.Fatalf("barrier with the new process: %v", err)
	}
}

// A member that fails a collective at once for a rank it holds down (a mark a moment behind or
// ahead of the view) uses up the round as the others do, so the next collective meets in one
// round (it met a round behind, for good, and every later barrier of the view timed out).
func TestFailedFastCollectiveKeepsRounds(t *testing.T) {
	srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	gs := make([]*Group, 3)
	for i := range gs {
		c, err := store.Open(ctx, srv.URL(), store.Config{Ranking: store.Explicit, Rank: i, WorldSize: 8})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		if gs[i], err = New(ctx, c, "fast", Config{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = gs[i].Close() })
		if _, err := gs[i].Join(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, g := range gs {
		if _, err := g.WaitView(ctx, func(v View) bool { return v.Size() == 3 }); err != nil {
			t.Fatal(err)
		}
	}
	barrier := func(d time.Duration) []error {
		bctx, bcancel := context.WithTimeout(ctx, d)
		defer bcancel()
		errs := make([]error, 3)
		var wg sync.WaitGroup
		for i, g := range gs {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = g.Barrier(bctx) }()
		}
		wg.Wait()
		return errs
	}
	gs[0].mu.Lock()
	gs[0].down[1] = true // a stale mark: rank 1 is alive and in the barrier
	gs[0].mu.Unlock()
	errs := barrier(time.Second)
	var mde *MemberDownError
	if !errors.As(errs[0], &mde) || mde.Rank != 1 || errs[1] == nil || errs[2] == nil {
		t.Fatalf("barrier with member 0 holding rank 1 down: %v; want member 0 failed for rank 1, the others timed out", errs)
	}
	gs[0].mu.Lock()
	delete(gs[0].down, 1)
	gs[0].mu.Unlock()
	if err := errors.Join(barrier(10 * time.Second)...); err != nil {
		t.Fatalf("the next barrier: %v", err)
	}
}
