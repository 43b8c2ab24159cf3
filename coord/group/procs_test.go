package group_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hmc-go/hmc/coord/group"
	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/internal/etcdtest"
	"github.com/hmc-go/hmc/internal/netnstest"
)

type proc struct {
	cmd *exec.Cmd
	out *bufio.Scanner
}

func spawn(t *testing.T, url, mode string, world int, env ...string) *proc {
	return spawnCmd(t, exec.Command(os.Args[0], "-test.run=^$"), url, mode, world, env...)
}

// spawnCmd is spawn of cmd, this test binary run some way (in a network namespace).
func spawnCmd(t *testing.T, cmd *exec.Cmd, url, mode string, world int, env ...string) *proc {
	cmd.Env = append(os.Environ(), "HMC_GROUP_CHILD="+mode, "HMC_STORE_URL="+url, fmt.Sprintf("HMC_WORLD=%d", world))
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return &proc{cmd, bufio.NewScanner(out)}
}

func (p *proc) line() string {
	if p.out.Scan() {
		return p.out.Text()
	}
	return ""
}

// Many processes (64 in the full run, 16 with -short) do barriers and allgathers through the
// embedded store.
func TestManyProcesses(t *testing.T) {
	world := 64
	if testing.Short() {
		world = 16
	}
	srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{WorldSize: world})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ps := make([]*proc, world)
	for i := range ps {
		ps[i] = spawn(t, srv.URL(), "rounds", world)
	}
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := p.line()
			if err := p.cmd.Wait(); err != nil || !strings.HasPrefix(l, "OK") {
				t.Errorf("member: %q %v", l, err)
			}
		}()
	}
	wg.Wait()
}

// A member killed with SIGKILL turns the others' barrier into an error naming its rank: on the
// embedded store through its link's end, on etcd through its lease's expiry.
func TestProcessKilledMidBarrier(t *testing.T) {
	t.Run("embedded", func(t *testing.T) {
		srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{WorldSize: 4})
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		killMidBarrier(t, srv.URL())
	})
	t.Run("etcd", func(t *testing.T) {
		killMidBarrier(t, etcdtest.Start(t, 1).URL("killed"))
	})
}

func killMidBarrier(t *testing.T, url string) {
	const world = 4
	victim := spawn(t, url, "die", world)
	var others []*proc
	for range world - 1 {
		others = append(others, spawn(t, url, "survive", world))
	}
	l := victim.line()
	var dead int
	if _, err := fmt.Sscanf(l, "READY %d", &dead); err != nil {
		t.Fatalf("victim: %q", l)
	}
	for _, p := range others {
		if l := p.line(); !strings.HasPrefix(l, "READY") {
			t.Fatalf("member: %q", l)
		}
	}
	time.Sleep(200 * time.Millisecond) // the others are in their second barrier
	start := time.Now()
	_ = victim.cmd.Process.Kill()
	want := fmt.Sprintf("member rank %d is down", dead)
	for _, p := range others {
		if l := p.line(); !strings.Contains(l, want) {
			t.Fatalf("survivor: %q, want %q", l, want)
		}
	}
	t.Logf("survivors saw rank %d down %v after SIGKILL", dead, time.Since(start))
}

// A process killed right after its join is removed from the view by the survivors.
func TestProcessKilledAfterJoin(t *testing.T) {
	srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{WorldSize: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	var gs []*group.Group
	for range 2 {
		c := mustOpen(t, srv.URL(), store.Config{Ranking: store.Auto, WorldSize: 8})
		g := newGroup(t, c, "dyn", group.Config{})
		if _, err := g.Join(ctx(t)); err != nil {
			t.Fatal(err)
		}
		gs = append(gs, g)
	}
	p := spawn(t, srv.URL(), "join", 8)
	var r int
	if l := p.line(); !strings.HasPrefix(l, "JOINED") {
		t.Fatalf("child: %q", l)
	} else {
		_, _ = fmt.Sscanf(l, "JOINED %d", &r)
	}
	for _, g := range gs {
		if _, err := g.WaitView(ctx(t), func(v group.View) bool { return v.Has(r) }); err != nil {
			t.Fatal(err)
		}
	}
	_ = p.cmd.Process.Kill()
	for _, g := range gs {
		v, err := g.WaitView(ctx(t), func(v group.View) bool { return !v.Has(r) })
		if err != nil {
			t.Fatal(err)
		}
		if v.Size() != 2 {
			t.Fatalf("view after the death: %+v", v)
		}
	}
	all(t, 2, func(i int) error { return gs[i].Barrier(ctx(t)) })
}

// expect reads the member's lines until one starts with prefix; FAIL, the end of its output or
// within passing first fail the test.
func (p *proc) expect(t *testing.T, prefix string, within time.Duration) {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		for {
			l := p.line()
			t.Logf("member (pid %d): %s", p.cmd.Process.Pid, l)
			if l == "" || strings.HasPrefix(l, prefix) || strings.HasPrefix(l, "FAIL") {
				got <- l
				return
			}
		}
	}()
	select {
	case l := <-got:
		if !strings.HasPrefix(l, prefix) {
			t.Fatalf("member: %q, want %s", l, prefix)
		}
	case <-time.After(within):
		t.Fatalf("member: no %s within %v", prefix, within)
	}
}

// A member on another host (a network namespace) cut off from the store and the others (link
// down) for longer than the store's link timeout: the others' barriers fail with typed errors
// and then, the view shrunk, succeed without it; when the link is back the member joins again
// by itself and every barrier has everyone again. Every barrier ends within its deadline.
func TestPartitionedMemberRejoins(t *testing.T) {
	const world = 4
	ns := netnstest.New(t)
	srv, err := store.Listen("tcp://"+ns.HostIP+":0", store.ServerConfig{WorldSize: world, LinkTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	var ps []*proc
	for r := range world - 1 {
		ps = append(ps, spawn(t, srv.URL(), "partition", world, fmt.Sprintf("HMC_RANK=%d", r)))
	}
	cut := spawnCmd(t, ns.Command(os.Args[0], "-test.run=^$"), srv.URL(), "partition", world, fmt.Sprintf("HMC_RANK=%d", world-1))
	for _, p := range append(ps, cut) {
		p.expect(t, "WHOLE", 30*time.Second)
	}
	relink := ns.Partition(t)
	start := time.Now()
	for _, p := range ps {
		p.expect(t, "SHRUNK", 15*time.Second)
	}
	t.Logf("the others go on without the cut-off member %v after the partition", time.Since(start).Round(time.Millisecond))
	time.Sleep(time.Second)
	relink()
	start = time.Now()
	for _, p := range append(ps, cut) {
		p.expect(t, "WHOLE", 30*time.Second)
	}
	t.Logf("every barrier has all %d members %v after the heal", world, time.Since(start).Round(time.Millisecond))
}

// A member frozen (SIGSTOP) for longer than its liveness allows — its etcd lease expires, or
// the embedded store drops its silent link — is taken for dead: the others go on without it.
// Thawed, it takes its rank back by itself (a new lease, or a new link) and joins again, and
// every barrier has everyone again; killed then, it is taken for dead again (its liveness is
// watched again, not only its membership restored).
func TestFrozenMemberRejoins(t *testing.T) {
	t.Run("embedded", func(t *testing.T) {
		srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{WorldSize: 3, LinkTimeout: 500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		frozenRejoins(t, srv.URL(), 1500*time.Millisecond)
	})
	t.Run("etcd", func(t *testing.T) {
		frozenRejoins(t, etcdtest.Start(t, 1).URL("frozen"), 4*time.Second) // the lease lives 2 s
	})
}

func frozenRejoins(t *testing.T, url string, freeze time.Duration) {
	const world = 3
	var ps []*proc
	for r := range world - 1 {
		ps = append(ps, spawn(t, url, "partition", world, fmt.Sprintf("HMC_RANK=%d", r)))
	}
	frozen := spawn(t, url, "partition", world, fmt.Sprintf("HMC_RANK=%d", world-1), "HMC_GROUP_FROZEN=1")
	for _, p := range append(ps, frozen) {
		p.expect(t, "WHOLE", 30*time.Second)
	}
	if err := frozen.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for _, p := range ps {
		p.expect(t, "SHRUNK", 15*time.Second)
	}
	t.Logf("the others go on without the frozen member %v after it stopped", time.Since(start).Round(time.Millisecond))
	time.Sleep(time.Until(start.Add(freeze)))
	if err := frozen.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	for _, p := range append(ps, frozen) {
		p.expect(t, "WHOLE", 30*time.Second)
	}
	t.Logf("every barrier has all %d members %v after the thaw", world, time.Since(start).Round(time.Millisecond))
	// Its liveness is watched again: killed now, it is taken for dead again.
	_ = frozen.cmd.Process.Kill()
	start = time.Now()
	for _, p := range ps {
		p.expect(t, "SHRUNK", 15*time.Second)
	}
	t.Logf("killed after the thaw, it is gone from the view %v later", time.Since(start).Round(time.Millisecond))
}
