package store

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// tcpClient is a Client of the embedded server. When its link breaks, calls in flight and
// calls made while it is down fail with ErrIO at once, and the client dials again in the
// background (as upstream's clients do), under the same rank, until it is back or closed: a
// process cut off from the store for a while (a partition, a restarted store) carries on once
// it can reach the store again, re-subscribed to rank-down events.
type tcpClient struct {
	cfg  Config
	addr string
	log  *slog.Logger
	wmu  sync.Mutex // one frame written at a time

	mu      sync.Mutex
	link    *clientLink           // the current link; guarded by mu
	pending map[uint32]chan reply // guarded by mu
	seq     uint32                // guarded by mu
	err     error                 // why the link is down, nil while it is up; guarded by mu
	closed  bool                  // guarded by mu
	rank    int                   // guarded by mu
	world   int                   // guarded by mu

	watch *rankWatchers
	stop  chan struct{} // closed by Close
	wg    sync.WaitGroup
}

// clientLink is one connection to the store with its goroutines.
type clientLink struct {
	conn   net.Conn
	subSeq uint32        // the rank-down subscription's request id on this link
	done   chan struct{} // closed when the link ends
}

type reply struct {
	code   Code
	body   []byte // the reply's body: a packed message (Get, CompareAndSwap) or bare bytes (the others)
	lost   bool   // the link ended
	events int64  // rank-down events read before this reply: delivered before it returns
}

// writeTimeout bounds one frame write: a store that does not read is a dead store.
const writeTimeout = 10 * time.Second

// Reconnection: the first attempt after this long, then twice as long each time up to
// redialMax.
const (
	redialMin = 100 * time.Millisecond
	redialMax = time.Second
)

func dialTCP(ctx context.Context, addr string, cfg Config) (*tcpClient, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	var d net.Dialer
	var conn net.Conn
	start := time.Now()
	wait := cfg.DialTimeout
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
		wait = time.Until(dl).Round(time.Millisecond)
	}
	nag := newNagger(cfg.Logger, "tcp://"+addr, wait)
	var last error // the last refusal, not the deadline cutting the last attempt short
	for {
		var err error
		conn, err = d.DialContext(ctx, "tcp", addr)
		if err == nil {
			break
		}
		if ctx.Err() == nil || last == nil {
			last = err
		}
		nag.failed(err) // at once, then every few seconds: the store may simply not be up yet
		select {
		case <-ctx.Done():
			// Name the last refusal, not only the deadline: "connection refused" says nobody listens.
			return nil, fmt.Errorf("%w: no store at tcp://%s after %v: %w (%w)", ErrIO, addr,
				time.Since(start).Round(time.Millisecond), last, ctxErr(ctx.Err()))
		case <-time.After(100 * time.Millisecond):
		}
	}
	c := &tcpClient{cfg: cfg, addr: addr, log: cfg.Logger, pending: map[uint32]chan reply{}, rank: NoRank,
		world: cfg.WorldSize, stop: make(chan struct{}), watch: newRankWatchers()}
	rank := NoRank
	if cfg.Ranking == Explicit {
		rank = cfg.Rank
	}
	conn, err := c.handshake(ctx, conn, rank)
	if err != nil {
		_ = conn.Close()
		c.watch.close()
		return nil, err
	}
	c.rank = rank
	if err := c.start(conn); err != nil {
		_ = c.Close()
		return nil, err
	}
	// Upstream's server does not answer the subscription; it serves a link's requests in order,
	// so the answer to a request sent after it says the subscription is in place: no rank-down
	// after Open returns is missed.
	if _, err := c.Get(ctx, subscribedKey, 0); err != nil && !errors.Is(err, ErrNotExist) {
		_ = c.Close()
		return nil, err
	}
	if cfg.Ranking == Auto {
		if _, err := c.AssignRank(ctx); err != nil {
			_ = c.Close()
			return nil, err
		}
	}
	return c, nil
}

// start makes conn (handshaken) the client's link: its reader and heartbeat run, and it
// subscribes to rank-down events.
func (c *tcpClient) start(conn net.Conn) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		_ = conn.Close()
		return fmt.Errorf("%w: client closed", ErrIO)
	}
	l := &clientLink{conn: conn, subSeq: c.nextSeq(), done: make(chan struct{})}
	c.link, c.err = l, nil
	c.wg.Add(2)
	go c.readLoop(l)  // owned by c: the link's end or Close ends it
	go c.heartbeat(l) // owned by c: stops when the link ends
	c.mu.Unlock()
	return c.write((&message{Op: OpWatchRankDown, Keys: [][]byte{[]byte(rankDownKey)}}).frame(l.subSeq, CodeSuccess))
}

// handshake connects conn as rank (NoRank: none) and returns it (wrapped in TLS when
// configured).
func (c *tcpClient) handshake(ctx context.Context, conn net.Conn, rank int) (net.Conn, error) {
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if c.cfg.TLS != nil {
		tcfg := c.cfg.TLS
		if tcfg.ServerName == "" { // verify the store's certificate against the address dialled
			tcfg = tcfg.Clone()
			tcfg.ServerName, _, _ = net.SplitHostPort(conn.RemoteAddr().String())
		}
		tc := tls.Client(conn, tcfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			return conn, fmt.Errorf("%w: TLS with the store: %w", ErrAuth, err)
		}
		conn = tc
	}
	req := connectReq{Rank: noRankWire, World: uint32(c.cfg.WorldSize)}
	if rank != NoRank {
		req.Rank = uint32(rank)
	}
	if len(c.cfg.Secret) > 0 {
		req.Version = 1
	}
	reqb := req.encode()
	if _, err := conn.Write(reqb); err != nil {
		return conn, fmt.Errorf("%w: store handshake: %w", ErrIO, err)
	}
	first, err := readResult(conn)
	if err != nil {
		return conn, fmt.Errorf("%w: store handshake: %w", ErrIO, err)
	}
	if err := clientAuth(conn, c.cfg.Secret, reqb, first); err != nil {
		return conn, err
	}
	res := first
	if len(c.cfg.Secret) > 0 {
		if res, err = readResult(conn); err != nil {
			return conn, fmt.Errorf("%w: store handshake: %w", ErrIO, err)
		}
	}
	if res != CodeSuccess {
		why := readReason(conn)
		if why == "" { // a server that does not say why
			why = "no reason given"
			if req.Rank != noRankWire {
				why = "taken, or outside the store's world"
			}
		}
		if req.Rank != noRankWire {
			base := errFor(res)
			if strings.Contains(why, rankHeldReason) {
				base = ErrRankHeld
			}
			return conn, fmt.Errorf("%w: the store at tcp://%s refused rank %d in world %d: %s", base, c.addr, rank, c.cfg.WorldSize, why)
		}
		return conn, fmt.Errorf("%w: the store at tcp://%s refused the connection: %s", errFor(res), c.addr, why)
	}
	_ = conn.SetDeadline(time.Time{})
	return conn, nil
}

// nextSeq returns a fresh request id (never 0: heartbeats use it). Caller holds mu.
func (c *tcpClient) nextSeq() uint32 {
	c.seq++
	if c.seq == 0 {
		c.seq++
	}
	return c.seq
}

// write sends one frame on the current link.
func (c *tcpClient) write(f []byte) error {
	c.mu.Lock()
	l, err := c.link, c.err
	c.mu.Unlock()
	if err != nil {
		return err
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = l.conn.SetWriteDeadline(time.Now().Add(writeTimeout))
	if _, err := l.conn.Write(f); err != nil {
		_ = l.conn.Close() // a half-written frame ends the link; readLoop reports it
		return fmt.Errorf("%w: %w", ErrIO, err)
	}
	return nil
}

func (c *tcpClient) heartbeat(l *clientLink) {
	defer c.wg.Done()
	t := time.NewTicker(c.cfg.Heartbeat)
	defer t.Stop()
	f := (&message{Op: OpHeartbeat}).frame(0, CodeSuccess)
	for {
		select {
		case <-l.done:
			return
		case <-t.C:
			if c.write(f) != nil {
				return
			}
		}
	}
}

func (c *tcpClient) readLoop(l *clientLink) {
	defer c.wg.Done()
	hdr := make([]byte, headerLen)
	var err error
	for {
		var h header
		var body []byte
		h, body, err = readFrame(l.conn, hdr)
		if err != nil {
			break
		}
		if h.Seq == l.subSeq {
			// rank-down pushes; a subscription ack (older servers of ours) has no value
			if m, derr := decodeMessage(body); derr == nil && m.Op == OpWatchRankDown && len(m.Values) == 1 && len(m.Values[0]) == 4 {
				c.watch.post(int(binary.LittleEndian.Uint32(m.Values[0])))
			}
			continue
		}
		c.mu.Lock()
		ch := c.pending[h.Seq]
		delete(c.pending, h.Seq)
		c.mu.Unlock()
		if ch != nil {
			ch <- reply{code: h.Result, body: body, events: c.watch.posted()}
		}
	}
	c.lost(l, fmt.Errorf("%w: %w", ErrIO, err))
}

// lost ends link l with err: pending calls and calls until a new link get it; unless the
// client is closed, it dials again in the background.
func (c *tcpClient) lost(l *clientLink, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.link != l || c.err != nil {
		return
	}
	c.err = err
	close(l.done)
	_ = l.conn.Close()
	for seq, ch := range c.pending {
		delete(c.pending, seq)
		ch <- reply{code: CodeIOError, lost: true}
	}
	if c.closed {
		return
	}
	c.log.Warn("store link lost, dialling again", "url", "tcp://"+c.addr, "rank", c.rank, "err", err)
	c.wg.Add(1)
	go c.redial() // owned by c: Close stops it
}

// redial connects again, under the client's rank, until it succeeds or the client closes.
func (c *tcpClient) redial() {
	defer c.wg.Done()
	wait := redialMin
	for tries := 1; ; tries++ {
		select {
		case <-c.stop:
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, redialMax)
		c.mu.Lock()
		rank := c.rank
		c.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), max(c.cfg.Heartbeat, redialMax))
		conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", c.addr)
		if err == nil {
			if conn, err = c.handshake(ctx, conn, rank); err != nil {
				_ = conn.Close()
			}
		}
		cancel()
		if err != nil {
			if tries == 1 || tries%60 == 0 {
				c.log.Warn("store still unreachable, dialling again", "url", "tcp://"+c.addr, "rank", rank, "tries", tries, "err", err)
			}
			continue
		}
		if err := c.start(conn); err != nil {
			return // closed, or the new link broke at once: its reader dials again
		}
		c.log.Info("store link back", "url", "tcp://"+c.addr, "rank", rank, "tries", tries)
		return
	}
}

func (c *tcpClient) linkErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		return ErrIO
	}
	return c.err
}

// call sends m and waits for its reply (or ctx, or the link's end).
func (c *tcpClient) call(ctx context.Context, m *message) (Code, []byte, error) {
	if err := ctx.Err(); err != nil {
		return 0, nil, ctxErr(err)
	}
	ch := make(chan reply, 1)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return 0, nil, err
	}
	seq := c.nextSeq()
	c.pending[seq] = ch
	c.mu.Unlock()
	if err := c.write(m.frame(seq, CodeSuccess)); err != nil {
		return 0, nil, err
	}
	select {
	case r := <-ch:
		if r.lost {
			return 0, nil, c.linkErr()
		}
		// A rank-down the store sent before this reply reaches the callbacks first: a group
		// that reads a view made after a rank died has been told of the death by then.
		c.watch.await(ctx, r.events)
		return r.code, r.body, nil
	case <-ctx.Done():
		c.mu.Lock()
		delete(c.pending, seq)
		c.mu.Unlock()
		if m.Op == OpGet {
			_ = c.write((&message{Op: opCancel, UserDef: int64(seq)}).frame(0, CodeSuccess)) // best effort: frees the parked Get
		}
		return 0, nil, ctxErr(ctx.Err())
	}
}

// do runs one keyed operation and returns its first value.
func (c *tcpClient) do(ctx context.Context, op Op, key string, userDef int64, vals ...[]byte) ([]byte, bool, error) {
	if err := checkKey(key); err != nil {
		return nil, false, err
	}
	for _, v := range vals {
		if err := checkValue(v); err != nil {
			return nil, false, err
		}
	}
	code, body, err := c.call(ctx, &message{Op: op, UserDef: userDef, Keys: [][]byte{[]byte(key)}, Values: vals})
	if err != nil {
		return nil, false, err
	}
	if code != CodeSuccess {
		// Upstream's error replies are bare text; a packed one carries the text as its value.
		text := string(body)
		if m, derr := decodeMessage(body); derr == nil && len(m.Values) > 0 {
			text = string(m.Values[0])
		}
		if text != "" {
			text = ": " + text
		}
		return nil, false, fmt.Errorf("%w: %s %q%s", errFor(code), opName(op), key, text)
	}
	switch op {
	case OpGet, OpCAS: // packed: one value
		m, err := decodeMessage(body)
		if err != nil {
			return nil, false, err
		}
		if len(m.Values) == 0 {
			return nil, false, nil
		}
		v := append([]byte{}, m.Values[0]...) // non-nil: an empty value is not an absent key
		// CompareAndSwap's previous value is empty when the key was absent (upstream); our
		// server also sets userDef bit 0 when the key existed, telling absent from empty.
		return v, op == OpGet || len(v) > 0 || m.UserDef&casExisted != 0, nil
	case OpAdd, OpAppend: // bare: the decimal result
		return append([]byte(nil), body...), true, nil
	}
	return nil, false, nil // Set, Remove, Write: a bare "success"
}

func opName(op Op) string {
	switch op {
	case OpSet:
		return "Set"
	case OpGet:
		return "Get"
	case OpAdd:
		return "Add"
	case OpRemove:
		return "Remove"
	case OpAppend:
		return "Append"
	case OpCAS:
		return "CompareAndSwap"
	case OpWrite:
		return "Write"
	}
	return "op " + strconv.Itoa(int(op))
}

func (c *tcpClient) Set(ctx context.Context, key string, value []byte) error {
	_, _, err := c.do(ctx, OpSet, key, 0, value)
	return err
}

func (c *tcpClient) Get(ctx context.Context, key string, wait time.Duration) ([]byte, error) {
	ms := int64(0)
	switch {
	case wait < 0:
		ms = -1
	case wait > 0:
		ms = int64((wait + time.Millisecond - 1) / time.Millisecond)
	}
	v, _, err := c.do(ctx, OpGet, key, ms)
	if err == nil && v == nil {
		v = []byte{}
	}
	return v, err
}

func (c *tcpClient) Add(ctx context.Context, key string, delta int64) (int64, error) {
	v, _, err := c.do(ctx, OpAdd, key, 0, []byte(strconv.FormatInt(delta, 10)))
	if err != nil {
		return 0, err
	}
	return parseInt(v)
}

func parseInt(v []byte) (int64, error) {
	n, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: reply %q is not a decimal integer", ErrInvalidMessage, v)
	}
	return n, nil
}

func (c *tcpClient) Append(ctx context.Context, key string, value []byte) (int64, error) {
	v, _, err := c.do(ctx, OpAppend, key, 0, value)
	if err != nil {
		return 0, err
	}
	return parseInt(v)
}

func (c *tcpClient) CompareAndSwap(ctx context.Context, key string, expected, value []byte) ([]byte, error) {
	v, ok, err := c.do(ctx, OpCAS, key, 0, expected, value)
	if err != nil || !ok {
		return nil, err
	}
	return v, nil
}

func (c *tcpClient) Write(ctx context.Context, key string, offset uint32, value []byte) error {
	b := make([]byte, 4+len(value))
	binary.LittleEndian.PutUint32(b, offset)
	copy(b[4:], value)
	_, _, err := c.do(ctx, OpWrite, key, 0, b)
	return err
}

func (c *tcpClient) Remove(ctx context.Context, key string) error {
	_, _, err := c.do(ctx, OpRemove, key, 0)
	return err
}

func (c *tcpClient) Rank() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rank
}

func (c *tcpClient) WorldSize() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.world
}

func (c *tcpClient) AssignRank(ctx context.Context) (int, error) {
	v, _, err := c.do(ctx, OpGet, autoRankKey, 0)
	if err != nil {
		return NoRank, err
	}
	if len(v) != 4 {
		return NoRank, fmt.Errorf("%w: rank reply of %d bytes", ErrInvalidMessage, len(v))
	}
	r := int(binary.LittleEndian.Uint32(v))
	c.mu.Lock()
	c.rank = r
	c.mu.Unlock()
	return r, nil
}

func (c *tcpClient) WatchRankDown(fn func(rank int)) func() { return c.watch.add(fn) }

// RankLive implements Client: a Get of the server's reserved key for the rank.
func (c *tcpClient) RankLive(ctx context.Context, r int) (bool, error) {
	_, err := c.Get(ctx, rankLiveKey+strconv.Itoa(r), 0)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, ErrNotExist):
		return false, nil
	}
	return false, err
}

// Live implements Client: the link is up (its handshake claimed the rank).
func (c *tcpClient) Live(ctx context.Context) error {
	for {
		c.mu.Lock()
		err, closed := c.err, c.closed
		c.mu.Unlock()
		if err == nil || closed {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (%w)", err, ctxErr(ctx.Err()))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (c *tcpClient) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.stop)
	l := c.link
	if c.err != nil { // down: later calls say closed, not the old link's loss
		c.err = fmt.Errorf("%w: client closed", ErrIO)
	}
	c.mu.Unlock()
	if l != nil {
		c.lost(l, fmt.Errorf("%w: client closed", ErrIO))
	}
	c.wg.Wait()
	c.watch.close()
	return nil
}

// rankWatchers delivers rank-down events to callbacks, in order, from one goroutine; the
// queue is unbounded but holds at most one entry per lost link.
type rankWatchers struct {
	// Events are numbered as they are read; delivered counts those whose callbacks have run.
	// A reply read after event n waits (await) until delivered reaches n.
	npost, ndone atomic.Int64
	delivered    chan struct{} // closed and replaced when ndone moves

	mu     sync.Mutex
	fns    map[int]func(int)
	next   int
	queue  []int
	closed bool
	kick   chan struct{}
	done   chan struct{}
}

func newRankWatchers() *rankWatchers {
	w := &rankWatchers{fns: map[int]func(int){}, kick: make(chan struct{}, 1), done: make(chan struct{}), delivered: make(chan struct{})}
	go w.loop() // owned by w: close stops and waits
	return w
}

func (w *rankWatchers) add(fn func(int)) func() {
	w.mu.Lock()
	id := w.next
	w.next++
	w.fns[id] = fn
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		delete(w.fns, id)
		w.mu.Unlock()
	}
}

// posted returns how many events were read so far.
func (w *rankWatchers) posted() int64 { return w.npost.Load() }

// await returns once the first n events' callbacks have run, ctx ends, the watchers stop, or
// awaitMax passed: a callback that itself calls the store (and so waits for its own event)
// costs that much, not a deadlock.
func (w *rankWatchers) await(ctx context.Context, n int64) {
	if w.ndone.Load() >= n {
		return
	}
	limit := time.NewTimer(awaitMax)
	defer limit.Stop()
	for w.ndone.Load() < n {
		w.mu.Lock()
		ch, closed := w.delivered, w.closed
		w.mu.Unlock()
		if closed || w.ndone.Load() >= n {
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return
		case <-w.done:
			return
		case <-limit.C:
			return
		}
	}
}

// awaitMax bounds a reply's wait for earlier rank-down callbacks.
const awaitMax = 100 * time.Millisecond

func (w *rankWatchers) post(rank int) {
	w.mu.Lock()
	w.queue = append(w.queue, rank)
	w.npost.Add(1)
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

func (w *rankWatchers) close() {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		<-w.done
		return
	}
	w.closed = true
	w.mu.Unlock()
	close(w.kick)
	<-w.done
}

func (w *rankWatchers) loop() {
	defer close(w.done)
	for range w.kick {
		for {
			w.mu.Lock()
			if len(w.queue) == 0 {
				w.mu.Unlock()
				break
			}
			r := w.queue[0]
			w.queue = w.queue[1:]
			fns := make([]func(int), 0, len(w.fns))
			for _, f := range w.fns {
				fns = append(fns, f)
			}
			w.mu.Unlock()
			for _, f := range fns {
				f(r)
			}
			w.mu.Lock()
			w.ndone.Add(1)
			close(w.delivered)
			w.delivered = make(chan struct{})
			w.mu.Unlock()
		}
	}
}

var _ Client = (*tcpClient)(nil)
