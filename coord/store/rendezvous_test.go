package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/internal/etcdtest"
)

// A meeting on etcd: every participant writes its own key, the one completing the meeting
// writes done with all values in id order, Await serves the wait from a kept watch, and
// Arrived / RemoveMeeting see and clear the keys. Through a Prefixed view, as groups use it.
func TestEtcdRendezvous(t *testing.T) {
	cl := etcdtest.Start(t, 1)
	url := cl.URL("rv")
	const n = 12
	rvs := make([]store.Rendezvous, n)
	var raw store.Client
	for i := range rvs {
		c, err := store.Open(context.Background(), url, store.Config{Heartbeat: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		if i == 0 {
			raw = c
		}
		rv, ok := store.AsRendezvous(store.Prefixed(c, "p/"))
		if !ok {
			t.Fatal("etcd client has no Rendezvous")
		}
		rvs[i] = rv
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	for _, bad := range []struct{ id, n int }{{-1, 3}, {3, 3}, {0, 0}, {0, store.MaxParticipants + 1}} {
		if err := rvs[0].Arrive(ctx, "m/", bad.id, bad.n, nil, "done"); !errors.Is(err, store.ErrInvalidKey) {
			t.Errorf("Arrive(id %d, n %d): %v", bad.id, bad.n, err)
		}
	}
	if _, err := rvs[0].Await(ctx, "w/", "none", 50*time.Millisecond); !errors.Is(err, store.ErrTimeout) {
		t.Fatalf("Await of a key nobody writes: %v", err)
	}

	for round := range 3 {
		prefix, name := fmt.Sprintf("m%d/", round), strconv.Itoa(round)
		var want []byte
		for i := range n {
			want = append(want, byte(i), byte(round))
		}
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := rvs[i].Arrive(ctx, prefix, i, n, []byte{byte(i), byte(round)}, "w/"+name); err != nil {
					errs[i] = err
					return
				}
				got, err := rvs[i].Await(ctx, "w/", name, store.Forever)
				if err == nil && !bytes.Equal(got, want) {
					err = fmt.Errorf("done = %v, want %v", got, want)
				}
				errs[i] = err
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		ids, err := rvs[0].Arrived(ctx, prefix)
		if err != nil || len(ids) != n || ids[0] != 0 || ids[n-1] != n-1 {
			t.Fatalf("Arrived = %v, %v", ids, err)
		}
		if v, err := raw.Get(ctx, "p/"+prefix+"00003", 0); err != nil || !bytes.Equal(v, []byte{3, byte(round)}) {
			t.Fatalf("participant 3's key under the view's prefix: %v, %v", v, err)
		}
		if err := rvs[0].RemoveMeeting(ctx, prefix); err != nil {
			t.Fatal(err)
		}
		if ids, err := rvs[0].Arrived(ctx, prefix); err != nil || len(ids) != 0 {
			t.Fatalf("Arrived after RemoveMeeting = %v, %v", ids, err)
		}
	}

	// A meeting short of one participant does not complete; the last one completes it.
	if err := rvs[0].Arrive(ctx, "half/", 0, 2, []byte("a"), "w/half"); err != nil {
		t.Fatal(err)
	}
	if _, err := rvs[1].Await(ctx, "w/", "half", 100*time.Millisecond); !errors.Is(err, store.ErrTimeout) {
		t.Fatalf("Await of an incomplete meeting: %v", err)
	}
	got := make(chan []byte, 1)
	go func() { v, _ := rvs[1].Await(ctx, "w/", "half", store.Forever); got <- v }()
	if err := rvs[1].Arrive(ctx, "half/", 1, 2, []byte("b"), "w/half"); err != nil {
		t.Fatal(err)
	}
	if v := <-got; string(v) != "ab" {
		t.Fatalf("done = %q", v)
	}
	// Deleted and written again, the kept watch sees the new value (it may lag by an event:
	// Await is not a linearizable read, see its doc).
	if err := raw.Remove(ctx, "p/w/half"); err != nil {
		t.Fatal(err)
	}
	if err := raw.Set(ctx, "p/w/half", []byte("again")); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		v, err := rvs[1].Await(ctx, "w/", "half", time.Second)
		if err == nil && string(v) == "again" {
			break
		}
		if err != nil || time.Now().After(deadline) {
			t.Fatalf("Await after rewrite: %q, %v", v, err)
		}
		time.Sleep(time.Millisecond)
	}
	// More directories than a client keeps watches for: the evicted ones are watched again.
	for d := range 20 {
		dir := fmt.Sprintf("d%d/", d)
		if err := raw.Set(ctx, "p/"+dir+"k", []byte(dir)); err != nil {
			t.Fatal(err)
		}
		if v, err := rvs[2].Await(ctx, dir, "k", time.Second); err != nil || string(v) != dir {
			t.Fatalf("dir %d: %q, %v", d, v, err)
		}
	}
	if v, err := rvs[2].Await(ctx, "d0/", "k", time.Second); err != nil || string(v) != "d0/" {
		t.Fatalf("evicted dir: %q, %v", v, err)
	}
	// A participant key nobody should have written under the prefix is reported, not merged.
	if err := raw.Set(ctx, "p/odd/00007", nil); err != nil {
		t.Fatal(err)
	}
	if err := rvs[0].Arrive(ctx, "odd/", 0, 1, nil, "w/odd"); !errors.Is(err, store.ErrFailed) {
		t.Fatalf("meeting with a stray key: %v", err)
	}
	if ids, _ := rvs[0].Arrived(ctx, "odd/"); !slices.Equal(ids, []int{0, 7}) {
		t.Fatalf("Arrived = %v", ids)
	}
}

// The embedded server has no Rendezvous: groups count arrivals with Add there.
func TestEmbeddedHasNoRendezvous(t *testing.T) {
	srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	c, err := store.Open(context.Background(), srv.URL(), store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, ok := store.AsRendezvous(store.Prefixed(c, "x/")); ok {
		t.Fatal("embedded client offers Rendezvous")
	}
}
