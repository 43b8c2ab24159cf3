package group_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hmc-go/hmc/coord/group"
	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/internal/etcdtest"
)

type proc struct {
	cmd *exec.Cmd
	out *bufio.Scanner
}

func spawn(t *testing.T, url, mode string, world int) *proc {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "HMC_GROUP_CHILD="+mode, "HMC_STORE_URL="+url, fmt.Sprintf("HMC_WORLD=%d", world))
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
