package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

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
	server := startBenchServer(t, srv)
	// Each client gets a fresh server on fresh ports (--keep-serving says READY again).
	next := func() []string {
		port, ctrlPort := server()
		return []string{"bench", "client", "--server-ip", ns.NSIP, "--data-port", port,
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
