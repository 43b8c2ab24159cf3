package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/internal/etcdtest"
)

// A client whose store goes away and comes back on the same address fails calls with ErrIO at
// once while it is gone, then connects again by itself under its rank: calls work again, the
// rank is its own again, and rank-down events reach it again.
func TestClientReconnects(t *testing.T) {
	srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{WorldSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	url := srv.URL()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := func(rank int) store.Config {
		return store.Config{Ranking: store.Explicit, Rank: rank, WorldSize: 4, Heartbeat: 100 * time.Millisecond, DialTimeout: time.Second}
	}
	c, err := store.Open(ctx, url, cfg(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	downs := make(chan int, 16)
	defer c.WatchRankDown(func(r int) { downs <- r })()
	if err := c.Set(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	start := time.Now()
	if _, err := c.Get(ctx, "k", 0); !errors.Is(err, store.ErrIO) || time.Since(start) > 2*time.Second {
		t.Fatalf("a call while the store is gone: %v after %v, want ErrIO at once", err, time.Since(start))
	}
	srv2, err := store.Listen(url, store.ServerConfig{WorldSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer srv2.Close()
	back := time.Now()
	for {
		err := c.Set(ctx, "k2", []byte("v2"))
		if err == nil {
			break
		}
		if !errors.Is(err, store.ErrIO) || time.Since(back) > 5*time.Second {
			t.Fatalf("no store link 5 s after the store came back: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("calls work again %v after the store came back", time.Since(back).Round(time.Millisecond))
	if v, err := c.Get(ctx, "k2", 0); err != nil || string(v) != "v2" {
		t.Fatalf("get after reconnecting: %q %v", v, err)
	}
	if _, err := store.Open(ctx, url, cfg(1)); err == nil {
		t.Fatal("rank 1 was free on the new store: the client did not take it back")
	}
	for len(downs) > 0 { // the first store's goodbye
		<-downs
	}
	o, err := store.Open(ctx, url, cfg(2))
	if err != nil {
		t.Fatal(err)
	}
	o.Close()
	select {
	case r := <-downs:
		if r != 2 {
			t.Fatalf("rank-down for %d, want 2", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no rank-down after reconnecting")
	}
}

// An etcd client whose lease is lost (it was cut off, or frozen, past its TTL; here the lease
// is revoked by someone else) is reported down, then takes a new lease and its rank again by
// itself: its death after that is reported too.
func TestEtcdLeaseLostTakesRankAgain(t *testing.T) {
	cl := etcdtest.Start(t, 1)
	url := cl.URL("lease-lost")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := func(rank int) store.Config {
		return store.Config{Ranking: store.Explicit, Rank: rank, WorldSize: 4, Heartbeat: 100 * time.Millisecond}
	}
	a, err := store.Open(ctx, url, cfg(1))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := store.Open(ctx, url, cfg(2))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	downs := make(chan int, 16)
	defer b.WatchRankDown(func(r int) { downs <- r })()
	raw, err := cl.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	key := "/lease-lost/rank/0001"
	resp, err := raw.Get(ctx, key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("rank 1's key: %v %v", resp, err)
	}
	if _, err := raw.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	expectDown := func(what string) {
		t.Helper()
		select {
		case r := <-downs:
			if r != 1 {
				t.Fatalf("%s: rank-down for %d, want 1", what, r)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no rank-down for rank 1", what)
		}
	}
	expectDown("lease revoked")
	start := time.Now()
	for {
		resp, err := raw.Get(ctx, key)
		if err == nil && len(resp.Kvs) == 1 {
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatal("rank 1 is not held again 10 s after its lease was lost")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("rank 1 held again %v after its lease was lost", time.Since(start).Round(time.Millisecond))
	if err := a.Set(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	a.Close()
	expectDown("closed after taking its rank again")
}
