package fdconn

import (
	"bytes"
	"context"
	"errors"
	"github.com/hmc-go/hmc/internal/sockpair"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pair returns a Conn (from the dialled side) and the plain accepted end.
func pair(t *testing.T, network string) (*Conn, net.Conn) {
	t.Helper()
	d, b := sockpair.New(t, network)
	a, err := New(d)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("the original conn after New: %v, want it closed", err)
	}
	t.Cleanup(func() { a.Close() })
	return a, b
}

// TestExchange: bytes both ways, a frame written with WriteBuffers arrives whole and in order,
// a read waits for bytes sent later, the peer's close reads as io.EOF.
func TestExchange(t *testing.T) {
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			a, b := pair(t, network)
			if _, err := a.Write([]byte("hello")); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 5)
			if _, err := io.ReadFull(b, buf); err != nil || string(buf) != "hello" {
				t.Fatalf("peer read %q, %v", buf, err)
			}
			payload := bytes.Repeat([]byte{7}, 1<<20) // more than a socket buffer: the writev waits
			go func() {
				_, _ = a.WriteBuffersContext(context.Background(), [][]byte{[]byte("HDR:"), nil, payload})
			}()
			got := make([]byte, 4+len(payload))
			if _, err := io.ReadFull(b, got); err != nil || string(got[:4]) != "HDR:" || !bytes.Equal(got[4:], payload) {
				t.Fatalf("WriteBuffers: %v", err)
			}
			go func() {
				time.Sleep(20 * time.Millisecond)
				_, _ = b.Write([]byte("later"))
			}()
			if _, err := io.ReadFull(a, buf); err != nil || string(buf) != "later" {
				t.Fatalf("read %q, %v", buf, err)
			}
			b.Close()
			if n, err := a.Read(buf); n != 0 || err != io.EOF {
				t.Fatalf("read after the peer closed: %d, %v", n, err)
			}
		})
	}
}

// TestInterruptions: a deadline set while a read (or write) waits ends it at once with
// os.ErrDeadlineExceeded and nothing consumed; a timed deadline ends it on time; Close ends a
// waiting read with net.ErrClosed.
func TestInterruptions(t *testing.T) {
	a, b := pair(t, "unix")
	buf := make([]byte, 8)
	go func() {
		time.Sleep(20 * time.Millisecond)
		_ = a.SetReadDeadline(time.Unix(1, 0))
	}()
	start := time.Now()
	if _, err := a.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) || time.Since(start) > 2*time.Second {
		t.Fatalf("read with a past deadline set meanwhile: %v after %v", err, time.Since(start))
	}
	_ = a.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
	start = time.Now()
	if _, err := a.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) || time.Since(start) < 25*time.Millisecond {
		t.Fatalf("read with a 30 ms deadline: %v after %v", err, time.Since(start))
	}
	_ = a.SetReadDeadline(time.Time{})
	if _, err := b.Write([]byte("12345678")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(a, buf); err != nil || string(buf) != "12345678" {
		t.Fatalf("read after the deadlines: %q %v", buf, err)
	}

	// A write the peer does not read fills the socket and waits; its deadline ends it (set
	// once the write's first bytes arrived, so the write began before it).
	go func() {
		_, _ = io.ReadFull(b, make([]byte, 1))
		time.Sleep(20 * time.Millisecond)
		_ = a.SetWriteDeadline(time.Unix(1, 0))
	}()
	n, err := a.Write(make([]byte, 64<<20))
	if !errors.Is(err, os.ErrDeadlineExceeded) || n <= 0 || n >= 64<<20 {
		t.Fatalf("write past the socket buffer with a deadline: %d, %v", n, err)
	}

	done := make(chan error, 1)
	go func() {
		_, err := a.Read(make([]byte, 1<<30))
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("read ended by Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end a waiting read")
	}
	if err := a.Close(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := a.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after Close: %v", err)
	}
}

// TestCloseEndsBlockedCalls: Close waits for the calls in progress before it closes the socket
// (they hold their direction's lock); a write blocked on a full socket and a read waiting for
// bytes both end with net.ErrClosed, and Close returns.
func TestCloseEndsBlockedCalls(t *testing.T) {
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			a, b := pair(t, network)
			wrote, read := make(chan error, 1), make(chan error, 1)
			go func() {
				_, err := a.Write(make([]byte, 64<<20)) // the peer never reads
				wrote <- err
			}()
			go func() {
				_, err := a.Read(make([]byte, 16))
				read <- err
			}()
			if _, err := io.ReadFull(b, make([]byte, 1)); err != nil { // the write began
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond)
			closed := make(chan error, 1)
			go func() { closed <- a.Close() }()
			for _, c := range []struct {
				what string
				ch   chan error
			}{{"blocked write", wrote}, {"waiting read", read}, {"Close", closed}} {
				select {
				case err := <-c.ch:
					if c.what != "Close" && !errors.Is(err, net.ErrClosed) {
						t.Fatalf("%s ended by Close: %v", c.what, err)
					}
					if c.what == "Close" && err != nil {
						t.Fatalf("Close: %v", err)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("%s did not end", c.what)
				}
			}
		})
	}
}

// TestNotASocket: a conn without a socket is refused and left open.
func TestNotASocket(t *testing.T) {
	p, q := net.Pipe()
	defer p.Close()
	defer q.Close()
	if _, err := New(p); err == nil {
		t.Fatal("New of a pipe succeeded")
	}
	go func() { _, _ = q.Read(make([]byte, 1)) }()
	if _, err := p.Write([]byte("x")); err != nil {
		t.Fatalf("the pipe after a refused New: %v", err)
	}
}

// TestContexts: a read context's end ends a waiting read as a past deadline does; a write
// context's end ends a write waiting for the peer to read.
func TestContexts(t *testing.T) {
	a, _ := pair(t, "tcp")
	ctx, cancel := context.WithCancel(context.Background())
	a.SetReadContext(ctx)
	time.AfterFunc(20*time.Millisecond, cancel)
	if _, err := a.Read(make([]byte, 8)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read whose context ended: %v", err)
	}
	if _, err := a.Read(make([]byte, 8)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read with an ended context: %v", err)
	}
	a.SetReadContext(context.Background())
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer wcancel()
	if n, err := a.WriteContext(wctx, make([]byte, 64<<20)); !errors.Is(err, os.ErrDeadlineExceeded) || n >= 64<<20 {
		t.Fatalf("write whose context ended: %d, %v", n, err)
	}
}
