package kv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/hmc-go/hmc/internal/childtest"
	"github.com/hmc-go/hmc/status"
)

func TestMain(m *testing.M) {
	if os.Getenv("HMC_KV_CHILD") != "" {
		os.Exit(child())
	}
	goleak.VerifyTestMain(m)
}

// pattern is seed's n bytes.
func pattern(seed, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31 + seed + i>>10)
	}
	return b
}

// child is a pool client in its own process (HMC_KV_CHILD=client, HMC_KV_MASTER): it lends a
// 32 MiB segment, prints READY <id>, then runs its parent's lines: "put <key> <seed> <n>
// <replicas>" and "get <key> <seed> <n>" answer "ok" or "bad <why>".
func child() int {
	ctx := context.Background()
	c, err := NewClient(ctx, ClientConfig{Master: os.Getenv("HMC_KV_MASTER"), SegmentSize: 32 << 20, Heartbeat: 100 * time.Millisecond})
	if err != nil {
		fmt.Println("FAIL", err)
		return 1
	}
	defer c.Close()
	fmt.Println("READY", c.ID())
	for l := range childtest.ParentSays() {
		var key string
		var seed, n, reps int
		answer := "ok"
		switch {
		case strings.HasPrefix(l, "put"):
			_, _ = fmt.Sscanf(l, "put %s %d %d %d", &key, &seed, &n, &reps)
			if err := c.Put(ctx, key, pattern(seed, n), reps); err != nil {
				answer = "bad " + err.Error()
			}
		case strings.HasPrefix(l, "get"):
			_, _ = fmt.Sscanf(l, "get %s %d %d", &key, &seed, &n)
			got, err := c.Get(ctx, key)
			switch {
			case err != nil:
				answer = "bad " + err.Error()
			case !bytes.Equal(got, pattern(seed, n)):
				answer = "bad bytes differ"
			}
		default:
			return 0
		}
		fmt.Println(answer)
	}
	return 0
}

// Two clients in two processes share one pool: each reads what the other put (from its own
// replica, or over the transfer engine from the other's segment), byte for byte; a lease keeps
// an object from removal; when one client is killed, an object with a replica on the other
// stays readable, and one only it held is gone within the master's ClientTTL — a get of it
// fails typed and never returns bytes.
func TestTwoProcesses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m := NewMaster(MasterConfig{LeaseTTL: 300 * time.Millisecond})
	srv, err := Serve(m, ServerConfig{Addr: "127.0.0.1:0", ClientTTL: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	stdin, lines := childtest.Start(t, cmd, 16, "HMC_KV_CHILD=client", "HMC_KV_MASTER="+srv.Addr())
	var a string
	select {
	case l := <-lines:
		if _, err := fmt.Sscanf(l, "READY %s", &a); err != nil {
			t.Fatalf("child said %q", l)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("child did not start")
	}
	ask := func(l string) string {
		t.Helper()
		if _, err := io.WriteString(stdin, l+"\n"); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-lines:
			return r
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: no answer", l)
		}
		return ""
	}
	b, err := NewClient(ctx, ClientConfig{Master: srv.Addr(), SegmentSize: 32 << 20, Heartbeat: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// b's object, two replicas (b's and a's segments); a reads it.
	const n1 = 1<<20 + 3
	if err := b.Put(ctx, "k1", pattern(1, n1), 2); err != nil {
		t.Fatal(err)
	}
	if r := ask(fmt.Sprintf("get k1 1 %d", n1)); r != "ok" {
		t.Fatalf("a's get of k1: %s", r)
	}
	// a's object, one replica in a's segment; b reads it over the transfer engine.
	const n2 = 3<<20 + 5
	if r := ask(fmt.Sprintf("put k2 2 %d 1", n2)); r != "ok" {
		t.Fatalf("a's put of k2: %s", r)
	}
	got, err := b.Get(ctx, "k2")
	if err != nil || !bytes.Equal(got, pattern(2, n2)) {
		t.Fatalf("b's get of k2: %v", err)
	}
	if err := b.Remove(ctx, "k2"); CodeOf(err) != ObjectHasLease {
		t.Fatalf("remove of a leased object: %v", err)
	}
	if err := b.Put(ctx, "k1", []byte("again"), 1); CodeOf(err) != ObjectAlreadyExists {
		t.Fatalf("a second put of k1: %v", err)
	}
	if ok, err := b.Exist(ctx, "k2"); err != nil || !ok {
		t.Fatalf("exist k2: %v %v", ok, err)
	}
	if n, err := b.Size(ctx, "k2"); err != nil || n != n2 {
		t.Fatalf("size of k2: %d %v", n, err)
	}
	small := make([]byte, 10)
	if _, err := b.GetInto(ctx, "k2", small); CodeOf(err) != BufferOverflow {
		t.Fatalf("get into a short buffer: %v", err)
	}
	// a dies.
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	got, err = b.Get(ctx, "k1")
	if err != nil || !bytes.Equal(got, pattern(1, n1)) {
		t.Fatalf("k1 after a died (b holds a replica): %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := b.Get(ctx, "k2")
		if err == nil {
			t.Fatalf("a get of an object only a dead client held returned %d bytes", len(got))
		}
		if c := CodeOf(err); c != TransferFail && c != ObjectNotFound {
			t.Fatalf("get of k2 after a died: %v", err)
		}
		if CodeOf(err) == ObjectNotFound && errors.Is(err, status.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("k2 still listed %v after a died: %v", 10*time.Second, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if s := m.Stats(); s.Segments != 1 || s.Objects != 1 {
		t.Fatalf("the pool after a died: %+v", s)
	}
}
