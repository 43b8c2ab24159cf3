package storetest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/status"
)

// childEnv marks a re-executed test binary that is to serve a store (its value: the world size).
const childEnv = "HMC_STORETEST_SERVER"

// ServeIfChild makes this process an embedded store server, printing its URL and serving
// until killed, when SpawnServer started it; otherwise it returns at once. A package whose
// tests use SpawnServer calls it first thing in TestMain.
func ServeIfChild() {
	v, ok := os.LookupEnv(childEnv)
	if !ok {
		return
	}
	world, _ := strconv.Atoi(v)
	srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{WorldSize: world})
	if err != nil {
		fmt.Println("FAIL", err)
		os.Exit(1)
	}
	fmt.Println("URL", srv.URL())
	select {} // until killed
}

// Server is a store server in a process of its own, for tests that kill it.
type Server struct {
	URL string
	cmd *exec.Cmd
}

// SpawnServer starts a store server for world ranks (0: any) in a process of its own: this
// test binary, re-executed (its TestMain calls ServeIfChild). Cleanup kills it.
func SpawnServer(t testing.TB, world int) *Server {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+strconv.Itoa(world))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &Server{cmd: cmd}
	t.Cleanup(s.Kill)
	line := make(chan string, 1)
	go func() { l, _ := bufio.NewReader(out).ReadString('\n'); line <- l }()
	select {
	case l := <-line:
		if !strings.HasPrefix(l, "URL ") {
			t.Fatalf("store process said %q", l)
		}
		s.URL = strings.TrimSpace(strings.TrimPrefix(l, "URL "))
	case <-time.After(30 * time.Second):
		t.Fatal("the store process did not start")
	}
	return s
}

// Kill kills the server's process with SIGKILL (no goodbye to its clients) and reaps it.
func (s *Server) Kill() {
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
}

// AfterKill checks an operation that needs the store (op: a barrier), run after the test
// killed the store: it must fail with ErrIO or a timeout within 2 s (and little more), or, when
// survives (one member of a 3-member etcd cluster was killed, not the store), succeed within
// 30 s while etcd elects a new leader. It returns a line for the log, or what went wrong.
func AfterKill(ctx context.Context, survives bool, op func(context.Context) error) (string, error) {
	d := 2 * time.Second
	if survives {
		d = 30 * time.Second
	}
	octx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	start := time.Now()
	err := op(octx)
	took := time.Since(start)
	switch {
	case survives && err != nil:
		return "", fmt.Errorf("after one etcd member died: %w (after %v)", err, took)
	case !survives && !errors.Is(err, store.ErrIO) && !errors.Is(err, status.ErrTimeout):
		return "", fmt.Errorf("without the store: %v, want store.ErrIO or a timeout", err)
	case took > d+2*time.Second:
		return "", fmt.Errorf("without the store: failed after %v", took)
	}
	return fmt.Sprintf("%v after %v", err, took.Round(time.Millisecond)), nil
}
