package storetest

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hmc-go/hmc/coord/store"
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
