package bm

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/coord/store/storetest"
	"github.com/hmc-go/hmc/internal/childtest"
	"github.com/hmc-go/hmc/internal/etcdtest"
	"github.com/hmc-go/hmc/internal/netnstest"
	"github.com/hmc-go/hmc/memory"
)

type proc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines <-chan string
}

func spawn(t *testing.T, url, mode string, world int, env ...string) *proc {
	t.Helper()
	return spawnCmd(t, exec.Command(os.Args[0], "-test.run=^$"), url, mode, world, env...)
}

// spawnCmd is spawn of cmd, this test binary run some way (in a network namespace).
func spawnCmd(t *testing.T, cmd *exec.Cmd, url, mode string, world int, env ...string) *proc {
	t.Helper()
	stdin, lines := childtest.Start(t, cmd, 64, append(env, "HMC_BM_CHILD="+mode, "HMC_STORE_URL="+url, fmt.Sprintf("HMC_WORLD=%d", world))...)
	return &proc{cmd: cmd, stdin: stdin, lines: lines}
}

// expect waits for a line starting with prefix, failing on FAIL lines and on timeout.
func (p *proc) expect(t *testing.T, prefix string, within time.Duration) string {
	t.Helper()
	timer := time.NewTimer(within)
	defer timer.Stop()
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				t.Fatalf("child exited before %q", prefix)
			}
			t.Logf("child: %s", l)
			if strings.HasPrefix(l, prefix) {
				return l
			}
			if strings.HasPrefix(l, "FAIL") {
				t.Fatalf("child: %s", l)
			}
		case <-timer.C:
			t.Fatalf("no %q within %v", prefix, within)
		}
	}
}

func listen(t *testing.T, world int) *store.Server {
	srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{WorldSize: world})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv
}

// A copy to a rank that has not joined yet waits for it (ranks start in any order) and runs
// once it has, bytes checked by both; one to a rank that never joins fails at the control
// timeout saying "rank 1 has not joined", not "peer closed".
func TestCopyBeforeJoin(t *testing.T) {
	srv := listen(t, 2)
	p0 := spawn(t, srv.URL(), "early", 2, "HMC_BM_RANK=0", "HMC_BM_OPS=tcp")
	p0.expect(t, "WRITING", 60*time.Second)
	time.Sleep(time.Second) // the write waits meanwhile
	p1 := spawn(t, srv.URL(), "late", 2, "HMC_BM_RANK=1", "HMC_BM_OPS=tcp")
	l := p0.expect(t, "WROTE", 60*time.Second)
	var took float64
	if _, err := fmt.Sscanf(l, "WROTE %f", &took); err != nil || took < 0.9 {
		t.Fatalf("%q: the write did not wait for the join", l)
	}
	p1.expect(t, "CHECKED", 60*time.Second)

	srv2 := listen(t, 2)
	p := spawn(t, srv2.URL(), "never", 2, "HMC_BM_RANK=0", "HMC_BM_OPS=tcp", "HMC_BM_CTL=2s")
	l = p.expect(t, "NOTJOINED", 30*time.Second)
	if _, err := fmt.Sscanf(l, "NOTJOINED %f", &took); err != nil || took < 1.5 || took > 6 {
		t.Fatalf("%q: want a failure after about the 2 s control timeout", l)
	}
}

// Every copy type between 8 processes (4 with -short), byte-checked, over TCP only, shared
// memory (slices mapped at their GVAs), and a mix of tags where only some pairs share memory;
// with emulated GPU memory so the HBM paths run too.
func TestProcessesCopy(t *testing.T) {
	world := 8
	if testing.Short() {
		world = 4
	}
	for _, ops := range []string{"tcp", "shm", "mixed"} {
		t.Run(ops, func(t *testing.T) {
			srv := listen(t, world)
			ps := make([]*proc, world)
			for i := range ps {
				ps[i] = spawn(t, srv.URL(), "copies", world, "HMC_BM_OPS="+ops, memory.EmulateGPUEnv+"=1")
			}
			var wg sync.WaitGroup
			for _, p := range ps {
				wg.Add(1)
				go func() {
					defer wg.Done()
					p.expect(t, "OK", 90*time.Second)
					if err := p.cmd.Wait(); err != nil {
						t.Errorf("child: %v", err)
					}
				}()
			}
			wg.Wait()
		})
	}
}

// A rank killed mid-job: copies to it fail with ErrRankDown (not a hang) on every survivor; it
// restarts under the same rank, rejoins, and is reachable again without restarting anyone.
func TestProcessesCrashAndRejoin(t *testing.T) {
	const world = 3
	srv := listen(t, world)
	var survivors []*proc
	for r := range world - 1 {
		survivors = append(survivors, spawn(t, srv.URL(), "survivor", world, fmt.Sprintf("HMC_BM_RANK=%d", r), "HMC_BM_OPS=shm"))
	}
	victim := spawn(t, srv.URL(), "victim", world, fmt.Sprintf("HMC_BM_RANK=%d", world-1), "HMC_BM_OPS=shm")
	victim.expect(t, "READY", 60*time.Second)
	for _, p := range survivors {
		p.expect(t, "READY", 60*time.Second)
	}
	_ = victim.cmd.Process.Kill()
	_ = victim.cmd.Wait()
	for _, p := range survivors {
		p.expect(t, "DOWN", 40*time.Second)
	}
	again := spawn(t, srv.URL(), "rejoiner", world, fmt.Sprintf("HMC_BM_RANK=%d", world-1), "HMC_BM_OPS=shm")
	again.expect(t, "JOINED", 60*time.Second)
	for _, p := range survivors {
		p.expect(t, "BACK", 60*time.Second)
	}
	for _, p := range survivors {
		_, _ = io.WriteString(p.stdin, "exit\n")
		if err := p.cmd.Wait(); err != nil {
			t.Errorf("survivor: %v", err)
		}
	}
	_ = again.cmd.Process.Kill()
}

// The store killed with SIGKILL while 3 ranks (two sharing memory, one over TCP) copy to and
// from each other: copies do not need the store, so every one before, during and after its
// death completes and is checked byte for byte; a barrier, which does need it, fails with a
// typed error within its deadline; and the ranks close and exit without hanging.
func TestStoreKilledMidCopies(t *testing.T) {
	const world = 3
	srv := storetest.SpawnServer(t, world)
	runOutliveStore(t, srv.URL, world, srv.Kill)
}

// The leader of a 3-member etcd cluster killed while the ranks copy: every copy completes,
// checked, and the barrier after it succeeds on the other two members.
func TestEtcdLeaderKilledMidCopies(t *testing.T) {
	const world = 3
	cl := etcdtest.Start(t, 3)
	runOutliveStore(t, cl.URL("bm-leader"), world, func() {
		name, err := cl.KillLeader()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("killed the etcd leader %s", name)
	}, "HMC_BM_STORE_SURVIVES=1")
}

// runOutliveStore runs world ranks in mode storekill against the store at url, kills it (kill)
// once they copy, and waits until each has checked its copies and the barrier after.
func runOutliveStore(t *testing.T, url string, world int, kill func(), env ...string) {
	ps := make([]*proc, world)
	for r := range ps {
		ps[r] = spawn(t, url, "storekill", world, append(env, fmt.Sprintf("HMC_BM_RANK=%d", r), "HMC_BM_OPS=mixed")...)
	}
	for _, p := range ps {
		p.expect(t, "RUNNING", 60*time.Second)
	}
	kill()
	say := func(what string) {
		t.Helper()
		for _, p := range ps {
			if _, err := io.WriteString(p.stdin, what+"\n"); err != nil {
				t.Fatal(err)
			}
		}
	}
	say("killed")
	for _, p := range ps {
		p.expect(t, "OK", 60*time.Second)
	}
	say("exit")
	for _, p := range ps {
		exited := make(chan error, 1)
		go func() { exited <- p.cmd.Wait() }()
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("child: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a rank does not exit without the store")
		}
	}
}

// A rank on another host (a network namespace) cut off from the others and the store (link
// down) for longer than the store's link timeout, while every rank copies to every other:
// copies to and from it fail with typed errors within their deadline, copies between the
// others never fail; when the link is back it takes its rank back by itself (its store client
// dials again), rejoins, and copies to and from it are checked byte for byte again.
func TestPartitionedRankRejoins(t *testing.T) {
	const world, cut = 3, 2
	ns := netnstest.New(t)
	srv, err := store.Listen("tcp://"+ns.HostIP+":0", store.ServerConfig{WorldSize: world, LinkTimeout: 4 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	env := func(r int, bind string) []string {
		return []string{fmt.Sprintf("HMC_BM_RANK=%d", r), "HMC_BM_OPS=tcp", "HMC_BM_BIND=" + bind, fmt.Sprintf("HMC_BM_CUT=%d", cut)}
	}
	var ps []*proc
	for r := range world - 1 {
		ps = append(ps, spawn(t, srv.URL(), "partition", world, env(r, ns.HostIP)...))
	}
	ps = append(ps, spawnCmd(t, ns.Command(os.Args[0], "-test.run=^$"), srv.URL(), "partition", world, env(cut, ns.NSIP)...))
	for _, p := range ps {
		p.expect(t, "ALL", 60*time.Second)
	}
	relink := ns.Partition(t)
	start := time.Now()
	for _, p := range ps {
		p.expect(t, "PART", 10*time.Second)
	}
	time.Sleep(time.Until(start.Add(6 * time.Second))) // past the store's 4 s link timeout
	relink()
	start = time.Now()
	for _, p := range ps {
		p.expect(t, "ALL", 60*time.Second)
	}
	t.Logf("every rank copies to every other again %v after the heal", time.Since(start).Round(time.Millisecond))
	for _, p := range ps {
		if _, err := io.WriteString(p.stdin, "exit\n"); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range ps {
		if err := p.cmd.Wait(); err != nil {
			t.Errorf("rank: %v", err)
		}
	}
}
