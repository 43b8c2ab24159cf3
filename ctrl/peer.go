package ctrl

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hmc-go/hmc/auth"
	"github.com/hmc-go/hmc/internal/fdconn"
	"github.com/hmc-go/hmc/internal/spinread"
	"github.com/hmc-go/hmc/status"
)

// peer is the state kept for one rank: its current connection (if any) and its inboxes. The
// inboxes outlive connections, so a reconnecting peer's earlier messages are still delivered.
type peer struct {
	id    uint32
	depth int

	mu       sync.Mutex
	conn     *pconn                   // current connection, nil if none; guarded by mu
	live     atomic.Pointer[pconn]    // conn, stored with it: read without mu by Send and Recv
	ended    error                    // why the last connection ended, nil while one is live or before any; guarded by mu
	changed  chan struct{}            // closed and replaced on every connection change; guarded by mu
	user     chan Message             // TypeInt, TypeStruct and other types below FirstInternalType
	internal map[MsgType]chan Message // guarded by mu
}

func newPeer(id uint32, depth int) *peer {
	return &peer{id: id, depth: depth, changed: make(chan struct{}), user: make(chan Message, depth),
		internal: make(map[MsgType]chan Message)}
}

// pconn is one control connection. Frames are written whole: each in one call of fdconn,
// whose write lock keeps it whole (writeWord takes no other), or under wmu. Reading is a token
// (rtok): a Recv waiting for a message takes it and reads the socket itself, so the frame it
// waits for goes from the socket to its caller with no hand-off between goroutines (and, on a
// machine with two cores, between threads); frames of other types it meets go to their
// inboxes. While nobody waits, the connection's own reader holds the token, so that messages
// keep arriving and a dead peer is noticed; a waiter that arrives takes the token from it by
// interrupting its read (a read deadline in the past).
type pconn struct {
	c       net.Conn
	wmu     sync.Mutex
	scratch [HeaderSize + smallFrame]byte // guarded by wmu
	done    chan struct{}
	once    sync.Once

	rtok     token         // the right to read c
	waits    atomic.Uint64 // Recv calls that drove c: the reader stands aside while it changes, or while a Recv holds rtok
	readerIn atomic.Bool   // the connection's reader holds rtok: interrupt it to get it
	rkick    atomic.Bool   // a read deadline in the past may be set: clear it before reading
	in       inbuf         // guarded by rtok
	fc       *fdconn.Conn  // c off the netpoller, or nil (c is the runtime's)
	part     *Message      // a large frame read in part (by a reader that was interrupted); guarded by rtok
	got      int           // bytes of part's payload read; guarded by rtok
	held     *Message      // a frame whose inbox was full; guarded by rtok
}

// kickRead interrupts whoever reads pc now (or next) with a read deadline in the past.
func (pc *pconn) kickRead() {
	pc.rkick.Store(true)
	_ = pc.c.SetReadDeadline(longAgo)
}

// newPconn wraps c; its reads poll the socket for spin before they park (spinread).
func newPconn(c net.Conn, spin time.Duration) *pconn {
	r, _ := spinread.NewReader(c, spin)
	pc := &pconn{c: c, done: make(chan struct{}), in: newInbuf(r, readBuf)}
	pc.rtok.wake = make(chan struct{}, 1)
	pc.fc, _ = c.(*fdconn.Conn)
	return pc
}

// token is a connection's read token. A free token is taken with one atomic operation (a
// lone Recv loop takes and gives it back per message, which a channel's lock made several
// times dearer); one held by another is waited for on wake, beside whatever else ends the
// wait. A futex-style lock: state 0 free, 1 held, 2 held and wanted (its release puts a
// value in wake).
type token struct {
	state atomic.Int32
	wake  chan struct{} // cap 1: a wanted token was released; the waiter that gets it tries again
}

// tryTake takes the token if it is free: a first try only. A waiter woken from wake tries
// with want, which keeps the mark that other waiters rely on for their wake.
func (t *token) tryTake() bool { return t.state.CompareAndSwap(0, 1) }

// want takes the token if it is free, and marks it wanted otherwise: its holder's release
// then puts a value in wake. A waiter calls it before every wait on wake.
func (t *token) want() bool { return t.state.Swap(2) == 0 }

// release gives the token back, waking a waiter if one may wait. A value left in wake by a
// waiter that went away costs the next waiter one more try.
func (t *token) release() {
	if t.state.Swap(0) == 2 {
		select {
		case t.wake <- struct{}{}:
		default: // a wake is pending already
		}
	}
}

// readBuf is the size of a connection's read buffer: frames that fit are read with one
// system call for header and payload (and as many frames as have arrived).
const readBuf = 16 << 10

// smallFrame is the largest payload copied next to its header into one write; larger ones go
// out as one writev of header and payload.
const smallFrame = 240

func (pc *pconn) close() {
	pc.once.Do(func() {
		close(pc.done)
		_ = pc.c.Close() // ending the connection; readers see the error
	})
}

// queue returns the inbox for messages of type t, creating an internal one on first use.
func (p *peer) queue(t MsgType) (chan Message, error) {
	if t < FirstInternalType {
		return p.user, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	q, ok := p.internal[t]
	if !ok {
		if len(p.internal) >= maxInternalTypes {
			return nil, fmt.Errorf("ctrl: more than %d internal message types from rank %d: %w", maxInternalTypes, p.id, status.ErrProtocol)
		}
		q = make(chan Message, p.depth)
		p.internal[t] = q
	}
	return q, nil
}

// signal wakes everyone waiting on a connection change. Caller holds p.mu.
func (p *peer) signal() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// closeConn ends the current connection, if any, and records why.
func (p *peer) closeConn(why error) {
	p.mu.Lock()
	pc := p.conn
	p.conn = nil
	p.live.Store(nil)
	if why == nil {
		why = status.ErrClosed
	}
	p.ended = why
	p.signal()
	p.mu.Unlock()
	if pc != nil {
		pc.close()
	}
}

// connEnded records that pc stopped, unless a newer connection replaced it already.
func (p *peer) connEnded(pc *pconn, why error) {
	pc.close()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn != pc {
		return
	}
	p.conn = nil
	p.live.Store(nil)
	p.ended = why
	p.signal()
}

// peerFor returns the state of rank id, creating it.
//
// The rank found last is kept aside (m.last) for a loop of calls to one rank, which then takes
// no lock; dropping a rank from peers, or closing, clears it.
func (m *Manager) peerFor(id uint32) (*peer, error) {
	if p := m.last.Load(); p != nil && p.id == id {
		return p, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, fmt.Errorf("ctrl: %w", status.ErrClosed)
	}
	p, ok := m.peers[id]
	if !ok {
		p = newPeer(id, m.cfg.InboxDepth)
		m.peers[id] = p
	}
	m.last.Store(p)
	return p, nil
}

// attach makes c the connection of rank id, replacing (and closing) an older one, and starts
// its reader.
func (m *Manager) attach(id uint32, c net.Conn) error {
	p, err := m.peerFor(id)
	if err != nil {
		return err
	}
	if !m.cfg.Netpoll && m.cfg.ReadSpin <= 0 {
		if fc, err := fdconn.New(c); err == nil {
			c = fc // off the netpoller; c was closed (TLS or another kind: kept as it is)
		}
	}
	pc := newPconn(c, m.cfg.ReadSpin)
	m.mu.Lock()
	if m.closed { // re-checked under mu so that Close's wg.Wait covers the reader started here
		m.mu.Unlock()
		return fmt.Errorf("ctrl: %w", status.ErrClosed)
	}
	m.wg.Add(1)
	m.mu.Unlock()
	p.mu.Lock()
	old := p.conn
	p.conn, p.ended = pc, nil
	p.live.Store(pc)
	p.signal()
	p.mu.Unlock()
	if old != nil {
		m.cfg.Logger.Warn("ctrl: replacing connection", "rank", id, "remote", c.RemoteAddr())
		old.close()
	}
	m.cfg.Logger.Debug("ctrl: peer connected", "rank", id, "remote", c.RemoteAddr())
	go m.readLoop(p, pc) // owned by m (wg added above); ends when pc closes
	return nil
}

func (m *Manager) readLoop(p *peer, pc *pconn) {
	defer m.wg.Done()
	why := m.read(p, pc)
	m.cfg.Logger.Debug("ctrl: peer connection ended", "rank", p.id, "err", why)
	p.connEnded(pc, why)
}

// read is the connection's reader. It reads (delivering every frame to its inbox) only while
// no Recv has been driving the connection for linger: a Recv loop (send, then wait for the
// answer) then never has to take the token from it, which would wake it twice per message.
func (m *Manager) read(p *peer, pc *pconn) error {
	t := time.NewTimer(linger)
	defer t.Stop()
	interrupted := false
	var seen uint64 // pc.waits when the reader last looked: no Recv yet, it starts at once
	for {
		if w := pc.waits.Load(); w != seen || pc.rtok.state.Load() != 0 {
			seen = w
			t.Reset(linger)
			select {
			case <-t.C:
			case <-pc.done:
				return fmt.Errorf("ctrl: rank %d: %w", p.id, status.ErrClosed)
			}
			continue
		}
		if !pc.rtok.tryTake() {
			for !pc.rtok.want() {
				select {
				case <-pc.rtok.wake:
				case <-pc.done:
					return fmt.Errorf("ctrl: rank %d: %w", p.id, status.ErrClosed)
				}
			}
		}
		// Clear a waiter's deadline before saying we read: a waiter that sees readerIn then
		// interrupts us after this, never before.
		if pc.rkick.Swap(false) || interrupted {
			_ = pc.c.SetReadDeadline(time.Time{})
		}
		pc.readerIn.Store(true)
		var err error
		if pc.waits.Load() == seen { // no Recv came since the reader looked
			if pc.fc != nil {
				pc.fc.SetReadContext(context.Background()) // not the last Recv's
				pc.fc.SetDirectReads(false)                // a waiter's interruption reaches it at once
			}
			_, err = m.pump(p, pc, nil, pc.done, nil)
		}
		pc.readerIn.Store(false)
		pc.rtok.release()
		interrupted = errors.Is(err, os.ErrDeadlineExceeded)
		if err != nil && !interrupted {
			return err
		}
	}
}

// linger is how long the connection's reader stays aside after the last Recv left (between
// linger and twice it: the reader looks once per linger whether a Recv came or left). Its
// timer must be slow: a runtime timer due within a few milliseconds makes every idle
// netpoll sleep a timed one, which measured 9 -> 40-50 µs per two-process round trip here.
const linger = 50 * time.Millisecond

// pump reads frames while the caller holds the read token, delivering each to its inbox,
// until one for inbox want arrives (returned, not queued; want nil: never) or reading fails.
// With w (want is then the user inbox), a user frame of up to 8 bytes read from the socket
// comes back in w, without its payload's allocation.
// A full inbox blocks the delivery until stop closes; the frame is then held for the next
// reader (os.ErrDeadlineExceeded). A read deadline ends it with os.ErrDeadlineExceeded and no
// byte lost.
func (m *Manager) pump(p *peer, pc *pconn, want chan Message, stop <-chan struct{}, w *word) (Message, error) {
	for {
		if pc.held != nil {
			q, err := p.queue(pc.held.Type)
			if err != nil {
				return Message{}, err
			}
			if q == want { // older than anything unread: the caller's, in order
				msg := *pc.held
				pc.held = nil
				return msg, nil
			}
			select {
			case q <- *pc.held:
				pc.held = nil
			case <-stop:
				return Message{}, os.ErrDeadlineExceeded
			}
		}
		msg, err := m.frame(p, pc, w)
		if err != nil {
			return Message{}, err
		}
		if q, err := p.queue(msg.Type); err == nil {
			if q == want {
				return msg, nil
			}
			select {
			case q <- msg:
				continue
			default:
			}
		}
		// A full inbox (or a type without one): held, and delivered at the top. Only this
		// copy goes to the heap, not every frame.
		held := msg
		pc.held = &held
	}
}

// word is a frame of up to 8 bytes of a user type, its payload as a little-endian integer
// (RecvU64, RecvInt): pump and frame fill it instead of allocating the payload.
type word struct {
	v  uint64
	n  uint32 // the payload's length
	ok bool   // filled: the Message returned has no payload
}

// frame reads the next frame. A read interrupted by a deadline consumes nothing of a frame
// that fits the buffer, and keeps the part read of a larger one for the next call. With w, a
// user frame of up to 8 bytes is returned in w.
func (m *Manager) frame(p *peer, pc *pconn, w *word) (Message, error) {
	if pc.part == nil {
		b, err := pc.in.peek(HeaderSize)
		if err != nil {
			return Message{}, m.readErr(p, err, false)
		}
		h := Header(b)
		if err := h.Check(m.cfg.MaxFrame); err != nil {
			if aerr := auth.Refusal(b, fmt.Sprintf("rank %d", p.id)); aerr != nil {
				return Message{}, fmt.Errorf("ctrl: %w", aerr) // it authenticates its peers; this side has no credentials
			}
			return Message{}, err
		}
		n := int(h.Length())
		if HeaderSize+n <= len(pc.in.buf) {
			b, err := pc.in.peek(HeaderSize + n)
			if err != nil {
				return Message{}, m.readErr(p, err, true)
			}
			msg := Message{Type: h.Type(), Flags: h.Flags()}
			if w != nil && n <= 8 && h.Type() < FirstInternalType {
				var v [8]byte
				copy(v[:], b[HeaderSize:])
				*w = word{v: binary.LittleEndian.Uint64(v[:]), n: uint32(n), ok: true}
			} else {
				msg.Payload = make([]byte, n)
				copy(msg.Payload, b[HeaderSize:])
			}
			pc.in.discard(HeaderSize + n)
			return msg, nil
		}
		msg := Message{Type: h.Type(), Flags: h.Flags(), Payload: make([]byte, n)}
		pc.in.discard(HeaderSize)
		part := msg // only this copy goes to the heap, not every frame's Message
		pc.part, pc.got = &part, 0
	}
	for pc.got < len(pc.part.Payload) {
		k, err := pc.in.read(pc.part.Payload[pc.got:])
		pc.got += k
		if err != nil {
			return Message{}, m.readErr(p, err, true)
		}
	}
	msg := *pc.part
	pc.part = nil
	return msg, nil
}

// readErr wraps a read error; a deadline passes through unwrapped (the reader was asked to
// step aside, or the waiter's context ended).
func (m *Manager) readErr(p *peer, err error, inFrame bool) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return os.ErrDeadlineExceeded
	}
	if inFrame {
		return fmt.Errorf("ctrl: rank %d: truncated frame: %w: %w", p.id, status.ErrPeerClosed, err)
	}
	return fmt.Errorf("ctrl: rank %d: %w: %w", p.id, status.ErrPeerClosed, err)
}

// waitConn returns rank id's live connection, waiting (bounded by ctx) for one to appear if the
// rank never connected. A rank whose connection ended fails at once with the reason.
func (m *Manager) waitConn(ctx context.Context, p *peer) (*pconn, error) {
	if pc := p.live.Load(); pc != nil {
		return pc, nil
	}
	for {
		p.mu.Lock()
		pc, ended, changed := p.conn, p.ended, p.changed
		p.mu.Unlock()
		if pc != nil {
			return pc, nil
		}
		if ended != nil {
			return nil, ended
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, fmt.Errorf("ctrl: waiting for rank %d: %w", p.id, status.FromContext(ctx))
		case <-m.done:
			return nil, fmt.Errorf("ctrl: %w", status.ErrClosed)
		}
	}
}

// WaitPeer blocks until rank id is connected (by either side), ctx ends, or its connection
// has ended.
func (m *Manager) WaitPeer(ctx context.Context, id uint32) error {
	p, err := m.peerFor(id)
	if err != nil {
		return err
	}
	_, err = m.waitConn(ctx, p)
	return err
}

// HasPeer reports whether rank id has a live connection.
func (m *Manager) HasPeer(id uint32) bool {
	m.mu.Lock()
	p, ok := m.peers[id]
	m.mu.Unlock()
	if !ok {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conn != nil
}

// PeerAddr returns the remote address of rank id's live connection, or nil.
func (m *Manager) PeerAddr(id uint32) net.Addr {
	m.mu.Lock()
	p, ok := m.peers[id]
	m.mu.Unlock()
	if !ok {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil {
		return nil
	}
	return p.conn.c.RemoteAddr()
}

// ClosePeer closes the connection to rank id and drops its queued messages. A later dial or
// accept for the same rank starts afresh. Closing an unknown rank returns ErrNotFound.
func (m *Manager) ClosePeer(id uint32) error {
	m.mu.Lock()
	p, ok := m.peers[id]
	delete(m.peers, id)
	m.last.Store(nil)
	m.mu.Unlock()
	if !ok {
		return fmt.Errorf("ctrl: close rank %d: %w", id, status.ErrNotFound)
	}
	p.closeConn(fmt.Errorf("ctrl: rank %d: %w", id, status.ErrClosed))
	return nil
}

// CloseAll closes every peer connection and drops queued messages (upstream closeAll); the
// listeners keep accepting. Use Close to stop everything.
func (m *Manager) CloseAll() {
	m.mu.Lock()
	peers := m.peers
	m.peers = make(map[uint32]*peer)
	m.last.Store(nil)
	m.mu.Unlock()
	for id, p := range peers {
		p.closeConn(fmt.Errorf("ctrl: rank %d: %w", id, status.ErrClosed))
	}
}

// Send sends one frame of type t with flags and payload to rank id, waiting (bounded by ctx) for
// the rank to connect if it never has. The frame leaves in one write; concurrent Sends to one
// rank never interleave. If ctx ends in the middle of a frame the connection is closed, since
// its framing is lost.
func (m *Manager) Send(ctx context.Context, id uint32, t MsgType, flags uint16, payload []byte) error {
	if flags&FlagHello != 0 && t == TypeStruct {
		return fmt.Errorf("ctrl: send: the HELLO flag is reserved: %w", status.ErrInvalidConfig)
	}
	if uint64(len(payload)) > uint64(m.cfg.MaxFrame) || uint64(len(payload)) > math.MaxUint32 {
		return fmt.Errorf("ctrl: send of %d bytes exceeds the frame cap %d: %w", len(payload), m.cfg.MaxFrame, status.ErrInvalidConfig)
	}
	pc, err := m.connFor(ctx, id)
	if err != nil {
		return err
	}
	if err := pc.writeFrame(ctx, MakeHeader(t, flags, uint32(len(payload))), payload); err != nil {
		return fmt.Errorf("ctrl: send to rank %d: %w", id, err)
	}
	return nil
}

// connFor returns rank id's connection, waiting (bounded by ctx) for the rank to connect if it
// never has.
func (m *Manager) connFor(ctx context.Context, id uint32) (*pconn, error) {
	p, err := m.peerFor(id)
	if err != nil {
		return nil, err
	}
	pc, err := m.waitConn(ctx, p)
	if err != nil {
		return nil, fmt.Errorf("ctrl: send to rank %d: %w", id, err)
	}
	return pc, nil
}

// sendWord sends a TypeInt frame of the n low bytes of v, little-endian (SendU64, SendInt).
// Its common case (the rank used last, connected off the netpoller) calls nothing but the
// write: see recvWord.
func (m *Manager) sendWord(ctx context.Context, id uint32, v uint64, n uint32) error {
	if p := m.last.Load(); p != nil && p.id == id {
		if pc := p.live.Load(); pc != nil && pc.fc != nil {
			f := wordFrame(MakeHeader(TypeInt, 0, n), v)
			k, err := pc.fc.WriteContext(ctx, f[:HeaderSize+n])
			if err != nil {
				return fmt.Errorf("ctrl: send to rank %d: %w", id, pc.writeErr(ctx, int64(k), err))
			}
			return nil
		}
	}
	pc, err := m.connFor(ctx, id)
	if err != nil {
		return err
	}
	if err := pc.writeWord(ctx, MakeHeader(TypeInt, 0, n), v); err != nil {
		return fmt.Errorf("ctrl: send to rank %d: %w", id, err)
	}
	return nil
}

var longAgo = time.Unix(1, 0)

func (pc *pconn) writeFrame(ctx context.Context, h Header, payload []byte) error {
	pc.wmu.Lock()
	defer pc.wmu.Unlock()
	defer pc.writeBound(ctx)()
	var (
		n   int64
		err error
	)
	b := append(pc.scratch[:0], h[:]...) // h itself stays on the caller's stack
	if len(payload) <= smallFrame {
		var nn int
		if pc.fc != nil {
			nn, err = pc.fc.WriteContext(ctx, append(b, payload...))
		} else {
			nn, err = pc.c.Write(append(b, payload...))
		}
		n = int64(nn)
	} else if pc.fc != nil { // one writev, as net.Buffers makes for the runtime's sockets
		n, err = pc.fc.WriteBuffersContext(ctx, [][]byte{b, payload})
	} else {
		bufs := net.Buffers{b, payload}
		n, err = bufs.WriteTo(pc.c)
	}
	return pc.writeErr(ctx, n, err)
}

// writeWord writes a frame of header h and the h.Length() low bytes of v, little-endian: a
// u64 or an int sent without its bytes escaping to the heap, as a payload slice does. Off the
// netpoller the frame goes from this stack in one fdconn call, whose lock keeps frames whole:
// no wmu (two atomic operations fewer per message).
func (pc *pconn) writeWord(ctx context.Context, h Header, v uint64) error {
	if pc.fc != nil {
		f := wordFrame(h, v)
		n, err := pc.fc.WriteContext(ctx, f[:HeaderSize+h.Length()])
		return pc.writeErr(ctx, int64(n), err)
	}
	pc.wmu.Lock()
	defer pc.wmu.Unlock()
	defer pc.writeBound(ctx)()
	b := binary.LittleEndian.AppendUint64(append(pc.scratch[:0], h[:]...), v)
	n, err := pc.c.Write(b[:HeaderSize+h.Length()])
	return pc.writeErr(ctx, int64(n), err)
}

// wordFrame is a frame of header h and v, little-endian (its first HeaderSize+h.Length()
// bytes are the frame).
func wordFrame(h Header, v uint64) (f [HeaderSize + 8]byte) {
	copy(f[:], h[:])
	binary.LittleEndian.PutUint64(f[HeaderSize:], v)
	return f
}

// writeBound makes ctx's end interrupt a blocked write and returns what undoes it after the
// frame; no write deadline per frame (a runtime timer per frame wakes the netpoller, see
// linger). The caller holds wmu. Off the netpoller, the write itself takes ctx (fdconn's
// WriteContext: nothing to arm until a write waits; kept, as the reads').
func (pc *pconn) writeBound(ctx context.Context) (undo func()) {
	if pc.fc != nil {
		return func() {}
	}
	if ctx.Done() == nil {
		return func() {}
	}
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		_ = pc.c.SetWriteDeadline(longAgo) // interrupts a blocked write
		close(fired)
	})
	return func() {
		if !stop() {
			<-fired // let it finish, then clear it for the next frame
			_ = pc.c.SetWriteDeadline(time.Time{})
		}
	}
}

// writeErr is a frame's write error, n bytes of it written: nil, ctx's end, or the peer's.
func (pc *pconn) writeErr(ctx context.Context, n int64, err error) error {
	if err == nil {
		return nil
	}
	if n > 0 {
		pc.close() // a partial frame: the stream can no longer be parsed
	}
	if cerr := status.FromContext(ctx); cerr != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		return cerr
	}
	return fmt.Errorf("%w: %w", status.ErrPeerClosed, err)
}

// Recv returns the next message of a user type (TypeInt, TypeStruct or any type below
// FirstInternalType) from rank id, waiting for the rank to connect and for a message, bounded by
// ctx. Messages already queued are delivered even after the connection ended; then Recv fails
// with the reason.
func (m *Manager) Recv(ctx context.Context, id uint32) (Message, error) {
	return m.recv(ctx, id, TypeInt, nil)
}

// RecvType is Recv for an internal type (t >= FirstInternalType): each such type has its own
// inbox, so protocols built on the control plane never see, or steal, user messages.
func (m *Manager) RecvType(ctx context.Context, id uint32, t MsgType) (Message, error) {
	if t < FirstInternalType {
		return Message{}, fmt.Errorf("ctrl: RecvType(%#x): use Recv for user types: %w", t, status.ErrInvalidConfig)
	}
	return m.recv(ctx, id, t, nil)
}

// recv is Recv and RecvType; w as pump's (t must then be a user type).
func (m *Manager) recv(ctx context.Context, id uint32, t MsgType, w *word) (Message, error) {
	p, err := m.peerFor(id)
	if err != nil {
		return Message{}, err
	}
	q, err := p.queue(t)
	if err != nil {
		return Message{}, err
	}
	for {
		select {
		case msg := <-q:
			return msg, nil
		default:
		}
		if pc := p.live.Load(); pc != nil {
			if msg, ok, err := m.drive(ctx, p, pc, q, w); ok || err != nil {
				return msg, err
			}
			continue
		}
		p.mu.Lock()
		pc, ended, changed := p.conn, p.ended, p.changed
		p.mu.Unlock()
		if pc != nil {
			continue // connected meanwhile
		}
		if ended != nil {
			// Check the queue once more: the reader may have queued a message just before it ended.
			select {
			case msg := <-q:
				return msg, nil
			default:
			}
			return Message{}, fmt.Errorf("ctrl: recv from rank %d: %w", id, ended)
		}
		select {
		case msg := <-q:
			return msg, nil
		case <-changed:
		case <-ctx.Done():
			return Message{}, fmt.Errorf("ctrl: recv from rank %d: %w", id, status.FromContext(ctx))
		case <-m.done:
			return Message{}, fmt.Errorf("ctrl: recv: %w", status.ErrClosed)
		}
	}
}

// drive waits for a message of inbox q by reading pc itself: it takes the read token (from
// the connection's reader, by interrupting its read, or from another waiter when that one
// leaves; meanwhile that one delivers q's messages to q) and reads frames until one for q
// arrives. ok false: the connection changed, look again.
func (m *Manager) drive(ctx context.Context, p *peer, pc *pconn, q chan Message, w *word) (msg Message, ok bool, err error) {
	pc.waits.Add(1) // the reader stands aside (one atomic operation: no clock read, nothing at the end)

	if pc.readerIn.Load() {
		pc.kickRead() // the reader steps aside (a waiter it hits reads on)
	}
	if !pc.rtok.tryTake() { // free for a lone Recv loop: no select
		if took, msg, ok, err := m.waitToken(ctx, p, pc, q); !took {
			return msg, ok, err
		}
	}
	defer pc.rtok.release()
	select { // queued by the previous holder of the token
	case msg := <-q:
		return msg, true, nil
	default:
	}
	// No read deadline from ctx: arming a runtime timer per call wakes the netpoller, which
	// costs more than the round trip; ctx's end interrupts the read instead.
	if pc.rkick.Load() && pc.rkick.Swap(false) {
		_ = pc.c.SetReadDeadline(time.Time{})
	}
	if pc.fc != nil {
		// Ends a read that waits; kept after this Recv (a loop of Recvs with one context
		// arms it once); the connection's reader sets its own.
		pc.fc.SetReadContext(ctx)
		pc.fc.SetDirectReads(true) // its answer wakes this thread in read(2)
	}
	for {
		stop := func() bool { return true }
		if ctx.Done() != nil && pc.fc == nil {
			stop = context.AfterFunc(ctx, pc.kickRead)
		}
		msg, err := m.pump(p, pc, q, ctx.Done(), w)
		stop()
		switch {
		case err == nil:
			return msg, true, nil
		case errors.Is(err, os.ErrDeadlineExceeded):
			if ctx.Err() != nil {
				return Message{}, true, fmt.Errorf("ctrl: recv from rank %d: %w", p.id, status.FromContext(ctx))
			}
			// a stale interruption meant for the reader, or for an earlier holder: read on
			_ = pc.c.SetReadDeadline(time.Time{})
		default:
			p.connEnded(pc, err)
			select {
			case msg := <-q:
				return msg, true, nil
			default:
			}
			p.mu.Lock()
			replaced := p.conn != nil && p.conn != pc
			p.mu.Unlock()
			if replaced { // a new connection of the rank closed this one: wait on that one
				return Message{}, false, nil
			}
			return Message{}, true, fmt.Errorf("ctrl: recv from rank %d: %w", p.id, err)
		}
	}
}

// waitToken waits for pc's read token (took) or for what ends drive before it takes it: a
// message queued for q by the token's holder, a connection change (ok false: look again),
// ctx's end or the Manager's close; drive then returns msg, ok and err.
func (m *Manager) waitToken(ctx context.Context, p *peer, pc *pconn, q chan Message) (took bool, msg Message, ok bool, err error) {
	p.mu.Lock() // pc was found without the lock: is it still the connection?
	now, changed := p.conn, p.changed
	p.mu.Unlock()
	if now != pc {
		return false, Message{}, false, nil // look again
	}
	for !pc.rtok.want() {
		if took, msg, ok, err = m.waitWake(ctx, p, pc, q, changed); !took {
			return false, msg, ok, err
		}
	}
	return true, Message{}, false, nil
}

// waitWake is one wait of waitToken: for a wake of pc's token (took: try again), or for what
// ends the wait.
func (m *Manager) waitWake(ctx context.Context, p *peer, pc *pconn, q chan Message, changed <-chan struct{}) (took bool, msg Message, ok bool, err error) {
	select {
	case <-pc.rtok.wake:
		return true, Message{}, false, nil
	case msg := <-q:
		return false, msg, true, nil
	case <-changed:
		return false, Message{}, false, nil
	case <-ctx.Done():
		return false, Message{}, true, fmt.Errorf("ctrl: recv from rank %d: %w", p.id, status.FromContext(ctx))
	case <-m.done:
		return false, Message{}, true, fmt.Errorf("ctrl: recv: %w", status.ErrClosed)
	}
}

// SendU64 sends a TypeInt frame with an 8-byte payload (upstream sendU64; HMC's tags).
func (m *Manager) SendU64(ctx context.Context, id uint32, v uint64) error {
	return m.sendWord(ctx, id, v, 8)
}

// RecvU64 receives a TypeInt frame with an 8-byte payload. A message of another type or size is
// consumed and reported as ErrProtocol, as upstream.
func (m *Manager) RecvU64(ctx context.Context, id uint32) (uint64, error) {
	return m.recvWord(ctx, id, 8)
}

// SendInt sends a TypeInt frame with a 4-byte payload (upstream sendInt).
func (m *Manager) SendInt(ctx context.Context, id uint32, v int32) error {
	return m.sendWord(ctx, id, uint64(uint32(v)), 4)
}

// RecvInt receives a TypeInt frame with a 4-byte payload.
func (m *Manager) RecvInt(ctx context.Context, id uint32) (int32, error) {
	v, err := m.recvWord(ctx, id, 4)
	return int32(uint32(v)), err
}

// SendStruct sends v, a fixed-size value as encoding/binary understands it, little-endian, as
// a TypeStruct frame (upstream sendStruct<T>).
func (m *Manager) SendStruct(ctx context.Context, id uint32, v any) error {
	if binary.Size(v) <= 0 {
		return fmt.Errorf("ctrl: send struct %T: not a fixed-size value: %w", v, status.ErrInvalidConfig)
	}
	b, err := binary.Append(nil, binary.LittleEndian, v)
	if err != nil {
		return fmt.Errorf("ctrl: send struct %T: %w: %w", v, status.ErrInvalidConfig, err)
	}
	return m.Send(ctx, id, TypeStruct, 0, b)
}

// RecvStruct receives a TypeStruct frame into v (a pointer to a fixed-size value); the payload
// must be exactly binary.Size(v) bytes.
func (m *Manager) RecvStruct(ctx context.Context, id uint32, v any) error {
	size := binary.Size(v)
	if size <= 0 {
		return fmt.Errorf("ctrl: recv struct %T: not a pointer to a fixed-size value: %w", v, status.ErrInvalidConfig)
	}
	b, err := m.recvFixed(ctx, id, TypeStruct, size)
	if err != nil {
		return err
	}
	if _, err := binary.Decode(b, binary.LittleEndian, v); err != nil {
		return fmt.Errorf("ctrl: recv struct %T: %w: %w", v, status.ErrInvalidConfig, err)
	}
	return nil
}

// recvWord receives a TypeInt frame of size (at most 8) bytes as a little-endian integer; a
// frame read from the socket for it allocates nothing.
//
// Its common case is one function: the rank used last, connected off the netpoller, nothing
// queued for it, the read token free, a word frame next. A round trip's messages find the
// caches cold on a machine that runs other work between them, where each function entered
// costs a miss or two (pinned beside busy loops, ctrl's own functions took ~1.2 µs of user
// time per round trip before this path; docs/performance.md, "Control plane"); anything else
// takes the general path, which finds what the common case read in the buffer.
func (m *Manager) recvWord(ctx context.Context, id uint32, size int) (uint64, error) {
	var w word
	var t MsgType
	if p := m.last.Load(); p != nil && p.id == id && len(p.user) == 0 {
		if pc := p.live.Load(); pc != nil && pc.fc != nil {
			pc.waits.Add(1) // as drive: the reader stands aside
			if !pc.readerIn.Load() && pc.rtok.tryTake() {
				t = m.wordNow(ctx, p, pc, &w)
				pc.rtok.release()
			}
		}
	}
	if !w.ok {
		msg, err := m.recv(ctx, id, TypeInt, &w)
		if err != nil {
			return 0, err
		}
		t = msg.Type
		if !w.ok { // a frame queued, held or too large for a word: its payload
			var b [8]byte
			copy(b[:], msg.Payload)
			w = word{v: binary.LittleEndian.Uint64(b[:]), n: uint32(len(msg.Payload))}
		}
	}
	if t != TypeInt || int(w.n) != size {
		return 0, fmt.Errorf("ctrl: from rank %d: got type %#x with %d bytes, want type %#x with %d: %w",
			id, t, w.n, TypeInt, size, status.ErrProtocol)
	}
	return w.v, nil
}

// wordNow reads the next frame into w (w.ok) for recvWord's common case if it is a user frame
// of up to 8 bytes and nothing else waits to be delivered first, and returns its type;
// otherwise it leaves whatever it read in the buffer for the general path. The caller holds
// pc's read token.
func (m *Manager) wordNow(ctx context.Context, p *peer, pc *pconn, w *word) MsgType {
	if len(p.user) > 0 || pc.part != nil || pc.held != nil || pc.rkick.Load() {
		return 0
	}
	pc.fc.SetReadContext(ctx)
	pc.fc.SetDirectReads(true)
	b := &pc.in
	for {
		if b.hi-b.lo >= HeaderSize {
			h := Header(b.buf[b.lo : b.lo+HeaderSize])
			t, n := h.Type(), int(h.Length())
			// Check's conditions, without its call, for frames the general path must refuse
			if t >= FirstInternalType || n > 8 || uint32(n) > m.cfg.MaxFrame || h.IsHello() {
				return 0
			}
			if b.hi-b.lo >= HeaderSize+n {
				var v [8]byte
				copy(v[:], b.buf[b.lo+HeaderSize:b.lo+HeaderSize+n])
				b.lo += HeaderSize + n
				*w = word{v: binary.LittleEndian.Uint64(v[:]), n: uint32(n), ok: true}
				return t
			}
		}
		if b.lo > 0 { // inbuf.fill, inline (see recvWord)
			b.hi = copy(b.buf, b.buf[b.lo:b.hi])
			b.lo = 0
		}
		k, err := pc.fc.Read(b.buf[b.hi:])
		b.hi += k
		if k == 0 || err != nil { // the general path reads again and sees the error
			return 0
		}
	}
}

func (m *Manager) recvFixed(ctx context.Context, id uint32, t MsgType, size int) ([]byte, error) {
	msg, err := m.Recv(ctx, id)
	if err != nil {
		return nil, err
	}
	if msg.Type != t || len(msg.Payload) != size {
		return nil, fmt.Errorf("ctrl: from rank %d: got type %#x with %d bytes, want type %#x with %d: %w",
			id, msg.Type, len(msg.Payload), t, size, status.ErrProtocol)
	}
	return msg.Payload, nil
}
