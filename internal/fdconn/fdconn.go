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

	"github.com/hmc-go/hmc/internal/racebuild"
)

// Conn is a connected stream socket read and written with blocking system calls: the
// socket's own read(2) or write(2) for up to a Slice, then poll(2). Reads may run concurrently
// with writes; concurrent reads (or writes) are serialised.
type Conn struct {
	fd           int
	laddr, raddr net.Addr
	net          string

	rd, wr half

	mu     sync.RWMutex // read-held by kicks from outside a call (deadlines, contexts' ends), held by Close to close the fds
	closed atomic.Bool
}

// half is one direction: its lock, deadline and the eventfd that wakes its waiter.
type half struct {
	mu       sync.Mutex // one call of this direction at a time; Close takes it to wait for the call in progress
	kick     int        // eventfd: written to make the waiter look again
	deadline atomic.Int64
	waiting  atomic.Bool     // a call may be in poll(2): a deadline change must kick it
	direct   bool            // calls block in the socket's own call first (SetDirectReads); guarded by mu
	ctx      context.Context // the calls' context; guarded by mu (set between calls)
	ctxDone  bool            // ctx can end (its Done is not nil); set with ctx
	ctxEnd   int64           // ctx's deadline on the clock of mono, 0 if none; set with ctx

	armMu sync.Mutex      // guards armed and stop (Close stops them without mu)
	armed context.Context // the context an AfterFunc kicks this half for, if any
	stop  func() bool     // armed's AfterFunc's stop
}

// arm makes sure an end of ctx kicks h: one AfterFunc per context, kept while the calls use
// the same one (a Recv loop's context is armed once, not per wait). Caller holds h.mu.
func (c *Conn) arm(h *half, ctx context.Context) {
	h.armMu.Lock()
	defer h.armMu.Unlock()
	if h.armed == ctx {
		return
	}
	if h.stop != nil {
		h.stop()
	}
	h.armed, h.stop = ctx, context.AfterFunc(ctx, func() { c.kick(h) })
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
	switch c.(type) {
	case *net.TCPConn, *net.UnixConn:
	default:
		return nil, fmt.Errorf("fdconn: %T is not a TCP or Unix socket", c)
	}
	raw, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("fdconn: %w", err)
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
	// Blocking, with its blocking bounded to a slice: a call first blocks in the socket's own
	// read or write, as a C program does (one system call, the kernel waking this thread);
	// when a slice passes without progress it waits in poll(2), where kicks reach it.
	k.rd.direct, k.wr.direct = true, true
	tv := unix.NsecToTimeval(int64(Slice))
	if err = unix.SetNonblock(fd, false); err == nil {
		err = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	}
	if err == nil {
		err = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
	}
	if err == nil {
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
	tried := false
	if c.rd.direct && !c.closed.Load() && c.mayBlock(&c.rd) {
		// io's first try, in this frame: a read that returns bytes enters no other function
		// of this package (on a round trip's path each one entered is a cache miss or two
		// once the caches went cold between messages).
		n, err := syscall.Read(c.fd, b)
		if n > 0 {
			return n, nil
		}
		if n == 0 && err == nil && !c.closed.Load() {
			return 0, io.EOF
		}
		tried = err == unix.EAGAIN || err == unix.EINTR // the slice passed: io waits in poll(2)
		if !tried {
			if c.closed.Load() {
				err = net.ErrClosed // Close's shutdown ended the call
			}
			return 0, c.opErr("read", err)
		}
	}
	n, err := c.io(&c.rd, b, nil, tried)
	if err == nil && n == 0 {
		return 0, io.EOF
	}
	if err != nil {
		return 0, c.opErr("read", err)
	}
	return n, nil
}

// Write implements net.Conn: it returns when all of b is written, or with the error that
// stopped it and the count written. Concurrent writes never interleave their bytes.
func (c *Conn) Write(b []byte) (int, error) {
	c.wr.mu.Lock()
	defer c.wr.mu.Unlock()
	return c.write(b, false)
}

// WriteContext is Write whose waits end, as a deadline would, when ctx ends
// (os.ErrDeadlineExceeded; context.Background(): never). ctx is kept for the writes that
// follow and costs nothing until a write must wait; setting it in the call that writes lets a
// writer that frames its messages go without a lock of its own.
func (c *Conn) WriteContext(ctx context.Context, b []byte) (int, error) {
	c.wr.mu.Lock()
	defer c.wr.mu.Unlock()
	c.wr.setCtx(ctx)
	if len(b) > 0 && c.wr.direct && !c.closed.Load() && c.mayBlock(&c.wr) {
		// io's first try, in this frame, as Read's.
		n, err := syscall.Write(c.fd, b)
		if n == len(b) {
			return n, nil
		}
		if n > 0 {
			k, err := c.write(b[n:], false)
			return n + k, err
		}
		if err != unix.EAGAIN && err != unix.EINTR || c.closed.Load() {
			if c.closed.Load() {
				err = net.ErrClosed
			}
			return 0, c.opErr("write", err)
		}
		return c.write(b, true)
	}
	return c.write(b, false)
}

// write writes all of b; tried: a direct write of b just found the socket full. The caller
// holds c.wr.mu.
func (c *Conn) write(b []byte, tried bool) (int, error) {
	done := 0
	for done < len(b) {
		n, err := c.io(&c.wr, b[done:], nil, tried)
		tried = false
		done += max(n, 0)
		if err != nil {
			return done, c.opErr("write", err)
		}
	}
	return done, nil
}

// WriteBuffersContext writes every buffer of bufs in order with writev(2), as
// net.Buffers.WriteTo does for the runtime's sockets (a frame's header and payload leave in
// one call), with ctx as WriteContext's.
func (c *Conn) WriteBuffersContext(ctx context.Context, bufs [][]byte) (int64, error) {
	c.wr.mu.Lock()
	defer c.wr.mu.Unlock()
	c.wr.setCtx(ctx)
	return c.writeBuffers(bufs)
}

// writeBuffers is WriteBuffersContext's writing; the caller holds c.wr.mu.
func (c *Conn) writeBuffers(bufs [][]byte) (int64, error) {
	var total int64
	bufs = append([][]byte(nil), bufs...)
	for len(bufs) > 0 {
		if len(bufs[0]) == 0 {
			bufs = bufs[1:]
			continue
		}
		n, err := c.io(&c.wr, nil, bufs, false)
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
// EAGAIN, waiting in poll(2) between tries; tried: the caller's own direct try just found
// nothing (io waits in poll(2) first). The caller holds h.mu.
func (c *Conn) io(h *half, b []byte, bufs [][]byte, tried bool) (int, error) {
	events := int16(unix.POLLIN)
	if h == &c.wr {
		events = unix.POLLOUT
	}
	// No lock beside h.mu: Close waits for the call holding it before it closes fd.
	if c.closed.Load() {
		return 0, net.ErrClosed
	}
	for try := !tried && h.direct && c.mayBlock(h); ; try = false {
		if !try { // wait in poll(2) first
			ready, err := c.wait(h, events)
			if err != nil {
				return 0, err
			}
			if !ready {
				continue // kicked: wait looks at closing, the deadline and the context again
			}
		}
		n, err := c.op(h, b, bufs)
		if n <= 0 && c.closed.Load() {
			return 0, net.ErrClosed // Close's shutdown ended the call
		}
		if err != unix.EAGAIN && err != unix.EINTR {
			return n, err
		}
		if n > 0 {
			return n, nil // a partial write: the caller goes on
		}
	}
}

// mayBlock reports whether a call of h may block in the socket's own call for a slice: no
// deadline or context ends before the slice does (then it waits in poll(2), where their end
// is seen at once).
func (c *Conn) mayBlock(h *half) bool {
	if d := h.deadline.Load(); d != 0 && d-time.Now().UnixNano() < int64(Slice) {
		return false
	}
	if h.ctxDone {
		if h.ctx.Err() != nil {
			return false
		}
		if e := h.ctxEnd; e != 0 && e-mono() < int64(Slice) {
			return false
		}
	}
	return true
}

// setCtx makes ctx the half's context. A context set again (a loop of calls with one) is not
// looked at again: its deadline was read the first time.
func (h *half) setCtx(ctx context.Context) {
	if ctx == h.ctx {
		return
	}
	h.ctx, h.ctxDone, h.ctxEnd = ctx, ctx != nil && ctx.Done() != nil, 0
	if !h.ctxDone {
		return
	}
	if dl, ok := ctx.Deadline(); ok {
		h.ctxEnd = max(int64(dl.Sub(clockBase)), 1)
	}
}

var clockBase = time.Now()

// mono is a monotonic clock reading in nanoseconds since clockBase: one clock read, where
// time.Now (wall and monotonic) takes two.
func mono() int64 { return int64(time.Since(clockBase)) }

// op makes the half's system call once: a read into b, or a write of b or bufs. It blocks
// for at most a slice (then EAGAIN, or a partial count).
//
// syscall's Read and Write, not x/sys/unix's: under the race detector they order this
// process's socket I/O as the runtime's sockets do (syscall's own sync point), so a write
// through a net.Conn happens before a read here.
func (c *Conn) op(h *half, b []byte, bufs [][]byte) (int, error) {
	switch {
	case h == &c.rd:
		return syscall.Read(c.fd, b)
	case bufs != nil && !racebuild.Enabled:
		return unix.Writev(c.fd, bufs)
	case bufs != nil:
		return syscall.Write(c.fd, bufs[0]) // one by one, through the sync point
	default:
		return syscall.Write(c.fd, b)
	}
}

// wait blocks in poll(2) until the socket has events (ready), the half's deadline passes or
// its context ends (os.ErrDeadlineExceeded), the half is kicked (not ready) or the Conn closes
// (net.ErrClosed).
func (c *Conn) wait(h *half, events int16) (ready bool, err error) {
	h.waiting.Store(true)
	defer h.waiting.Store(false)
	if c.closed.Load() { // after waiting is set: Close kicks us, or we see it here
		return false, net.ErrClosed
	}
	if ctx := h.ctx; ctx != nil && ctx.Done() != nil {
		if ctx.Err() != nil {
			return false, os.ErrDeadlineExceeded
		}
		c.arm(h, ctx)
	}
	var ts *unix.Timespec
	if d := h.deadline.Load(); d != 0 {
		left := d - time.Now().UnixNano()
		if left <= 0 {
			return false, os.ErrDeadlineExceeded
		}
		t := unix.NsecToTimespec(left)
		ts = &t
	}
	fds := [2]unix.PollFd{{Fd: int32(c.fd), Events: events}, {Fd: int32(h.kick), Events: unix.POLLIN}}
	if _, err := unix.Ppoll(fds[:], ts, nil); err != nil && err != unix.EINTR {
		return false, err
	}
	if fds[1].Revents != 0 {
		var b [8]byte
		_, _ = unix.Read(h.kick, b[:]) // drained; the loop looks at closing and the deadline again
	}
	return fds[0].Revents != 0, nil
}

// kick wakes h's waiter, if one may be in poll(2), unless the Conn closed (its eventfd
// number may belong to another file by then). For callers outside h's calls.
func (c *Conn) kick(h *half) {
	c.mu.RLock() // the eventfd is open while held
	if !c.closed.Load() {
		kickHalf(h)
	}
	c.mu.RUnlock()
}

// kickHalf wakes h's waiter, if one may be in poll(2). The caller makes sure h.kick is open.
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
	_ = unix.Shutdown(c.fd, unix.SHUT_RDWR) // ends a call blocked in the socket's own read or write
	c.rd.mu.Lock()                          // the read in progress, if any, has left
	c.wr.mu.Lock()                          // and the write
	c.mu.Lock()                             // and every kick from outside
	c.closeFDs()
	c.mu.Unlock()
	c.wr.mu.Unlock()
	c.rd.mu.Unlock()
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
func (c *Conn) SetReadContext(ctx context.Context) { c.rd.setCtx(ctx) }

// SetDirectReads chooses how the reads that follow wait: on (the default), in read(2) for up
// to a Slice and then in poll(2); off, in poll(2) at once, where a deadline set meanwhile, a
// context's end or Close reach them at once (a background reader that another goroutine
// interrupts). Not to be called while a Read runs.
func (c *Conn) SetDirectReads(on bool) { c.rd.direct = on }

// Slice bounds how long a call blocks in the socket's own read(2) or write(2) (rounded up to
// the kernel's clock tick) before it waits in poll(2); a deadline set, a context ended or a
// Close during a slice is seen at its end.
const Slice = time.Millisecond

// SetDeadline implements net.Conn.
func (c *Conn) SetDeadline(t time.Time) error {
	c.setDeadline(&c.rd, t)
	c.setDeadline(&c.wr, t)
	return nil
}

// SetReadDeadline implements net.Conn; a read in progress sees it at once in poll(2), at the
// end of its slice in read(2).
func (c *Conn) SetReadDeadline(t time.Time) error { c.setDeadline(&c.rd, t); return nil }

// SetWriteDeadline implements net.Conn, as SetReadDeadline.
func (c *Conn) SetWriteDeadline(t time.Time) error { c.setDeadline(&c.wr, t); return nil }

func (c *Conn) setDeadline(h *half, t time.Time) {
	var d int64
	if !t.IsZero() {
		d = max(t.UnixNano(), 1)
	}
	h.deadline.Store(d)
	if !c.closed.Load() {
		c.kick(h)
	}
}
