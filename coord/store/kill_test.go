package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/coord/store/storetest"
	"github.com/hmc-go/hmc/status"
)

func TestStoreKilled(t *testing.T) {
	srv := storetest.SpawnServer(t, 0)
	url := srv.URL
	ctx := context.Background()
	c, err := store.Open(ctx, url, store.Config{Ranking: store.Explicit, Rank: 0, WorldSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Set(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	waiting := make(chan error, 1)
	go func() { _, err := c.Get(ctx, "never", store.Forever); waiting <- err }()
	time.Sleep(100 * time.Millisecond)
	srv.Kill() // SIGKILL
	select {
	case err := <-waiting:
		if !errors.Is(err, store.ErrIO) || !errors.Is(err, status.ErrPeerClosed) {
			t.Fatalf("blocked Get after the store died: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("blocked Get hangs after the store died")
	}
	start := time.Now()
	if _, err := c.Add(ctx, "n", 1); !errors.Is(err, store.ErrIO) {
		t.Fatalf("Add after the store died: %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatal("a call on a dead store took more than 5 s")
	}
	// Connecting to a dead store fails within the dial timeout.
	if _, err := store.Open(ctx, url, store.Config{DialTimeout: 300 * time.Millisecond}); !errors.Is(err, store.ErrIO) {
		t.Fatalf("Open of a dead store: %v", err)
	}
}
