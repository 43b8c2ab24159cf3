package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hmc-go/hmc/auth/authtest"
)

// TestMain lets the test binary stand in for hmc in child processes (`hmc bench` starts its
// server as a child of os.Executable()).
func TestMain(m *testing.M) {
	if os.Getenv("HMC_TEST_AS_HMC") == "1" {
		os.Args = append([]string{"hmc"}, os.Args[1:]...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func writeSecret(t *testing.T, s string) string {
	path := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(path, []byte(s+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Two processes, the server a child with credentials: the client with the same ones moves
// and verifies bytes over tcp (secret, then secret and mutual TLS) and shm (secret).
func TestBenchAuthenticated(t *testing.T) {
	t.Setenv("HMC_TEST_AS_HMC", "1")
	sec := writeSecret(t, "job-42 secret")
	p := authtest.NewPKI(t)
	cert, key, ca := p.Files(t, t.TempDir(), "rank")
	for _, c := range []struct {
		tr   string
		auth []string
	}{
		{"tcp", []string{"--secret-file", sec}},
		{"tcp", []string{"--secret-file", sec, "--tls-cert", cert, "--tls-key", key, "--tls-ca", ca}},
		{"shm", []string{"--secret-file", sec}},
	} {
		args := append([]string{"bench", "--transport", c.tr, "--sizes", "4KiB,1MiB", "--iters", "20", "--verify", "--quiet"}, c.auth...)
		out, err := run(t, args...)
		if err != nil || !strings.Contains(out, "1MiB") {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
}

// A server child demanding a secret refuses clients (other processes) with another secret,
// none, or TLS it does not run, with a permission error on the client; a client with the
// secret still gets through afterwards.
func TestBenchRefusesWrongCredentials(t *testing.T) {
	t.Setenv("HMC_TEST_AS_HMC", "1")
	sec, other := writeSecret(t, "job-42 secret"), writeSecret(t, "a guess")
	p := authtest.NewPKI(t)
	cert, key, ca := p.Files(t, t.TempDir(), "rank")
	for _, tr := range []string{"tcp", "shm"} {
		t.Run(tr, func(t *testing.T) {
			exe, _ := os.Executable()
			port, ctrlPort := startBenchServer(t, exec.Command(exe, "bench", "server", "--transport", tr, "--data-port", "0", "--ctrl-port", "0", "--buffer", "4MiB", "--keep-serving", "--secret-file", sec))()
			client := func(auth ...string) (string, error) {
				return run(t, append([]string{"bench", "client", "--transport", tr, "--data-port", port, "--ctrl-port", fmt.Sprint(ctrlPort),
					"--sizes", "4KiB", "--iters", "5", "--verify", "--quiet"}, auth...)...)
			}
			for name, a := range map[string][]string{
				"another secret": {"--secret-file", other},
				"none":           nil,
				"TLS as well":    {"--secret-file", sec, "--tls-cert", cert, "--tls-key", key, "--tls-ca", ca},
			} {
				out, err := client(a...)
				if err == nil || !strings.Contains(err.Error(), "permission denied") {
					t.Fatalf("%s: %v\n%s", name, err, out)
				}
				t.Logf("%s: %v", name, err)
			}
			if out, err := client("--secret-file", sec); err != nil {
				t.Fatalf("right secret after the refusals: %v\n%s", err, out)
			}
		})
	}
}

// startBenchServer starts srv, an `hmc bench server ... --keep-serving` of the test binary (the
// caller sets HMC_TEST_AS_HMC=1 in its environment), and returns next, which waits for the
// server's next READY line and gives its data and control ports: after each client that ran,
// the server starts again on fresh ports and says READY again.
func startBenchServer(t *testing.T, srv *exec.Cmd) (next func() (dataPort string, ctrlPort int)) {
	t.Helper()
	out, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	srv.Stderr = os.Stderr
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	ready := make(chan string, 1)
	go func() { // ends when the server's stdout closes
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "READY ") {
				ready <- sc.Text()
			}
		}
	}()
	return func() (string, int) {
		t.Helper()
		var addr string
		var ctrlPort int
		select {
		case l := <-ready:
			if _, err := fmt.Sscanf(l, "READY %s %d", &addr, &ctrlPort); err != nil {
				t.Fatal(l, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("bench server did not start")
		}
		return addr[strings.LastIndex(addr, ":")+1:], ctrlPort
	}
}
