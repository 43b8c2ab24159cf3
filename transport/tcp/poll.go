package tcp

import (
	"io"
	"net"
	"time"

	"github.com/hmc-go/hmc/internal/spinread"
)

// newReader returns c itself, or with spin > 0 a reader that busy-polls c's socket.
func newReader(c net.Conn, spin time.Duration) io.Reader {
	r, _ := spinread.NewReader(c, spin)
	return r
}

// spinConn is a connection whose reads busy-poll (spinread), for TLS to run
// over: a lane inside TLS then spins as a plain one does.
type spinConn struct {
	net.Conn
	r io.Reader
}

// Read implements io.Reader through the polling reader.
func (s *spinConn) Read(b []byte) (int, error) { return s.r.Read(b) }

// spinning returns c with busy-polling reads when the lane will run inside TLS and
// cfg.BusyPoll asks for spinning; otherwise c itself (a plain lane spins through newReader and
// keeps the *net.TCPConn underneath, whose net.Buffers writes gather into one writev).
func spinning(c net.Conn, cfg Config) net.Conn {
	if cfg.BusyPoll <= 0 || cfg.Auth.TLS == nil {
		return c
	}
	if r, ok := spinread.NewReader(c, cfg.BusyPoll); ok {
		return &spinConn{Conn: c, r: r}
	}
	return c
}
