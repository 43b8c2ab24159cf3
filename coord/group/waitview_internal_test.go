package group

import (
	"context"
	"log/slog"
	"testing"
	"time"
)

// A view that held only until the next one was adopted satisfies a waiter that was not looking
// then: WaitView returns it rather than waiting for another (until its deadline, before).
func TestWaitViewSeesShortLivedView(t *testing.T) {
	g := &Group{cfg: Config{Timeout: 5 * time.Second}, log: slog.New(slog.DiscardHandler), viewCh: make(chan struct{}),
		view: View{Version: 1, Members: []int{0, 1}}, down: map[int]bool{}, waits: map[*wait]struct{}{},
		onView: map[int]func(old, new View){}}
	checking := make(chan struct{})
	adopted := make(chan struct{})
	first := true
	type result struct {
		v   View
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := g.WaitView(context.Background(), func(v View) bool {
			if first { // the waiter is busy while two views come and go
				first = false
				close(checking)
				<-adopted
			}
			return v.Size() >= 3
		})
		done <- result{v, err}
	}()
	<-checking
	g.adopt(View{Version: 2, Members: []int{0, 1, 2}})
	g.adopt(View{Version: 3, Members: []int{0, 2}})
	close(adopted)
	select {
	case r := <-done:
		if r.err != nil || r.v.Version != 2 {
			t.Fatalf("WaitView = version %d %v, %v; want version 2", r.v.Version, r.v.Members, r.err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("WaitView missed the view of 3 that lasted until the next one")
	}
}

// since lists the views adopted after a version, oldest first, as far back as the history goes.
func TestViewHistory(t *testing.T) {
	g := &Group{}
	for v := int64(1); v <= 40; v++ {
		g.view = View{Version: v}
		g.recent[v%viewHistory] = g.view
	}
	for _, tc := range []struct{ since, first, n int64 }{{39, 0, 0}, {38, 39, 1}, {30, 31, 9}, {1, 25, 15}} {
		vs := g.since(tc.since)
		if int64(len(vs)) != tc.n || tc.n > 0 && (vs[0].Version != tc.first || vs[len(vs)-1].Version != 39) {
			t.Errorf("since(%d): %d views from %v, want %d from %d to 39", tc.since, len(vs), vs, tc.n, tc.first)
		}
	}
}

// A rank-down report that arrives after the view that removed the dead process does not mark
// the rank down: the process that takes the rank again is a new member whose collectives must
// not fail at once (they did, for good: only a view without the rank cleared the mark).
func TestLateRankDownAfterRemoval(t *testing.T) {
	g := &Group{cfg: Config{Timeout: 5 * time.Second}, log: slog.New(slog.DiscardHandler), viewCh: make(chan struct{}),
		view: View{Version: 3, Members: []int{20, 21, 22}}, down: map[int]bool{}, waits: map[*wait]struct{}{},
		onView: map[int]func(old, new View){}}
	g.adopt(View{Version: 4, Members: []int{20, 22}}) // another member removed rank 21
	g.rankDown(21)                                    // this member hears of the death late
	g.adopt(View{Version: 5, Members: []int{20, 21, 22}})
	if g.down[21] {
		t.Fatal("rank 21 marked down in view 5, which holds its restarted process")
	}
	g.rankDown(22) // a member's death still marks it
	if !g.down[22] {
		t.Fatal("rank 22 not marked down")
	}
}
