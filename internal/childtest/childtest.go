package childtest

import (
	"bufio"
	"io"
	"os"
	"os/exec"
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
