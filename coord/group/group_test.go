package group_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hmc-go/hmc/coord/group"
	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/internal/etcdtest"
	"github.com/hmc-go/hmc/status"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv("HMC_GROUP_CHILD") != "" {
		os.Exit(child())
	}
	goleak.VerifyTestMain(m, etcdtest.IgnoreGoroutines()...)
}

type opener func(t *testing.T, cfg store.Config) store.Client

var nsSeq atomic.Int64

// backends runs fn on the embedded store and on etcd.
func backends(t *testing.T, fn func(t *testing.T, open opener)) {
	t.Run("embedded", func(t *testing.T) {
		srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Close() })
		fn(t, func(t *testing.T, cfg store.Config) store.Client { return mustOpen(t, srv.URL(), cfg) })
	})
	t.Run("etcd", func(t *testing.T) {
		c := etcdtest.Start(t, 1)
		url := c.URL(fmt.Sprintf("g%d", nsSeq.Add(1)))
		fn(t, func(t *testing.T, cfg store.Config) store.Client {
			cfg.Heartbeat = 500 * time.Millisecond
			return mustOpen(t, url, cfg)
		})
	})
}

func mustOpen(t *testing.T, url string, cfg store.Config) store.Client {
	t.Helper()
	c, err := store.Open(context.Background(), url, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func ranked(t *testing.T, open opener, n int) []store.Client { return rankedFrom(t, open, 0, n) }

func rankedFrom(t *testing.T, open opener, first, n int) []store.Client {
	cs := make([]store.Client, n)
	for i := range cs {
		cs[i] = open(t, store.Config{Ranking: store.Explicit, Rank: first + i, WorldSize: 64})
	}
	return cs
}

// staticGroups opens n ranked clients (ranks 0..n-1) and the static group name on each.
func staticGroups(t *testing.T, open opener, name string, n int) ([]store.Client, []*group.Group) {
	cs := ranked(t, open, n)
	gs := make([]*group.Group, n)
	for i := range gs {
		gs[i] = newGroup(t, cs[i], name, group.Config{Size: n})
	}
	return cs, gs
}

func newGroup(t *testing.T, c store.Client, name string, cfg group.Config) *group.Group {
	t.Helper()
	g, err := group.New(context.Background(), c, name, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	return g
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

// all runs fn for every member concurrently and fails on any error.
func all(t *testing.T, n int, fn func(i int) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = fn(i) }()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

func TestBarrierAndAllGather(t *testing.T) {
	backends(t, func(t *testing.T, open opener) {
		const n = 6
		cs, gs := staticGroups(t, open, "static", n)
		var arrived atomic.Int64
		all(t, n, func(i int) error {
			for round := range 5 {
				arrived.Add(1)
				if err := gs[i].Barrier(ctx(t)); err != nil {
					return err
				}
				if got := arrived.Load(); got < int64(n*(round+1)) {
					return fmt.Errorf("rank %d left barrier %d with %d arrivals", i, round, got)
				}
				data := bytes.Repeat([]byte{byte(i)}, i*10+round) // lengths differ
				out, err := gs[i].AllGather(ctx(t), data)
				if err != nil {
					return err
				}
				for r, d := range out {
					if !bytes.Equal(d, bytes.Repeat([]byte{byte(r)}, r*10+round)) {
						return fmt.Errorf("rank %d round %d: slot %d = % x", i, round, r, d)
					}
				}
			}
			return nil
		})
		// Old rounds are cleaned: only the last two rounds' keys remain.
		if _, err := cs[0].Get(ctx(t), "group/static/c/0/0/BA", 0); !errors.Is(err, store.ErrNotExist) {
			t.Errorf("round 0 keys left behind: %v", err)
		}
	})
}

func TestSubGroups(t *testing.T) {
	backends(t, func(t *testing.T, open opener) {
		const n = 4
		_, gs := staticGroups(t, open, "subs", n)
		all(t, n, func(i int) error {
			members := []int{0, 2}
			if i%2 == 1 {
				members = []int{1, 3}
			}
			s, err := gs[i].Sub(fmt.Sprintf("half%d", i%2), members)
			if err != nil {
				return err
			}
			for range 3 {
				if err := s.Barrier(ctx(t)); err != nil {
					return err
				}
				out, err := s.AllGather(ctx(t), []byte{byte(i)})
				if err != nil {
					return err
				}
				if out[0][0] != byte(members[0]) || out[1][0] != byte(members[1]) {
					return fmt.Errorf("rank %d sub allgather %v", i, out)
				}
			}
			return nil
		})
		if _, err := gs[0].Sub("x", []int{1, 2}); !errors.Is(err, status.ErrInvalidConfig) {
			t.Fatalf("sub-group without self: %v", err)
		}
	})
}

func TestNumbers(t *testing.T) {
	backends(t, func(t *testing.T, open opener) {
		const n = 4
		_, gs := staticGroups(t, open, "nums", n)
		var mu sync.Mutex
		got := map[int]bool{}
		all(t, n, func(i int) error {
			for range 8 {
				k, err := gs[i].AllocNumber(ctx(t))
				if err != nil {
					return err
				}
				mu.Lock()
				dup := got[k]
				got[k] = true
				mu.Unlock()
				if dup {
					return fmt.Errorf("number %d given twice", k)
				}
			}
			return nil
		})
		for k := range n * 8 {
			if !got[k] {
				t.Fatalf("numbers not the lowest free: %v", got)
			}
		}
		if err := gs[0].ReleaseNumber(ctx(t), 5); err != nil {
			t.Fatal(err)
		}
		if err := gs[1].ReleaseNumber(ctx(t), 5); !errors.Is(err, status.ErrInvalidConfig) {
			t.Fatalf("double release: %v", err)
		}
		if k, err := gs[2].AllocNumber(ctx(t)); err != nil || k != 5 {
			t.Fatalf("released number not reused: %d %v", k, err)
		}
		if err := gs[0].ReleaseNumber(ctx(t), group.MaxNumbers); !errors.Is(err, status.ErrInvalidConfig) {
			t.Fatalf("release out of range: %v", err)
		}
	})
}

func TestExitBroadcast(t *testing.T) {
	backends(t, func(t *testing.T, open opener) {
		cs := ranked(t, open, 3)
		got := make(chan string, 3)
		for i := 1; i < 3; i++ {
			g := newGroup(t, cs[i], "exit", group.Config{Size: 3})
			stop := g.OnExit(func(s string) { got <- fmt.Sprintf("%d:%s", i, s) })
			t.Cleanup(stop)
		}
		g0 := newGroup(t, cs[0], "exit", group.Config{Size: 3})
		if err := g0.Exit(ctx(t), "oom on rank 0"); err != nil {
			t.Fatal(err)
		}
		seen := []string{<-got, <-got}
		slices.Sort(seen)
		if seen[0] != "1:oom on rank 0" || seen[1] != "2:oom on rank 0" {
			t.Fatalf("exit callbacks %v", seen)
		}
	})
}

func TestDynamicMembership(t *testing.T) {
	backends(t, func(t *testing.T, open opener) {
		const n = 5
		cs := ranked(t, open, n)
		gs := make([]*group.Group, n)
		for i := range gs {
			gs[i] = newGroup(t, cs[i], "dyn", group.Config{})
		}
		changes := make(chan group.View, 64)
		defer gs[0].OnViewChange(func(_, v group.View) { changes <- v })()
		all(t, n, func(i int) error { _, err := gs[i].Join(ctx(t)); return err })
		full := func(v group.View) bool { return v.Size() == n }
		for i := range gs {
			v, err := gs[i].WaitView(ctx(t), full)
			if err != nil {
				t.Fatal(err)
			}
			if v.Version != n || !slices.Equal(v.Members, []int{0, 1, 2, 3, 4}) {
				t.Fatalf("rank %d view %+v", i, v)
			}
		}
		all(t, n, func(i int) error { return gs[i].Barrier(ctx(t)) })
		// Versions are adopted in order, one at a time.
		last := int64(0)
		for len(changes) > 0 {
			v := <-changes
			if v.Version <= last {
				t.Fatalf("view %d after %d", v.Version, last)
			}
			last = v.Version
		}
		if _, err := gs[4].Leave(ctx(t)); err != nil {
			t.Fatal(err)
		}
		for i := range 4 {
			if _, err := gs[i].WaitView(ctx(t), func(v group.View) bool { return v.Size() == 4 && !v.Has(4) }); err != nil {
				t.Fatal(err)
			}
		}
		all(t, 4, func(i int) error {
			out, err := gs[i].AllGather(ctx(t), []byte{byte(i)})
			if err == nil && len(out) != 4 {
				err = fmt.Errorf("allgather of %d", len(out))
			}
			return err
		})
		if err := gs[4].Barrier(ctx(t)); !errors.Is(err, group.ErrNotMember) {
			t.Fatalf("barrier after leaving: %v", err)
		}
	})
}

func TestMemberDeath(t *testing.T) {
	backends(t, func(t *testing.T, open opener) {
		// Static group: a member that dies mid-barrier fails the barrier, naming it.
		cs, gs := staticGroups(t, open, "static", 3)
		errs := make(chan error, 2)
		for i := range 2 {
			go func() { errs <- gs[i].Barrier(ctx(t)) }()
		}
		time.Sleep(200 * time.Millisecond)
		start := time.Now()
		_ = gs[2].Close()
		_ = cs[2].Close() // rank 2 is gone
		for range 2 {
			err := <-errs
			var md *group.MemberDownError
			if !errors.As(err, &md) || md.Rank != 2 || !errors.Is(err, status.ErrPeerClosed) {
				t.Fatalf("barrier with a dead member: %v", err)
			}
		}
		t.Logf("barrier failed %v after the death", time.Since(start))
		if err := gs[0].Barrier(ctx(t)); err == nil {
			t.Fatal("barrier with a known-dead member succeeded")
		}

		// Dynamic group: a dead member is removed from the view by the survivors.
		ds := rankedFrom(t, open, 3, 3)
		dg := make([]*group.Group, 3)
		for i := range dg {
			dg[i] = newGroup(t, ds[i], "dyn", group.Config{})
			if _, err := dg[i].Join(ctx(t)); err != nil {
				t.Fatal(err)
			}
		}
		for _, g := range dg {
			if _, err := g.WaitView(ctx(t), func(v group.View) bool { return v.Size() == 3 }); err != nil {
				t.Fatal(err)
			}
		}
		_ = dg[1].Close()
		_ = ds[1].Close()
		for _, i := range []int{0, 2} {
			v, err := dg[i].WaitView(ctx(t), func(v group.View) bool { return !v.Has(4) })
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(v.Members, []int{3, 5}) {
				t.Fatalf("view after death %+v", v)
			}
		}
		all(t, 2, func(i int) error { return dg[i*2].Barrier(ctx(t)) })
	})
}

func TestBadInput(t *testing.T) {
	srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	unranked := mustOpen(t, srv.URL(), store.Config{})
	if _, err := group.New(ctx(t), unranked, "g", group.Config{}); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatalf("unranked client: %v", err)
	}
	c := mustOpen(t, srv.URL(), store.Config{Ranking: store.Explicit, Rank: 3, WorldSize: 8})
	for _, name := range []string{"", "a/b", string(make([]byte, 65))} {
		if _, err := group.New(ctx(t), c, name, group.Config{}); !errors.Is(err, status.ErrInvalidConfig) {
			t.Fatalf("name %q: %v", name, err)
		}
	}
	if _, err := group.New(ctx(t), c, "g", group.Config{Size: 2}); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatalf("rank outside static group: %v", err)
	}
	g := newGroup(t, c, "g", group.Config{Size: 4})
	if _, err := g.Join(ctx(t)); !errors.Is(err, status.ErrUnsupported) {
		t.Fatalf("join of a static group: %v", err)
	}
	// A barrier nobody else joins ends at the deadline, not never.
	short, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := g.Barrier(short); status.CodeOf(err) != status.Timeout {
		t.Fatalf("lonely barrier: %v", err)
	}
}

// A lone member's collective that times out says who it waited for.
func TestLoneMemberSaysWhoIsMissing(t *testing.T) {
	backends(t, func(t *testing.T, open opener) {
		cs := ranked(t, open, 1)
		g := newGroup(t, cs[0], "lone", group.Config{Size: 3})
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		// the embedded server counts arrivals (how many are missing); etcd's meeting has a key
		// per member (which ones)
		if err := g.Barrier(ctx); !errors.Is(err, status.ErrTimeout) ||
			!strings.Contains(err.Error(), "for 2 of 3 members") && !strings.Contains(err.Error(), "for ranks [1 2] of 3 members") {
			t.Fatalf("barrier: %v", err)
		}
		ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel2()
		if _, err := g.AllGather(ctx2, []byte("x")); !errors.Is(err, status.ErrTimeout) || !strings.Contains(err.Error(), "for ranks [1 2] of 3 members") {
			t.Fatalf("allgather: %v", err)
		}
	})
}

// OnEvent is told of views and of a member going down.
func TestGroupEvents(t *testing.T) {
	backends(t, func(t *testing.T, open opener) {
		cs := ranked(t, open, 2)
		events := make(chan string, 16)
		cfg := group.Config{Size: 2, OnEvent: func(e string, n int) { events <- fmt.Sprintf("%s %d", e, n) }}
		_ = newGroup(t, cs[0], "events", cfg)
		_ = cs[1].Close() // rank 1 goes down
		deadline := time.After(10 * time.Second)
		for {
			select {
			case e := <-events:
				if e == "member_down 1" {
					return
				}
			case <-deadline:
				t.Fatal("no member_down event for rank 1")
			}
		}
	})
}

// A member that dies and comes back under its rank (a restarted process) rejoins, and the
// group's barriers work again for all: whether its Join comes after the survivors removed its
// dead predecessor or races with that removal (where a survivor may drop the new process for
// the old one's death; the dropped member joins again by itself).
func TestRestartedMemberRejoins(t *testing.T) {
	backends(t, func(t *testing.T, open opener) {
		for _, wait := range []bool{true, false} {
			t.Run(fmt.Sprintf("after_removal=%v", wait), func(t *testing.T) {
				first := 20
				if !wait {
					first = 30
				}
				name := fmt.Sprintf("re%d", first)
				cs := rankedFrom(t, open, first, 3)
				gs := make([]*group.Group, 3)
				down := make(chan struct{})
				var once sync.Once
				for i := range gs {
					cfg := group.Config{}
					if i == 0 {
						cfg.OnEvent = func(e string, r int) {
							if e == "member_down" && r == first+1 {
								once.Do(func() { close(down) })
							}
						}
					}
					gs[i] = newGroup(t, cs[i], name, cfg)
					if _, err := gs[i].Join(ctx(t)); err != nil {
						t.Fatal(err)
					}
				}
				for _, g := range gs {
					if _, err := g.WaitView(ctx(t), func(v group.View) bool { return v.Size() == 3 }); err != nil {
						t.Fatal(err)
					}
				}
				all(t, 3, func(i int) error { return gs[i].Barrier(ctx(t)) })
				_ = gs[1].Close()
				_ = cs[1].Close() // rank first+1 dies
				if wait {
					for _, i := range []int{0, 2} {
						if _, err := gs[i].WaitView(ctx(t), func(v group.View) bool { return !v.Has(first + 1) }); err != nil {
							t.Fatal(err)
						}
					}
				}
				// The store frees the rank when it reports it down; the restarted process comes
				// back right then, racing the survivors' removal of its predecessor.
				<-down
				c := open(t, store.Config{Ranking: store.Explicit, Rank: first + 1, WorldSize: 64})
				gs[1] = newGroup(t, c, name, group.Config{})
				if _, err := gs[1].Join(ctx(t)); err != nil {
					t.Fatal(err)
				}
				// The group settles on one view with all three (a survivor that acts on the
				// death late drops the new process, which then joins again), and barriers work.
				deadline := time.Now().Add(30 * time.Second)
				ok := 0
				for ok < 3 {
					if time.Now().After(deadline) {
						for i, g := range gs {
							t.Logf("member %d: view %+v", i, g.View())
						}
						t.Fatal("the group did not settle with the restarted member")
					}
					v0 := gs[0].View()
					if v0.Size() != 3 || gs[1].View().Version != v0.Version || gs[2].View().Version != v0.Version {
						time.Sleep(10 * time.Millisecond)
						continue
					}
					bctx, cancel := context.WithTimeout(ctx(t), 5*time.Second)
					errs := make([]error, 3)
					var wg sync.WaitGroup
					for i := range 3 {
						wg.Add(1)
						go func() { defer wg.Done(); errs[i] = gs[i].Barrier(bctx) }()
					}
					wg.Wait()
					cancel()
					if err := errors.Join(errs...); err != nil {
						t.Logf("barrier in view %+v: %v", v0, err)
						ok = 0
						continue
					}
					ok++
				}
			})
		}
	})
}
