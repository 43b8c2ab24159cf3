package store

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hmc-go/hmc/internal/acceptor"
)

// ServerConfig configures the embedded store server. The zero value serves without a world
// size (learned from the first ranked client), secret or TLS.
type ServerConfig struct {
	// WorldSize bounds ranks (≤ MaxWorldSize); 0 takes the first ranked client's.
	WorldSize int
	// Secret, when set, is demanded from every client (HMAC challenge, both directions).
	Secret []byte
	// TLS, when set, serves TLS 1.3 only; set ClientAuth to tls.RequireAndVerifyClientCert
	// and ClientCAs for mutual authentication.
	TLS *tls.Config
	// LinkTimeout drops a link silent for that long (clients ping every Heartbeat). Default 8 s.
	LinkTimeout time.Duration
	// HandshakeTimeout bounds a new link's connect request, secret and TLS. Default 10 s.
	HandshakeTimeout time.Duration
	// MaxQueued bounds the reply bytes queued for one link; past it the link is dropped (a
	// client that does not read). Default 64 MiB.
	MaxQueued int
	// Logger receives link events; nil discards them.
	Logger *slog.Logger
	// OnEvent, if set, is told of link and rank events as they happen: "rank_joined",
	// "rank_left" (its client closed the link), "rank_lost" (the link was lost), "refused" (a
	// client refused at connect: bad request, authentication, rank taken), with the rank
	// concerned (NoRank when none). It must not block (metrics.Metrics.StoreEvent counts them).
	OnEvent func(event string, rank int)
}

// Server is the embedded config store: the whole job state in memory, served over TCP.
type Server struct {
	cfg  ServerConfig
	ln   net.Listener
	acc  *acceptor.Server[net.Conn]
	log  *slog.Logger
	stop chan struct{}
	wg   sync.WaitGroup

	mu       sync.Mutex
	kv       map[string][]byte
	waiters  map[string]map[*waiter]struct{}
	links    map[*link]struct{}
	rankLink map[int]*link
	world    int
	closed   bool
}

type waiter struct {
	l     *link
	seq   uint32
	key   string
	timer *time.Timer
}

// link is one client connection on the server.
type link struct {
	conn     net.Conn
	rank     int                // guarded by Server.mu
	waits    map[uint32]*waiter // parked Gets by seq; guarded by Server.mu
	subSeq   uint32             // rank-down subscription seq; guarded by Server.mu
	sub      bool               // guarded by Server.mu
	lastSeen atomic.Int64

	qmu    sync.Mutex
	q      [][]byte // frames to write; guarded by qmu
	qbytes int      // guarded by qmu
	qdead  bool     // guarded by qmu
	kick   chan struct{}
}

// Listen starts an embedded store on url (tcp://ip:port; port 0 picks one).
func Listen(url string, cfg ServerConfig) (*Server, error) {
	rest, ok := strings.CutPrefix(url, "tcp://")
	if !ok {
		return nil, fmt.Errorf("%w: store server url %q: want tcp://ip:port", ErrInvalidKey, url)
	}
	addr, err := ParseTCPAddr(rest)
	if err != nil {
		return nil, err
	}
	if cfg.WorldSize < 0 || cfg.WorldSize > MaxWorldSize {
		return nil, fmt.Errorf("%w: world size %d outside 0..%d", ErrInvalidKey, cfg.WorldSize, MaxWorldSize)
	}
	if cfg.LinkTimeout <= 0 {
		cfg.LinkTimeout = 8 * time.Second
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = 10 * time.Second
	}
	if cfg.MaxQueued <= 0 {
		cfg.MaxQueued = 64 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.TLS != nil {
		cfg.TLS = cfg.TLS.Clone()
		cfg.TLS.MinVersion = tls.VersionTLS13
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("store: listen %s: %w", addr, err)
	}
	s := &Server{
		cfg: cfg, ln: ln, log: cfg.Logger, stop: make(chan struct{}),
		kv: map[string][]byte{}, waiters: map[string]map[*waiter]struct{}{},
		links: map[*link]struct{}{}, rankLink: map[int]*link{}, world: cfg.WorldSize,
	}
	s.acc = acceptor.Start[net.Conn](ln, ln.Accept, s.serve, s.log, "store")
	s.wg.Add(1)
	go s.sweep() // owned by s: Close stops it
	return s, nil
}

// Addr returns the listening address (host:port).
func (s *Server) Addr() string { return s.ln.Addr().String() }

// URL returns the tcp:// URL clients open.
func (s *Server) URL() string { return "tcp://" + s.Addr() }

// Close stops the server: every link is closed (clients see ErrIO) and all state dropped.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	close(s.stop)
	err := s.acc.Close()
	s.wg.Wait()
	return err
}

// sweep drops links that stayed silent past LinkTimeout.
func (s *Server) sweep() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.LinkTimeout / 4)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case now := <-t.C:
			s.mu.Lock()
			for l := range s.links {
				if now.Sub(time.Unix(0, l.lastSeen.Load())) > s.cfg.LinkTimeout {
					s.log.Warn("store: link silent, dropping", "remote", l.conn.RemoteAddr(), "rank", l.rank)
					_ = l.conn.Close() // its serve loop sees the error and drops the link
				}
			}
			s.mu.Unlock()
		}
	}
}

// serve runs one link: handshake, then requests until the connection ends.
func (s *Server) serve(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	_ = c.SetDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
	if s.cfg.TLS != nil {
		tc := tls.Server(c, s.cfg.TLS)
		if err := tc.Handshake(); err != nil {
			s.log.Warn("store: TLS handshake failed", "remote", c.RemoteAddr(), "err", err)
			return
		}
		c = tc
	}
	reqb := make([]byte, connectReqLen)
	if _, err := io.ReadFull(c, reqb); err != nil {
		return
	}
	req, err := decodeConnectReq(reqb)
	if err != nil {
		s.log.Warn("store: bad connect request", "remote", c.RemoteAddr(), "err", err)
		s.event("refused", NoRank)
		_ = writeRefusal(c, CodeOf(err), err)
		return
	}
	if len(s.cfg.Secret) > 0 {
		if err := serverAuth(c, s.cfg.Secret, reqb); err != nil {
			s.log.Warn("store: authentication failed", "remote", c.RemoteAddr(), "err", err)
			s.event("refused", NoRank)
			return
		}
	}
	l := &link{conn: c, rank: NoRank, waits: map[uint32]*waiter{}, kick: make(chan struct{}, 1)}
	l.lastSeen.Store(time.Now().UnixNano())
	if err := s.addLink(l, req); err != nil {
		s.log.Warn("store: link refused", "remote", c.RemoteAddr(), "err", err)
		rank := NoRank
		if req.Rank != noRankWire {
			rank = int(req.Rank)
		}
		s.event("refused", rank)
		_ = writeRefusal(c, CodeOf(err), err)
		return
	}
	var endErr error // why the link ended: io.EOF is a client that closed it
	defer func() { s.dropLink(l, endErr) }()
	if err := writeResult(c, CodeSuccess); err != nil {
		return
	}
	_ = c.SetDeadline(time.Time{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); s.writeLoop(l) }() // owned by serve: waits below
	defer wg.Wait()
	defer l.kill()
	hdr := make([]byte, headerLen)
	for {
		h, body, err := readFrame(c, hdr)
		if err != nil {
			endErr = err
			if errors.Is(err, ErrInvalidMessage) {
				s.log.Warn("store: bad frame, dropping link", "remote", c.RemoteAddr(), "err", err)
			}
			return
		}
		l.lastSeen.Store(time.Now().UnixNano())
		m, err := decodeMessage(body)
		if err != nil {
			s.log.Warn("store: bad message, dropping link", "remote", c.RemoteAddr(), "err", err)
			return
		}
		s.handle(l, h.Seq, m)
	}
}

func (s *Server) addLink(l *link, req connectReq) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrIO
	}
	if req.World > 0 {
		if s.world == 0 {
			s.world = int(req.World)
		} else if s.world != int(req.World) {
			return fmt.Errorf("%w: world size %d, the store's is %d", ErrFailed, req.World, s.world)
		}
	}
	if req.Rank != noRankWire {
		r := int(req.Rank)
		if s.world > 0 && r >= s.world {
			return fmt.Errorf("%w: rank %d outside world of %d", ErrFailed, r, s.world)
		}
		if _, taken := s.rankLink[r]; taken {
			return fmt.Errorf("%w: rank %d "+rankHeldReason, ErrRankHeld, r)
		}
		s.rankLink[r] = l
		l.rank = r
		s.event("rank_joined", r)
	}
	s.links[l] = struct{}{}
	return nil
}

// event tells ServerConfig.OnEvent, if set.
func (s *Server) event(what string, rank int) {
	if s.cfg.OnEvent != nil {
		s.cfg.OnEvent(what, rank)
	}
}

// dropLink forgets a link: its parked Gets, its rank (reported to subscribers), and the whole
// job state when it was the last. why is how the link ended (io.EOF: the client closed it).
func (s *Server) dropLink(l *link, why error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.links, l)
	for _, w := range l.waits {
		s.unpark(w)
	}
	if l.rank != NoRank {
		delete(s.rankLink, l.rank)
		// Subscribers get the same rank-down event either way (upstream's semantics); the log
		// says which it was.
		switch {
		case errors.Is(why, io.EOF):
			s.log.Info("store: rank left (its client closed the link)", "rank", l.rank)
			s.event("rank_left", l.rank)
		case s.closed: // this server is closing: it ended the link, nothing was lost
			s.log.Info("store: rank's link closed (the store is shutting down)", "rank", l.rank)
			s.event("rank_left", l.rank)
		default:
			s.log.Warn("store: rank down (link lost)", "rank", l.rank, "err", why)
			s.event("rank_lost", l.rank)
		}
		var v [4]byte
		binary.LittleEndian.PutUint32(v[:], uint32(l.rank))
		for o := range s.links {
			if o.sub {
				o.send((&message{Op: OpWatchRankDown, Values: [][]byte{v[:]}}).frame(o.subSeq, CodeSuccess), s.cfg.MaxQueued)
			}
		}
		l.rank = NoRank
	}
	if len(s.links) == 0 {
		s.kv = map[string][]byte{}
		s.waiters = map[string]map[*waiter]struct{}{}
		s.world = s.cfg.WorldSize
	}
}

// send queues a frame for l's writer; a link past its queue bound is killed.
func (l *link) send(f []byte, max int) {
	l.qmu.Lock()
	if l.qdead {
		l.qmu.Unlock()
		return
	}
	if l.qbytes+len(f) > max {
		l.qdead = true
		l.qmu.Unlock()
		_ = l.conn.Close() // slow consumer: drop the link, its serve loop cleans up
		return
	}
	l.q = append(l.q, f)
	l.qbytes += len(f)
	l.qmu.Unlock()
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

func (l *link) kill() {
	l.qmu.Lock()
	l.qdead = true
	l.qmu.Unlock()
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

func (s *Server) writeLoop(l *link) {
	for range l.kick {
		l.qmu.Lock()
		q, dead := l.q, l.qdead
		l.q, l.qbytes = nil, 0
		l.qmu.Unlock()
		if len(q) > 0 {
			bufs := net.Buffers(q)
			if _, err := bufs.WriteTo(l.conn); err != nil {
				_ = l.conn.Close() // the reader sees it and the link is dropped
				return
			}
		}
		if dead {
			return
		}
	}
}

// unpark removes a parked Get (without answering it). Caller holds s.mu.
func (s *Server) unpark(w *waiter) {
	w.timer.Stop()
	delete(w.l.waits, w.seq)
	if ws := s.waiters[w.key]; ws != nil {
		delete(ws, w)
		if len(ws) == 0 {
			delete(s.waiters, w.key)
		}
	}
}

// created answers every Get parked on key. Caller holds s.mu.
func (s *Server) created(key string, v []byte) {
	for w := range s.waiters[key] {
		w.timer.Stop()
		delete(w.l.waits, w.seq)
		w.l.send((&message{Op: OpGet, Values: [][]byte{v}}).frame(w.seq, CodeSuccess), s.cfg.MaxQueued)
	}
	delete(s.waiters, key)
}

// handle runs one request and queues its reply.
func (s *Server) handle(l *link, seq uint32, m *message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// Replies are upstream's: Get's value and CompareAndSwap's previous value go packed in a
	// message; everything else (results of Add and Append, "success", errors) is a bare body.
	packed := func(c Code, userDef int64, vals ...[]byte) {
		l.send((&message{Op: m.Op, UserDef: userDef, Values: vals}).frame(seq, c), s.cfg.MaxQueued)
	}
	bare := func(c Code, body string) { l.send(bareFrame(seq, c, body), s.cfg.MaxQueued) }
	fail := func(err error) { bare(CodeOf(err), err.Error()) }
	switch m.Op {
	case OpHeartbeat:
		return
	case opCancel:
		if w := l.waits[uint32(m.UserDef)]; w != nil {
			s.unpark(w)
		}
		return
	case OpWatchRankDown:
		l.sub, l.subSeq = true, seq // no answer (as upstream): events follow under this seq
		return
	}
	if len(m.Keys) != 1 || len(m.Keys[0]) == 0 {
		fail(fmt.Errorf("%w: %d keys", ErrInvalidKey, len(m.Keys)))
		return
	}
	key := string(m.Keys[0])
	old, exists := s.kv[key]
	need := func(n int) bool {
		if len(m.Values) != n {
			fail(fmt.Errorf("%w: op %d wants %d values, got %d", ErrInvalidMessage, m.Op, n, len(m.Values)))
			return false
		}
		return true
	}
	switch m.Op {
	case OpSet:
		if !need(1) {
			return
		}
		s.kv[key] = m.Values[0]
		if !exists {
			s.created(key, m.Values[0])
		}
		bare(CodeSuccess, "success")
	case OpGet:
		if key == autoRankKey {
			r, err := s.assignRank(l)
			if err != nil {
				fail(err)
				return
			}
			var v [4]byte
			binary.LittleEndian.PutUint32(v[:], uint32(r))
			packed(CodeSuccess, 0, v[:])
			return
		}
		if r, ok := strings.CutPrefix(key, rankLiveKey); ok && r != "" {
			n, err := strconv.Atoi(r)
			if _, live := s.rankLink[n]; err == nil && live {
				packed(CodeSuccess, 0, []byte("1"))
			} else {
				bare(CodeNotExist, "<not exist>")
			}
			return
		}
		if exists {
			packed(CodeSuccess, 0, old)
			return
		}
		if m.UserDef == 0 {
			bare(CodeNotExist, "<not exist>")
			return
		}
		if _, dup := l.waits[seq]; dup {
			fail(fmt.Errorf("%w: seq %d already waiting", ErrInvalidMessage, seq))
			return
		}
		w := &waiter{l: l, seq: seq, key: key}
		d := time.Duration(m.UserDef) * time.Millisecond
		if m.UserDef < 0 {
			d = 1<<63 - 1
		}
		w.timer = time.AfterFunc(d, func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if l.waits[seq] == w {
				s.unpark(w)
				l.send(bareFrame(seq, CodeTimeout, "<timeout>"), s.cfg.MaxQueued)
			}
		})
		l.waits[seq] = w
		if s.waiters[key] == nil {
			s.waiters[key] = map[*waiter]struct{}{}
		}
		s.waiters[key][w] = struct{}{}
	case OpAdd:
		if !need(1) {
			return
		}
		delta, err := strconv.ParseInt(string(m.Values[0]), 10, 64)
		if err != nil {
			fail(fmt.Errorf("%w: Add of %q", ErrInvalidMessage, m.Values[0]))
			return
		}
		var cur int64
		if exists {
			if cur, err = strconv.ParseInt(string(old), 10, 64); err != nil {
				fail(fmt.Errorf("%w: Add on %q, not a decimal integer", ErrFailed, key))
				return
			}
		}
		nv := []byte(strconv.FormatInt(cur+delta, 10))
		s.kv[key] = nv
		if !exists {
			s.created(key, nv)
		}
		bare(CodeSuccess, string(nv))
	case OpRemove:
		if !exists {
			bare(CodeNotExist, "not exist")
			return
		}
		delete(s.kv, key)
		bare(CodeSuccess, "success")
	case OpAppend:
		if !need(1) {
			return
		}
		if len(old)+len(m.Values[0]) > MaxValueLen {
			fail(fmt.Errorf("%w: Append would make %q longer than %d bytes", ErrInvalidMessage, key, MaxValueLen))
			return
		}
		nv := append(old[:len(old):len(old)], m.Values[0]...)
		s.kv[key] = nv
		if !exists {
			s.created(key, nv)
		}
		bare(CodeSuccess, strconv.Itoa(len(nv)))
	case OpCAS:
		if !need(2) {
			return
		}
		exp, nv := m.Values[0], m.Values[1]
		if (exists && bytes.Equal(old, exp)) || (!exists && len(exp) == 0) {
			s.kv[key] = nv
			if !exists {
				s.created(key, nv)
			}
		}
		if !exists {
			packed(CodeSuccess, 0, nil) // upstream: one value, empty, when the key was absent
			return
		}
		packed(CodeSuccess, casExisted, old) // extension: userDef bit 0 tells an empty value from none
	case OpWrite:
		if !need(1) {
			return
		}
		if len(m.Values[0]) < 4 {
			fail(fmt.Errorf("%w: Write without an offset", ErrInvalidMessage))
			return
		}
		off := int(binary.LittleEndian.Uint32(m.Values[0]))
		data := m.Values[0][4:]
		if off+len(data) > MaxValueLen {
			fail(fmt.Errorf("%w: Write at %d of %d bytes past %d", ErrInvalidMessage, off, len(data), MaxValueLen))
			return
		}
		nv := old
		if off+len(data) > len(old) {
			nv = make([]byte, off+len(data))
			copy(nv, old)
		} else {
			nv = append([]byte(nil), old...) // replies already queued keep the old bytes
		}
		copy(nv[off:], data)
		s.kv[key] = nv
		if !exists {
			s.created(key, nv)
		}
		bare(CodeSuccess, "success")
	default:
		fail(fmt.Errorf("%w: unknown op %d", ErrInvalidMessage, m.Op))
	}
}

// assignRank gives l the lowest free rank. Caller holds s.mu.
func (s *Server) assignRank(l *link) (int, error) {
	if l.rank != NoRank {
		return l.rank, nil
	}
	if s.world == 0 {
		return NoRank, fmt.Errorf("%w: the store has no world size for automatic ranks", ErrFailed)
	}
	for r := 0; r < s.world; r++ {
		if _, taken := s.rankLink[r]; !taken {
			s.rankLink[r] = l
			l.rank = r
			return r, nil
		}
	}
	return NoRank, fmt.Errorf("%w: all %d ranks are taken", ErrFailed, s.world)
}

// ServeOrJoin is upstream's "store racing": it starts a server on url if the address is free
// and opens a client to it either way. srv is nil when another process serves.
func ServeOrJoin(ctx context.Context, url string, scfg ServerConfig, cfg Config) (c Client, srv *Server, err error) {
	srv, err = Listen(url, scfg)
	if err != nil && !isAddrInUse(err) {
		return nil, nil, err
	}
	if srv != nil {
		url = srv.URL()
	}
	c, err = Open(ctx, url, cfg)
	if err != nil {
		if srv != nil {
			_ = srv.Close()
		}
		return nil, nil, err
	}
	return c, srv, nil
}

func isAddrInUse(err error) bool { return errors.Is(err, syscall.EADDRINUSE) }
