package fdconn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Conn is a connected stream socket read and written with blocking poll(2) waits. Reads may
// run concurrently with writes; concurrent reads (or writes) are serialised.
type Conn struct {
	fd           int
	laddr, raddr net.Addr
	net          string

	rd, wr half

	mu     sync.RWMutex // read-held by calls using fd, held by Close to close it
	closed atomic.Bool
}

// half is one direction: its lock, deadline and the eventfd that wakes its waiter.
type half struct {
	mu       sync.Mutex // one call of this direction at a time
	kick     int        // eventfd: written to make the waiter look again
	deadline atomic.Int64
	waiting  atomic.Bool     // a call may be in poll(2): a deadline change must kick it
	again    bool            // a call's first try found nothing: later ones poll first; guarded by mu
	calls    uint8           // counts calls, so that every 16th tries first again; guarded by mu
	ctx      context.Context // the calls' context; guarded by mu (set between calls)

	armMu sync.Mutex      // guards armed and stop (Close stops them without mu)
	armed context.Context // the context an AfterFunc kicks this half for, if any
	stop  func() bool     // armed's AfterFunc's stop
}

// arm makes sure an end of ctx kicks h: one AfterFunc per context, kept while the calls use
// the same one (a Recv loop's context is armed once, not per wait). Caller holds h.mu.
func (h *half) arm(ctx context.Context) {
	h.armMu.Lock()
	defer h.armMu.Unlock()
	if h.armed == ctx {
		return
	}
	if h.stop != nil {
		h.stop()
	}
	h.armed, h.stop = ctx, context.AfterFunc(ctx, func() { kickHalf(h) })
}

// disarm drops h's AfterFunc, if any (at Close: a long-lived context does not keep it).
func (h *half) disarm() {
	h.armMu.Lock()
	defer h.armMu.Unlock()
	if h.stop != nil {
		h.stop()
	}
	h.armed, h.stop = nil, nil
}

// New takes c's socket off the netpoller: it duplicates the socket, closes c and returns a
// Conn over the copy. c must be a *net.TCPConn or *net.UnixConn; on error c is left open.
func New(c net.Conn) (*Conn, error) {
	var raw interface {
		Control(func(fd uintptr)) error
	}
	switch t := c.(type) {
	case *net.TCPConn:
		rc, err := t.SyscallConn()
		if err != nil {
			return nil, fmt.Errorf("fdconn: %w", err)
		}
		raw = rc
	case *net.UnixConn:
		rc, err := t.SyscallConn()
		if err != nil {
			return nil, fmt.Errorf("fdconn: %w", err)
		}
		raw = rc
	default:
		return nil, fmt.Errorf("fdconn: %T is not a TCP or Unix socket", c)
	}
	fd := -1
	var derr error
	if err := raw.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return nil, fmt.Errorf("fdconn: %w", err)
	}
	if derr != nil {
		return nil, fmt.Errorf("fdconn: dup: %w", derr)
	}
	k := &Conn{fd: fd, laddr: c.LocalAddr(), raddr: c.RemoteAddr(), net: c.LocalAddr().Network()}
	k.rd.kick, k.wr.kick = -1, -1
	var err error
	if err = unix.SetNonblock(fd, true); err == nil {
		if k.rd.kick, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err == nil {
			k.wr.kick, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
		}
	}
	if err != nil {
		k.closeFDs()
		return nil, fmt.Errorf("fdconn: %w", err)
	}
	_ = c.Close() // the copy keeps the socket; closing c takes it off the netpoller
	return k, nil
}

func (c *Conn) closeFDs() {
	for _, fd := range []int{c.fd, c.rd.kick, c.wr.kick} {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
	}
}

// Read implements net.Conn.
func (c *Conn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	c.rd.mu.Lock()
	defer c.rd.mu.Unlock()
	n, err := c.io(&c.rd, b, nil)
	if err == nil && n == 0 {
		return 0, io.EOF
	}
	if err != nil {
		return 0, c.opErr("read", err)
	}
	return n, nil
}

// Write implements net.Conn: it returns when all of b is written, or with the error that
// stopped it and the count written.
func (c *Conn) Write(b []byte) (int, error) {
	done := 0
	c.wr.mu.Lock()
	defer c.wr.mu.Unlock()
	for done < len(b) {
		n, err := c.io(&c.wr, b[done:], nil)
		done += max(n, 0)
		if err != nil {
			return done, c.opErr("write", err)
		}
	}
	return done, nil
}

// WriteBuffers writes every buffer of bufs in order with writev(2), as net.Buffers.WriteTo
// does for the runtime's sockets: a frame's header and payload leave in one call.
func (c *Conn) WriteBuffers(bufs [][]byte) (int64, error) {
	c.wr.mu.Lock()
	defer c.wr.mu.Unlock()
	var total int64
	bufs = append([][]byte(nil), bufs...)
	for len(bufs) > 0 {
		if len(bufs[0]) == 0 {
			bufs = bufs[1:]
			continue
		}
		n, err := c.io(&c.wr, nil, bufs)
		n = max(n, 0)
		total += int64(n)
		for n > 0 {
			k := min(n, len(bufs[0]))
			bufs[0] = bufs[0][k:]
			n -= k
			if len(bufs[0]) == 0 {
				bufs = bufs[1:]
			}
		}
		if err != nil {
			return total, c.opErr("write", err)
		}
	}
	return total, nil
}

// io reads b (h is rd), or writes b or bufs (h is wr), until the call does not report
// EAGAIN, waiting in poll(2) between tries. The caller holds h.mu.
func (c *Conn) io(h *half, b []byte, bufs [][]byte) (int, error) {
	events := int16(unix.POLLIN)
	if h == &c.wr {
		events = unix.POLLOUT
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	// Answers awaited (a first try found nothing): wait first, saving a try that finds
	// nothing; every 16th call tries first, to see whether data now come before they are
	// awaited.
	h.calls++
	probe := !h.again || h.calls%16 == 0
	if !probe {
		if err := c.wait(h, events); err != nil {
			return 0, err
		}
	}
	for first := true; ; first = false {
		if c.closed.Load() {
			return 0, net.ErrClosed
		}
		var n int
		var err error
		// syscall's Read and Write, not x/sys/unix's: under the race detector they order
		// this process's socket I/O as the runtime's sockets do (syscall's own sync point),
		// so a write through net.Conn happens before a read here.
		switch {
		case h == &c.rd:
			n, err = syscall.Read(c.fd, b)
		case bufs != nil && !raceEnabled:
			n, err = unix.Writev(c.fd, bufs)
		case bufs != nil:
			n, err = syscall.Write(c.fd, bufs[0]) // one by one, through the sync point
		default:
			n, err = syscall.Write(c.fd, b)
		}

		if first && probe {
			h.again = err == unix.EAGAIN
		}
		switch err {
		case nil:
			return n, nil
		case unix.EINTR:
			continue
		case unix.EAGAIN:
		default:
			return n, err
		}
		if err := c.wait(h, events); err != nil {
			return 0, err
		}
	}
}

// wait blocks in poll(2) until the socket has events, the half's deadline passes or its
// context ends (os.ErrDeadlineExceeded), the half is kicked or the Conn closes (then
// net.ErrClosed).
func (c *Conn) wait(h *half, events int16) error {
	h.waiting.Store(true)
	defer h.waiting.Store(false)
	if c.closed.Load() { // after waiting is set: Close kicks us, or we see it here
		return net.ErrClosed
	}
	if ctx := h.ctx; ctx != nil && ctx.Done() != nil {
		if ctx.Err() != nil {
			return os.ErrDeadlineExceeded
		}
		h.arm(ctx)
	}
	var ts *unix.Timespec
	if d := h.deadline.Load(); d != 0 {
		left := d - time.Now().UnixNano()
		if left <= 0 {
			return os.ErrDeadlineExceeded
		}
		t := unix.NsecToTimespec(left)
		ts = &t
	}
	fds := [2]unix.PollFd{{Fd: int32(c.fd), Events: events}, {Fd: int32(h.kick), Events: unix.POLLIN}}
	if _, err := unix.Ppoll(fds[:], ts, nil); err != nil && err != unix.EINTR {
		return err
	}
	if fds[1].Revents != 0 {
		var b [8]byte
		_, _ = unix.Read(h.kick, b[:]) // drained; the loop looks at closing and the deadline again
	}
	return nil
}

// kickHalf wakes h's waiter, if one may be in poll(2).
func kickHalf(h *half) {
	if h.waiting.Load() {
		one := [8]byte{1}
		_, _ = unix.Write(h.kick, one[:]) // nonblocking; a full counter still wakes the waiter
	}
}

func (c *Conn) opErr(op string, err error) error {
	if errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrDeadlineExceeded) {
		return &net.OpError{Op: op, Net: c.net, Source: c.laddr, Addr: c.raddr, Err: err}
	}
	return &net.OpError{Op: op, Net: c.net, Source: c.laddr, Addr: c.raddr, Err: os.NewSyscallError(op, err)}
}

// Close implements net.Conn: calls in progress return net.ErrClosed, then the socket closes.
func (c *Conn) Close() error {
	if c.closed.Swap(true) {
		return c.opErr("close", net.ErrClosed)
	}
	// Kick unconditionally: a waiter that set waiting after our check would see closed anyway,
	// but one in poll(2) must wake.
	one := [8]byte{1}
	_, _ = unix.Write(c.rd.kick, one[:])
	_, _ = unix.Write(c.wr.kick, one[:])
	c.mu.Lock() // every call has left
	c.closeFDs()
	c.mu.Unlock()
	c.rd.disarm()
	c.wr.disarm()
	return nil
}

// LocalAddr implements net.Conn.
func (c *Conn) LocalAddr() net.Addr { return c.laddr }

// RemoteAddr implements net.Conn.
func (c *Conn) RemoteAddr() net.Addr { return c.raddr }

// SetReadContext makes the reads that follow end with os.ErrDeadlineExceeded, as a deadline
// would, when ctx ends (context.Background(): never). The context costs nothing until a read
// must wait; then one context.AfterFunc is kept for it until another context is set and
// waited with, or the Conn closes. Not to be called while a Read runs.
func (c *Conn) SetReadContext(ctx context.Context) { c.rd.ctx = ctx }

// SetWriteContext is SetReadContext for writes.
func (c *Conn) SetWriteContext(ctx context.Context) { c.wr.ctx = ctx }

// SetDeadline implements net.Conn.
func (c *Conn) SetDeadline(t time.Time) error {
	c.setDeadline(&c.rd, t)
	c.setDeadline(&c.wr, t)
	return nil
}

// SetReadDeadline implements net.Conn; a read in progress sees it at once.
func (c *Conn) SetReadDeadline(t time.Time) error { c.setDeadline(&c.rd, t); return nil }

// SetWriteDeadline implements net.Conn; a write in progress sees it at once.
func (c *Conn) SetWriteDeadline(t time.Time) error { c.setDeadline(&c.wr, t); return nil }

func (c *Conn) setDeadline(h *half, t time.Time) {
	var d int64
	if !t.IsZero() {
		d = max(t.UnixNano(), 1)
	}
	h.deadline.Store(d)
	if !c.closed.Load() {
		c.mu.RLock() // the eventfd is open while held
		if !c.closed.Load() {
			kickHalf(h)
		}
		c.mu.RUnlock()
	}
}
