package comm

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/ctrl"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/tcp"
)

// CtrlLink says how to reach a peer's control plane (upstream Communicator::CtrlLink).
type CtrlLink struct {
	Transport ctrl.Transport // TCP or UDS
	IP        string         // TCP: the peer's control IP
	Port      int            // TCP: the peer's control port
	UDSPath   string         // UDS: the full path of the peer's socket (see ctrl.UDSPathFor)
}

// Config configures a Communicator. The zero value of each field means its default.
type Config struct {
	// NumChannels is the number of lanes per data connection (HMC's num_chs); 0 means the
	// transport's default.
	NumChannels int
	// TCP configures the TCP transport.
	TCP tcp.Config
	// Ctrl configures the control plane.
	Ctrl ctrl.Config
	// Stream configures SendDataTo/RecvDataFrom.
	Stream StreamConfig
	// OnRemoteWrite, if set, is called after a peer's put of n bytes at off has landed in this
	// Communicator's buffer, from the transport goroutine that served it; it must not block.
	// Use it to wait for data instead of polling the buffer (see transport.ServerConfig.OnWrite).
	OnRemoteWrite func(off, n uint64)
	// Logger receives connection events; nil means silent.
	Logger *slog.Logger
}

type peerKey struct {
	ip   string
	port int
	conn transport.ConnType
}

type peerEP struct {
	ep   transport.Endpoint
	rank uint32
}

type accepted struct {
	rank       uint32
	ip         string
	listenPort int
	conn       transport.ConnType
}

// Communicator binds one ConnBuffer to many peers. Its methods are safe for concurrent use. It
// does not own the buffer: close the Communicator before the buffer.
type Communicator struct {
	buf    *buffer.ConnBuffer
	cfg    Config
	ctrl   *ctrl.Manager
	trans  map[transport.ConnType]transport.Transport
	log    *slog.Logger
	opIDs  atomic.Uint64
	stream sync.Mutex // one SendDataTo at a time per Communicator keeps stream messages apart

	mu       sync.Mutex
	servers  map[transport.ConnType]transport.Server // guarded by mu
	eps      map[peerKey]*peerEP                     // guarded by mu
	accepted map[peerKey]accepted                    // initiators seen by our servers, by (ip, their listen port); guarded by mu
	ops      map[uint64]*transport.Op                // guarded by mu
	selfRank uint32                                  // from the last ConnectTo; guarded by mu
	closed   bool                                    // guarded by mu
}

// New returns a Communicator over buf. Nothing listens or connects until InitServer or
// ConnectTo.
func New(buf *buffer.ConnBuffer, cfg Config) (*Communicator, error) {
	if buf == nil {
		return nil, fmt.Errorf("comm: nil buffer: %w", status.ErrInvalidConfig)
	}
	if cfg.NumChannels < 0 {
		return nil, fmt.Errorf("comm: %d channels: %w", cfg.NumChannels, status.ErrInvalidConfig)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.TCP.Logger == nil {
		cfg.TCP.Logger = cfg.Logger
	}
	if cfg.Ctrl.Logger == nil {
		cfg.Ctrl.Logger = cfg.Logger
	}
	if err := cfg.Stream.validate(buf.Size()); err != nil {
		return nil, err
	}
	t, err := tcp.New(cfg.TCP)
	if err != nil {
		return nil, err
	}
	m, err := ctrl.New(cfg.Ctrl)
	if err != nil {
		return nil, err
	}
	return &Communicator{
		buf:      buf,
		cfg:      cfg,
		ctrl:     m,
		trans:    map[transport.ConnType]transport.Transport{transport.TCP: t},
		log:      cfg.Logger,
		servers:  make(map[transport.ConnType]transport.Server),
		eps:      make(map[peerKey]*peerEP),
		accepted: make(map[peerKey]accepted),
		ops:      make(map[uint64]*transport.Op),
	}, nil
}

// Buffer returns the Communicator's ConnBuffer.
func (c *Communicator) Buffer() *buffer.ConnBuffer { return c.buf }

// Ctrl returns the control plane, for the CtrlSocketManager operations not wrapped here.
func (c *Communicator) Ctrl() *ctrl.Manager { return c.ctrl }

// transportFor resolves AUTO and reports unbuilt transports.
func (c *Communicator) transportFor(ct transport.ConnType) (transport.ConnType, transport.Transport, error) {
	if ct == transport.AUTO {
		// Same-host shared memory and UCX/RDMA selection arrive with their transports; TCP is
		// the transport that is always available.
		ct = transport.TCP
	}
	if t, ok := c.trans[ct]; ok {
		return ct, t, nil
	}
	switch ct {
	case transport.RDMA, transport.UCX, transport.SHM:
		return ct, nil, fmt.Errorf("comm: connection type %v: %w: not built into this binary yet (use tcp or auto)", ct, status.ErrUnsupported)
	}
	return ct, nil, fmt.Errorf("comm: connection type %d: %w", int(ct), status.ErrInvalidConfig)
}

// InitServer starts the control plane listeners (TCP on bindIP:ctrlTCPPort when ctrlTCPPort
// >= 0, and a Unix socket at ctrlUDSPath when non-empty) and a data server of type ct on
// bindIP:dataPort. Port 0 picks a free port (see DataAddr, CtrlAddr). Every bind error is
// returned. Calling it again for another ConnType adds that data server; the control listeners
// start once.
func (c *Communicator) InitServer(bindIP string, dataPort, ctrlTCPPort int, ctrlUDSPath string, ct transport.ConnType) error {
	if dataPort < 0 || dataPort > 65535 {
		return fmt.Errorf("comm: data port %d: %w", dataPort, status.ErrInvalidConfig)
	}
	ct, t, err := c.transportFor(ct)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("comm: %w", status.ErrClosed)
	}
	if _, ok := c.servers[ct]; ok {
		return nil // as upstream: a second call for the same type is a no-op
	}
	if c.ctrl.TCPAddr() == nil && c.ctrl.UDSPath() == "" && (ctrlTCPPort >= 0 || ctrlUDSPath != "") {
		if err := c.ctrl.Listen(bindIP, ctrlTCPPort, ctrlUDSPath); err != nil {
			return fmt.Errorf("comm: init server: %w", err)
		}
	}
	srv, err := t.Listen(transport.ServerConfig{
		BindAddr: net.JoinHostPort(bindIP, strconv.Itoa(dataPort)),
		Region:   c.buf,
		OnAccept: func(p transport.PeerInfo) { c.onAccept(ct, p) },
		OnWrite:  c.cfg.OnRemoteWrite,
	})
	if err != nil {
		return fmt.Errorf("comm: init server: %w", err)
	}
	c.servers[ct] = srv
	c.log.Info("hmc: data server listening", "transport", ct, "addr", srv.Addr())
	return nil
}

func (c *Communicator) onAccept(ct transport.ConnType, p transport.PeerInfo) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.accepted[peerKey{p.IP, p.ListenPort, ct}] = accepted{rank: p.Rank, ip: p.IP, listenPort: p.ListenPort, conn: ct}
	c.log.Info("hmc: peer connected", "rank", p.Rank, "ip", p.IP, "listen_port", p.ListenPort, "transport", ct)
}

// DataAddr returns the address of the data server of type ct ("host:port"), or "".
func (c *Communicator) DataAddr(ct transport.ConnType) string {
	ct, _, _ = c.transportFor(ct)
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.servers[ct]; ok {
		return s.Addr()
	}
	return ""
}

// CtrlAddr returns the control plane's TCP listen address, or nil.
func (c *Communicator) CtrlAddr() *net.TCPAddr { return c.ctrl.TCPAddr() }

// ConnectTo connects the control plane to rank peerID (introducing this process as selfID)
// and a data endpoint of type ct to peerIP:dataPort. If an endpoint for (peerIP, dataPort, ct)
// exists it returns at once. If the data connection fails, the new control link is closed.
func (c *Communicator) ConnectTo(ctx context.Context, peerID, selfID uint32, peerIP string, dataPort int, link CtrlLink, ct transport.ConnType) error {
	ct, t, err := c.transportFor(ct)
	if err != nil {
		return err
	}
	if dataPort <= 0 || dataPort > 65535 {
		return fmt.Errorf("comm: data port %d: %w", dataPort, status.ErrInvalidConfig)
	}
	key := peerKey{peerIP, dataPort, ct}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return fmt.Errorf("comm: %w", status.ErrClosed)
	}
	c.selfRank = selfID
	_, exists := c.eps[key]
	c.mu.Unlock()
	if exists {
		return nil
	}
	if err := c.connectCtrl(ctx, peerID, selfID, link); err != nil {
		return err
	}
	if err := c.dialData(ctx, key, t, peerID, selfID); err != nil {
		_ = c.ctrl.ClosePeer(peerID) // undo the half-made connection; the data error is reported
		return err
	}
	return nil
}

func (c *Communicator) connectCtrl(ctx context.Context, peerID, selfID uint32, link CtrlLink) error {
	switch link.Transport {
	case ctrl.UDS:
		if link.UDSPath == "" {
			return fmt.Errorf("comm: UDS control link without a path: %w", status.ErrInvalidConfig)
		}
		return c.ctrl.DialUDS(ctx, peerID, selfID, link.UDSPath)
	case ctrl.TCP:
		if link.IP == "" || link.Port <= 0 || link.Port > 65535 {
			return fmt.Errorf("comm: TCP control link %q:%d: %w", link.IP, link.Port, status.ErrInvalidConfig)
		}
		return c.ctrl.DialTCP(ctx, peerID, selfID, net.JoinHostPort(link.IP, strconv.Itoa(link.Port)))
	}
	return fmt.Errorf("comm: control transport %v: %w", link.Transport, status.ErrInvalidConfig)
}

func (c *Communicator) dialData(ctx context.Context, key peerKey, t transport.Transport, peerID, selfID uint32) error {
	listenPort := 0
	c.mu.Lock()
	if s, ok := c.servers[key.conn]; ok {
		_, p, _ := net.SplitHostPort(s.Addr())
		listenPort, _ = strconv.Atoi(p)
	}
	c.mu.Unlock()
	ep, err := t.Dial(ctx, transport.DialConfig{
		Addr:       net.JoinHostPort(key.ip, strconv.Itoa(key.port)),
		Local:      c.buf,
		Rank:       selfID,
		ListenPort: listenPort,
		Lanes:      c.cfg.NumChannels,
	})
	if err != nil {
		return fmt.Errorf("comm: connect to rank %d at %s:%d: %w", peerID, key.ip, key.port, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		_ = ep.Close() // raced with Close
		return fmt.Errorf("comm: %w", status.ErrClosed)
	}
	if old, ok := c.eps[key]; ok { // a concurrent ConnectTo won; keep its endpoint
		_ = ep.Close()
		_ = old
		return nil
	}
	c.eps[key] = &peerEP{ep: ep, rank: peerID}
	c.log.Info("hmc: connected", "rank", peerID, "addr", key.ip, "port", key.port, "transport", key.conn)
	return nil
}

// endpoint returns the endpoint for (ip, port, ct). A peer that connected to our server with
// its own data listener on (ip, port) is dialed back on first use ("connect once, use both
// ways"), so a target can put to and get from its initiators.
func (c *Communicator) endpoint(ctx context.Context, ip string, port int, ct transport.ConnType) (transport.Endpoint, error) {
	ct, t, err := c.transportFor(ct)
	if err != nil {
		return nil, err
	}
	key := peerKey{ip, port, ct}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, fmt.Errorf("comm: %w", status.ErrClosed)
	}
	pe, ok := c.eps[key]
	acc, known := c.accepted[key]
	self := c.selfRank
	c.mu.Unlock()
	if ok {
		return pe.ep, nil
	}
	if !known || port == 0 {
		return nil, fmt.Errorf("comm: no %v connection to %s:%d: %w", ct, ip, port, status.ErrNotFound)
	}
	if err := c.dialData(ctx, key, t, acc.rank, self); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if pe, ok := c.eps[key]; ok {
		return pe.ep, nil
	}
	return nil, fmt.Errorf("comm: %s:%d: %w", ip, port, status.ErrClosed)
}

// CheckConn returns nil if a data endpoint to (ip, port, ct) exists or can be made from a peer
// that connected to us, else an error wrapping ErrNotFound.
func (c *Communicator) CheckConn(ip string, port int, ct transport.ConnType) error {
	ct, _, err := c.transportFor(ct)
	if err != nil {
		return err
	}
	key := peerKey{ip, port, ct}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.eps[key]; ok {
		return nil
	}
	if _, ok := c.accepted[key]; ok && port != 0 {
		return nil
	}
	return fmt.Errorf("comm: no %v connection to %s:%d: %w", ct, ip, port, status.ErrNotFound)
}

// PeerRank returns the rank of the peer at (ip, port, ct), dialed or accepted. Port 0 matches
// the only peer seen from ip, if there is exactly one.
func (c *Communicator) PeerRank(ip string, port int, ct transport.ConnType) (uint32, error) {
	ct, _, err := c.transportFor(ct)
	if err != nil {
		return 0, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if pe, ok := c.eps[peerKey{ip, port, ct}]; ok {
		return pe.rank, nil
	}
	if a, ok := c.accepted[peerKey{ip, port, ct}]; ok {
		return a.rank, nil
	}
	if port == 0 {
		var found []uint32
		for k, a := range c.accepted {
			if k.ip == ip && k.conn == ct {
				found = append(found, a.rank)
			}
		}
		if len(found) == 1 {
			return found[0], nil
		}
	}
	return 0, fmt.Errorf("comm: no peer known at %s:%d over %v: %w", ip, port, ct, status.ErrNotFound)
}

// Disconnect closes the data endpoint to (ip, port, ct) and the control link to its rank.
// Transfers in flight on it fail with ErrClosed. Disconnecting an unknown peer returns nil, as
// upstream.
func (c *Communicator) Disconnect(ip string, port int, ct transport.ConnType) error {
	ct, _, err := c.transportFor(ct)
	if err != nil {
		return err
	}
	key := peerKey{ip, port, ct}
	c.mu.Lock()
	pe, ok := c.eps[key]
	delete(c.eps, key)
	delete(c.accepted, key)
	c.mu.Unlock()
	if !ok {
		return nil
	}
	_ = c.ctrl.ClosePeer(pe.rank) // the link may already be gone; the endpoint is what matters
	return pe.ep.Close()
}

// CloseServer stops the data servers and the control plane (listeners and every control
// connection, as upstream closeCtrl). Unlike upstream it never exits the process.
func (c *Communicator) CloseServer() error {
	c.mu.Lock()
	servers := c.servers
	c.servers = make(map[transport.ConnType]transport.Server)
	c.mu.Unlock()
	var first error
	for _, s := range servers {
		if err := s.Close(); err != nil && first == nil {
			first = err
		}
	}
	if err := c.ctrl.Close(); err != nil && first == nil {
		first = err
	}
	return first
}

// Close closes every endpoint, server and control connection, failing transfers in flight. It
// is idempotent. The ConnBuffer is not closed.
func (c *Communicator) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	eps := c.eps
	c.eps = make(map[peerKey]*peerEP)
	c.mu.Unlock()
	var first error
	for _, pe := range eps {
		if err := pe.ep.Close(); err != nil && first == nil {
			first = err
		}
	}
	if err := c.CloseServer(); err != nil && first == nil {
		first = err
	}
	return first
}
