package spinread

import (
	"errors"
	"github.com/hmc-go/hmc/internal/sockpair"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

func pair(t *testing.T, network string) (a, b net.Conn) { return sockpair.New(t, network) }

// TestReads: a spinning reader returns what was sent (sent before the read and while it
// spins or sleeps), a read deadline in the past interrupts a parked read with
// os.ErrDeadlineExceeded, and the peer's close reads as io.EOF.
func TestReads(t *testing.T) {
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			a, b := pair(t, network)
			r, ok := NewReader(b, 50*time.Microsecond)
			if !ok {
				t.Fatal("no spinning reader for a socket")
			}
			buf := make([]byte, 16)
			if _, err := a.Write([]byte("first")); err != nil {
				t.Fatal(err)
			}
			if n, err := io.ReadAtLeast(r, buf, 5); err != nil || string(buf[:n]) != "first" {
				t.Fatalf("read %q, %v", buf[:n], err)
			}
			go func() {
				time.Sleep(20 * time.Millisecond) // past the spin: the read is parked
				_, _ = a.Write([]byte("later"))
			}()
			if n, err := io.ReadAtLeast(r, buf, 5); err != nil || string(buf[:n]) != "later" {
				t.Fatalf("read %q, %v", buf[:n], err)
			}
			go func() {
				time.Sleep(20 * time.Millisecond)
				_ = b.SetReadDeadline(time.Unix(1, 0))
			}()
			if _, err := r.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("read after a past deadline: %v", err)
			}
			_ = b.SetReadDeadline(time.Time{})
			a.Close()
			if _, err := r.Read(buf); err != io.EOF {
				t.Fatalf("read after the peer closed: %v", err)
			}
		})
	}
}

// TestNoSpin: no spin, or no socket, gives the connection itself.
func TestNoSpin(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if r, ok := NewReader(a, time.Millisecond); ok || r != io.Reader(a) {
		t.Error("a pipe has no socket to poll")
	}
	c, _ := pair(t, "tcp")
	if r, ok := NewReader(c, 0); ok || r != io.Reader(c) {
		t.Error("spin 0 should not poll")
	}
}
