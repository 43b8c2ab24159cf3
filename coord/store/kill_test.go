package store_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/status"
)

// storeChild runs an embedded store in this (re-executed test) process and prints its URL.
func storeChild() {
	srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{})
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	fmt.Println(srv.URL())
	select {} // until killed
}

func startStoreProcess(t *testing.T) (*exec.Cmd, string) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "HMC_STORE_CHILD=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "tcp://") {
		t.Fatalf("store child: %q %v", line, err)
	}
	return cmd, strings.TrimSpace(line)
}

func TestStoreKilled(t *testing.T) {
	cmd, url := startStoreProcess(t)
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
	_ = cmd.Process.Kill() // SIGKILL
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
