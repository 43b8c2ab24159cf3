package shmem

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/coord/store/storetest"
	"github.com/hmc-go/hmc/internal/childtest"
	"github.com/hmc-go/hmc/internal/etcdtest"
	"github.com/hmc-go/hmc/internal/netnstest"
	"github.com/hmc-go/hmc/status"
)

func TestMain(m *testing.M) {
	storetest.ServeIfChild()
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
		cfg := DefaultConfig()
		cfg.World, cfg.Rank = c[0], c[1]
		if _, err := Init(ctx, "tcp://127.0.0.1:0", cfg); !errors.Is(err, status.ErrInvalidConfig) {
			t.Errorf("world %d rank %d: %v", c[0], c[1], err)
		}
	}
	w, err := Init(ctx, "tcp://127.0.0.1:0", DefaultConfig())
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

// A Create that fails once the heap is under way (here: the other rank never comes, and the
// deadline ends the barrier) returns a typed error, frees the id, and leaves nothing behind.
func TestCreateFailsCleanly(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := DefaultConfig()
	cfg.World = 2
	w, err := Init(ctx, "tcp://127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for range 2 { // the id is free again after a failure
		cctx, ccancel := context.WithTimeout(ctx, 300*time.Millisecond)
		h, err := w.Create(cctx, 3, 2<<20)
		ccancel()
		if h != nil || !errors.Is(err, status.ErrTimeout) {
			t.Fatalf("create without the other rank: %v %v, want ErrTimeout", h, err)
		}
	}
}

// The store killed with SIGKILL while 4 ranks (even ones mapping each other's blocks, odd ones
// over TCP) put, get, add atomically and meet at heap barriers: none of these needs the store,
// so every one before, during and after its death completes, value- and byte-checked; a control
// barrier, which does need it, fails with a typed error within its deadline; the ranks exit
// without hanging.
func TestStoreKilledMidRMA(t *testing.T) {
	srv := storetest.SpawnServer(t, 4)
	runOutliveStore(t, srv.URL, 4, srv.Kill)
}

// The leader of a 3-member etcd cluster killed while the ranks work: every operation completes,
// checked, and the control barrier after it succeeds on the other two members.
func TestEtcdLeaderKilledMidRMA(t *testing.T) {
	cl := etcdtest.Start(t, 3)
	runOutliveStore(t, cl.URL("shmem-leader"), 4, func() {
		name, err := cl.KillLeader()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("killed the etcd leader %s", name)
	}, "HMC_SHMEM_STORE_SURVIVES=1")
}

// runOutliveStore runs world ranks in mode storekill against the store at url, kills it (kill)
// once they work, and waits until each has checked its operations and the control barrier.
func runOutliveStore(t *testing.T, url string, world int, kill func(), env ...string) {
	runFault(t, "storekill", url, world, func([]*exec.Cmd) { kill() }, env...)
}

// A rank killed with SIGKILL (reached by the others over TCP): a put, a get, a fetch-add and a
// heap barrier involving it fail with a typed error within their deadline on every survivor,
// which go on working among themselves, checked.
func TestRankKilledMidRMA(t *testing.T) {
	srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{WorldSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	runFault(t, "rankkill", srv.URL(), 4, func(cmds []*exec.Cmd) {
		_ = cmds[3].Process.Kill()
		_ = cmds[3].Wait()
	})
}

// runFault runs world ranks in mode (storekill, rankkill) against the store at url; once all
// say RUNNING it calls fault, tells them "killed", waits for OK from every rank still running,
// then tells them "exit" and wants each to exit cleanly.
func runFault(t *testing.T, mode, url string, world int, fault func([]*exec.Cmd), env ...string) {
	ranks := make([]*rankProc, world)
	for r := range ranks {
		ranks[r] = startRank(t, exec.Command(os.Args[0], "-test.run=^$"), append([]string{"HMC_SHMEM_CHILD=" + mode,
			"HMC_SHMEM_OPS=mixed", "HMC_STORE_URL=" + url, fmt.Sprintf("HMC_WORLD=%d", world), fmt.Sprintf("HMC_RANK=%d", r)}, env...)...)
	}
	for r, rk := range ranks {
		rk.expect(t, r, "RUNNING")
	}
	cmds := make([]*exec.Cmd, world)
	for r, rk := range ranks {
		cmds[r] = rk.cmd
	}
	fault(cmds)
	var live []*rankProc
	for _, rk := range ranks {
		if rk.cmd.ProcessState == nil { // not killed and reaped by fault
			live = append(live, rk)
		}
	}
	ranks = live
	sayAll(t, ranks, "killed")
	for r, rk := range ranks {
		rk.expect(t, r, "OK")
	}
	sayAll(t, ranks, "exit")
	waitExit(t, ranks)
}

// rankProc is a rank in its own process, told what to do next on stdin.
type rankProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines <-chan string
}

// startRank starts cmd (this test binary, run some way) with env added; Cleanup kills it.
func startRank(t *testing.T, cmd *exec.Cmd, env ...string) *rankProc {
	t.Helper()
	stdin, lines := childtest.Start(t, cmd, 16, env...)
	return &rankProc{cmd: cmd, stdin: stdin, lines: lines}
}

// expect reads rank r's lines until one starts with prefix; FAIL, its exit or 90 s first fail
// the test.
func (rk *rankProc) expect(t *testing.T, r int, prefix string) {
	t.Helper()
	timeout := time.After(90 * time.Second)
	for {
		select {
		case l, ok := <-rk.lines:
			if !ok {
				t.Fatalf("rank %d exited before %q", r, prefix)
			}
			t.Logf("rank %d: %s", r, l)
			if strings.HasPrefix(l, "FAIL") {
				t.Fatalf("rank %d: %s", r, l)
			}
			if strings.HasPrefix(l, prefix) {
				return
			}
		case <-timeout:
			t.Fatalf("rank %d: no %q within 90 s", r, prefix)
		}
	}
}

// sayAll tells every rank what (a line on its stdin).
func sayAll(t *testing.T, ranks []*rankProc, what string) {
	t.Helper()
	for _, rk := range ranks {
		if _, err := io.WriteString(rk.stdin, what+"\n"); err != nil {
			t.Fatal(err)
		}
	}
}

// waitExit wants every rank to exit cleanly within 30 s.
func waitExit(t *testing.T, ranks []*rankProc) {
	t.Helper()
	for r, rk := range ranks {
		exited := make(chan error, 1)
		go func() { exited <- rk.cmd.Wait() }()
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("rank %d: %v", r, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("rank %d does not exit", r)
		}
	}
}

// Faults on the link of a rank on another host (a network namespace; every rank reaches the
// others over TCP), in lockstep phases: delay with jitter, loss and reordering (every put, get,
// fetch-add and heap barrier completes, checked); the link down (operations with that rank
// fail typed within their deadline, those among the others succeed); the link back (checked
// rounds with everyone, on the same connections).
func TestNetworkFaults(t *testing.T) {
	const world = 4
	ns := netnstest.New(t)
	srv, err := store.Listen("tcp://"+ns.HostIP+":0", store.ServerConfig{WorldSize: world})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	var ranks []*rankProc
	for r := range world {
		cmd, bind := exec.Command(os.Args[0], "-test.run=^$"), ns.HostIP
		if r == world-1 {
			cmd, bind = ns.Command(os.Args[0], "-test.run=^$"), ns.NSIP
		}
		ranks = append(ranks, startRank(t, cmd, "HMC_SHMEM_CHILD=netfault", "HMC_SHMEM_OPS=tcp", "HMC_STORE_URL="+srv.URL(),
			"HMC_SHMEM_BIND="+bind, fmt.Sprintf("HMC_WORLD=%d", world), fmt.Sprintf("HMC_RANK=%d", r)))
	}
	all := func(prefix string) {
		t.Helper()
		for r, rk := range ranks {
			rk.expect(t, r, prefix)
		}
	}
	say := func(what string) { t.Helper(); sayAll(t, ranks, what) }
	all("READY")
	heal := ns.Impair(t, netnstest.Impairment{Delay: 2 * time.Millisecond, Jitter: 2 * time.Millisecond, Loss: 0.02, Reorder: 0.1})
	say("impaired")
	all("IMPAIRED")
	heal()
	relink := ns.Partition(t)
	say("cut")
	all("CUT")
	relink()
	say("healed")
	all("OK")
	say("exit")
	waitExit(t, ranks)
}
