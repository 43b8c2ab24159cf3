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

	"github.com/hmc-go/hmc/fabric/store"
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

// A member killed with SIGKILL turns the others' barrier into an error naming its rank.
func TestProcessKilledMidBarrier(t *testing.T) {
	const world = 4
	srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{WorldSize: world})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	victim := spawn(t, srv.URL(), "die", world)
	var others []*proc
	for range world - 1 {
		others = append(others, spawn(t, srv.URL(), "survive", world))
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
	_ = victim.cmd.Process.Kill()
	want := fmt.Sprintf("member rank %d is down", dead)
	for _, p := range others {
		if l := p.line(); !strings.Contains(l, want) {
			t.Fatalf("survivor: %q, want %q", l, want)
		}
	}
}
