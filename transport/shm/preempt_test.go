package shm

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// preemptChild, run when HMC_SHM_PREEMPT_CHILD=1 (with asynchronous preemption off), copies
// with helpers while another goroutine collects garbage without pause, and prints OK.
func preemptChild() {
	tr, err := New(Config{})
	if err != nil {
		fmt.Println("ERR", err)
		return
	}
	cfg := tr.cfg
	ep := &endpoint{cfg: cfg, helpers: newHelpers(3, cfg.HelperSpin)}
	defer ep.helpers.close()
	src, dst := bytes.Repeat([]byte{7}, 16<<20), make([]byte, 16<<20)
	var stop atomic.Bool
	go func() {
		for !stop.Load() {
			runtime.GC()
		}
	}()
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); {
		clear(dst)
		ep.copy(dst, src)
		if !bytes.Equal(dst, src) {
			fmt.Println("ERR copy differs")
			return
		}
	}
	stop.Store(true)
	fmt.Println("OK")
}

// A parallel copy never relies on asynchronous preemption: its caller's wait for pieces claimed
// by helpers must let a helper that the GC stopped mid-piece run again. Go drops async
// preemption for good on a C thread that catches the signal while back in C (libhmc.so called
// from Python: the bench hung in about one run of ten); GODEBUG=asyncpreemptoff=1 recreates it.
func TestCopyWithoutAsyncPreemption(t *testing.T) {
	if testing.Short() {
		t.Skip("2 s of copying")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "HMC_SHM_PREEMPT_CHILD=1", "GODEBUG=asyncpreemptoff=1", "GOMAXPROCS=2")
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatal("the copy hung: a helper stopped by the GC never got its P back")
	}
	if err != nil || !bytes.Equal(bytes.TrimSpace(out), []byte("OK")) {
		t.Fatalf("child: %v: %s", err, out)
	}
}
