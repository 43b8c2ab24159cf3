package spinread

import (
	"io"
	"net"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// NewReader returns a reader of c that busy-polls its socket for up to spin before each park,
// and true; or c itself and false when spin <= 0 or c has no socket to poll (not a
// syscall.Conn).
func NewReader(c net.Conn, spin time.Duration) (io.Reader, bool) {
	if spin <= 0 {
		return c, false
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return c, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return c, false
	}
	p := &pollReader{c: c, rc: rc, spin: spin}
	p.fn = p.poll
	return p, true
}

// pollReader reads with non-blocking read(2) in a loop for up to spin before letting the
// runtime park the goroutine until the socket is readable. Deadlines set on the conn still
// apply to the parked wait.
type pollReader struct {
	c    net.Conn
	rc   syscall.RawConn
	spin time.Duration

	// One Read's arguments and results, for rc.Read's callback (made once: a closure per
	// Read would allocate). Reads of one reader are not concurrent (io.Reader's contract).
	fn    func(fd uintptr) bool
	buf   []byte
	until time.Time
	n     int
	err   error
}

// Read implements io.Reader.
func (p *pollReader) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	p.buf, p.until, p.n, p.err = b, time.Now().Add(p.spin), 0, nil
	err := p.rc.Read(p.fn)
	n, rerr := p.n, p.err
	p.buf, p.err = nil, nil
	if err != nil {
		return 0, err
	}
	if rerr != nil {
		return 0, &net.OpError{Op: "read", Net: p.c.LocalAddr().Network(), Addr: p.c.RemoteAddr(), Err: rerr}
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

// poll is Read's callback: non-blocking reads until data, an error or the spin's end.
func (p *pollReader) poll(fd uintptr) bool {
	for {
		p.n, p.err = unix.Read(int(fd), p.buf)
		switch {
		case p.err == unix.EINTR:
			continue
		case p.err == unix.EAGAIN:
			if time.Now().Before(p.until) {
				// Let goroutines this reader just made runnable (a caller whose
				// operation completed) run first, on this P, instead of waiting out the spin.
				runtime.Gosched()
				continue
			}
			return false // park until readable, then try again
		}
		return true
	}
}
