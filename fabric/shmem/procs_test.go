package shmem

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/status"
)

func TestMain(m *testing.M) {
	if os.Getenv("HMC_SHMEM_CHILD") != "" {
		os.Exit(child())
	}
	goleak.VerifyTestMain(m)
}

// The OpenSHMEM verification suites' categories (setup, memory, remote RMA, atomics, locks,
// signaling, point-to-point sync, ordering, collectives, teams) across 8 processes (4 with
// -short), every result value- or byte-checked, with co-located blocks mapped (shm), reached
// over TCP only, and a mix.
func TestProcesses(t *testing.T) {
	world := 8
	if testing.Short() {
		world = 4
	}
	for _, ops := range []string{"shm", "tcp", "mixed"} {
		t.Run(ops, func(t *testing.T) {
			srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{WorldSize: world})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			var wg sync.WaitGroup
			for r := range world {
				cmd := exec.Command(os.Args[0], "-test.run=^$")
				cmd.Env = append(os.Environ(), "HMC_SHMEM_CHILD=1", "HMC_SHMEM_OPS="+ops, "HMC_STORE_URL="+srv.URL(),
					fmt.Sprintf("HMC_WORLD=%d", world), fmt.Sprintf("HMC_RANK=%d", r))
				out, err := cmd.StdoutPipe()
				if err != nil {
					t.Fatal(err)
				}
				cmd.Stderr = os.Stderr
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					ok := false
					sc := bufio.NewScanner(out)
					for sc.Scan() {
						l := sc.Text()
						if strings.HasPrefix(l, "FAIL") {
							t.Errorf("rank %d: %s", r, l)
						}
						ok = ok || strings.HasPrefix(l, "OK")
					}
					if err := cmd.Wait(); err != nil || !ok {
						t.Errorf("rank %d: exit %v, OK printed %v", r, err, ok)
					}
				}()
			}
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(150 * time.Second):
				t.Fatal("ranks did not finish")
			}
		})
	}
}

func TestInitAndCreateRejects(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range [][2]int{{0, 0}, {4, 4}, {1025, 0}, {2, -1}} {
		if _, err := Init(ctx, "tcp://127.0.0.1:0", c[0], c[1], 0, DefaultConfig()); !errors.Is(err, status.ErrInvalidConfig) {
			t.Errorf("world %d rank %d: %v", c[0], c[1], err)
		}
	}
	w, err := Init(ctx, "tcp://127.0.0.1:0", 1, 0, 0, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for _, c := range []struct {
		id   int
		size uint64
	}{{64, 2 << 20}, {-1, 2 << 20}, {0, 1 << 20}, {0, 3 << 20}, {0, 8 << 30}} {
		if _, err := w.Create(ctx, c.id, c.size); !errors.Is(err, status.ErrInvalidConfig) {
			t.Errorf("create id %d size %d: %v", c.id, c.size, err)
		}
	}
	h, err := w.Create(ctx, 0, 2<<20)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Create(ctx, 0, 2<<20); !errors.Is(err, status.ErrInvalidConfig) {
		t.Errorf("duplicate heap: %v", err)
	}
	if h.Base() < 40<<40 || h.Ptr(0) == nil || len(h.Local()) != 2<<20 {
		t.Fatalf("layout: base %#x", h.Base())
	}
	if err := h.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
}
