package childtest

import (
	"bufio"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// Start starts cmd (the test binary, run some way) with env added to this process's
// environment and its stderr on ours; t's Cleanup kills it. It returns the child's stdin and
// its stdout lines, a channel of capacity buffered closed when stdout ends.
func Start(t testing.TB, cmd *exec.Cmd, buffered int, env ...string) (stdin io.WriteCloser, lines <-chan string) {
	t.Helper()
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	ch := make(chan string, buffered)
	go func() { // ends when the child's stdout closes
		s := bufio.NewScanner(out)
		for s.Scan() {
			ch <- s.Text()
		}
		close(ch)
	}()
	return stdin, ch
}

// ParentSays returns, in a child, the lines the parent writes on its stdin (what to do next).
// Call it once per process: one goroutine reads stdin.
func ParentSays() <-chan string {
	said := make(chan string, 4)
	go func() {
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			said <- in.Text()
		}
	}()
	return said
}

// FreeAddr returns a loopback TCP address that nobody listens on now, for a child process to
// bind. Its port lies below the kernel's ephemeral range: a port picked by listening on port 0
// and closing comes from that range, where any process's next listener on port 0 or outgoing
// connection may take it before the child binds it (tests in parallel packages do both all
// the time).
func FreeAddr(t testing.TB) string {
	t.Helper()
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				low = v
			}
		}
	}
	const from = 10000
	if low <= from+100 {
		low = 65536 // an unusual range: any free port, as the kernel gives them
	}
	for range 200 {
		port := from + rand.IntN(low-from)
		if low == 65536 {
			port = 0
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		addr := l.Addr().String()
		_ = l.Close()
		return addr
	}
	t.Fatal("no free loopback port below the ephemeral range")
	return ""
}
