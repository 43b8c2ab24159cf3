package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hmc-go/hmc/internal/netnstest"
)

// AUTO between processes of one network namespace takes shared memory, and from another
// namespace (another host as far as the network goes) TCP; the bytes are verified either way.
// The server and the first client run inside the namespace, the second client outside.
func TestAutoInsideAndAcrossNamespaces(t *testing.T) {
	ns := netnstest.New(t)
	exe, _ := os.Executable()
	srv := ns.Command(exe, "bench", "server", "--bind", ns.NSIP, "--data-port", "0", "--ctrl-port", "0",
		"--transport", "auto", "--buffer", "4MiB", "--keep-serving")
	srv.Env = append(os.Environ(), "HMC_TEST_AS_HMC=1")
	out, _ := srv.StdoutPipe()
	srv.Stderr = os.Stderr
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "READY ") {
				ready <- sc.Text()
			}
		}
	}()
	// Each client gets a fresh server on fresh ports (--keep-serving says READY again).
	next := func() []string {
		t.Helper()
		var addr string
		var ctrlPort int
		select {
		case l := <-ready:
			if _, err := fmt.Sscanf(l, "READY %s %d", &addr, &ctrlPort); err != nil {
				t.Fatal(l, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("server in the namespace did not start")
		}
		return []string{"bench", "client", "--server-ip", ns.NSIP, "--data-port", addr[strings.LastIndex(addr, ":")+1:],
			"--ctrl-port", fmt.Sprint(ctrlPort), "--transport", "auto", "--sizes", "1MiB", "--iters", "5", "--verify", "--json", "--quiet"}
	}
	route := func(out []byte) string {
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			var r struct {
				Route    string `json:"route"`
				Verified bool   `json:"verified"`
			}
			if json.Unmarshal([]byte(l), &r) == nil && r.Verified {
				return r.Route
			}
		}
		return "none: " + string(out)
	}
	inside := ns.Command(exe, next()...)
	inside.Env = append(os.Environ(), "HMC_TEST_AS_HMC=1")
	o, err := inside.Output()
	if err != nil {
		t.Fatalf("client inside the namespace: %v\n%s", err, o)
	}
	if r := route(o); r != "shm" {
		t.Fatalf("AUTO inside one namespace took %s, want shm", r)
	}
	o2, err := run(t, next()...)
	if err != nil {
		t.Fatalf("client outside the namespace: %v\n%s", err, o2)
	}
	if r := route([]byte(o2)); r != "tcp" {
		t.Fatalf("AUTO from another namespace took %s, want tcp", r)
	}
}
