package comm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hmc-go/hmc/auth"
	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/ctrl"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/stack"
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
	// Ctrl configures the control plane.
	Ctrl ctrl.Config
	// Stream configures SendDataTo/RecvDataFrom.
	Stream StreamConfig
	// Transports are the transports to use, with their configuration (package transport/stack
	// builds them); nil: stack.New with its defaults, Auth and Logger.
	Transports *Registry
	// Regions is the table of registered regions the servers serve besides the ConnBuffer;
	// nil: a new, empty one (Communicator.Regions).
	Regions *buffer.Table
	// OnRemoteWrite, if set, is called after a peer's put of n bytes at off has landed in this
	// Communicator's buffer, from the transport goroutine that served it; it must not block.
	// Transports where the target takes no part in a put (SHM) do not call it.
	// Use it to wait for data instead of polling the buffer (see transport.ServerConfig.OnWrite).
	OnRemoteWrite func(off, n uint64)
	// Observer, if set, is told of every blocking operation on a Peer when it ends (the
	// metrics package counts them for Prometheus); nil observes nothing.
	Observer Observer
	// Auth authenticates every link this Communicator opens or accepts: the control plane's
	// when Ctrl.Auth is zero, and the transports' when Transports is nil (a Registry built by
	// hand carries its own): a shared secret both ends prove at connect, and mutual TLS on
	// links that leave the host. The zero value authenticates nothing (the default).
	Auth auth.Config
	// Logger receives connection events; nil means silent.
	Logger *slog.Logger
}

// inheritAuth gives c.Auth to the control plane when its own is zero.
func (c *Config) inheritAuth() {
	if !c.Ctrl.Auth.Enabled() {
		c.Ctrl.Auth = c.Auth
	}
}

// Observer is told of the operations a Communicator's peers complete: what (op: "put", "get",
// "put_from", "get_to", "write", "read", "atomic", "put_pipeline", "get_pipeline", "send_data",
// "recv_data"), over which transport (the route taken; the kind asked for if none was made),
// to which peer ("ip:port"), how many bytes, how long, and the error (nil: success). It is
// called on the operation's goroutine after it ended: it must be cheap and safe for concurrent
// use.
type Observer interface {
	Observe(op string, route transport.ConnType, peer string, bytes uint64, d time.Duration, err error)
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

// lastEP remembers the endpoint of the last (ip, port, kind) looked up.
type lastEP struct {
	ip   string
	port int
	ct   transport.ConnType
	ep   transport.Endpoint
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
	buf     *buffer.ConnBuffer
	cfg     Config
	ctrl    *ctrl.Manager
	trans   map[transport.ConnType]transport.Transport
	missing map[transport.ConnType]error // why UCX / RDMA are not in trans
	regions *buffer.Table                // served to peers beside buf
	// progressers are the transports of trans that need progress from a poller (Progress).
	progressers []transport.Progresser
	log         *slog.Logger
	opIDs       atomic.Uint64
	streams     *streamer // SendDataTo / RecvDataFrom, and the devices they stage through

	mu       sync.Mutex
	servers  map[transport.ConnType]transport.Server // guarded by mu
	eps      map[peerKey]*peerEP                     // guarded by mu
	accepted map[peerKey]accepted                    // initiators seen by our servers, by (ip, their listen port); guarded by mu
	ops      opTable                                 // posted, not yet waited for; guarded by mu
	selfRank uint32                                  // from the last ConnectTo; guarded by mu
	lastEP   atomic.Pointer[lastEP]                  // the endpoint last looked up; stored and cleared under mu
	closed   bool                                    // guarded by mu
}

// DefaultConfig returns a Config with every default filled in, the control plane's included
// (the transports' are stack.DefaultConfig).
func DefaultConfig() Config {
	return Config{Ctrl: ctrl.DefaultConfig(), Logger: slog.New(slog.DiscardHandler)}
}

// Validate rejects impossible settings, the control plane's included. (The stream ring is
// checked against the buffer by New, the transports' settings by stack.New.)
func (c Config) Validate() error {
	if c.NumChannels < 0 {
		return fmt.Errorf("comm: %d channels: %w", c.NumChannels, status.ErrInvalidConfig)
	}
	for _, err := range []error{c.Auth.Validate(), c.Ctrl.Validate()} {
		if err != nil {
			return fmt.Errorf("comm: %w", err)
		}
	}
	return nil
}

// New returns a Communicator over buf. Nothing listens or connects until InitServer or
// ConnectTo.
func New(buf *buffer.ConnBuffer, cfg Config) (*Communicator, error) {
	if buf == nil {
		return nil, fmt.Errorf("comm: nil buffer: %w", status.ErrInvalidConfig)
	}
	cfg.inheritAuth()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Ctrl.Logger == nil {
		cfg.Ctrl.Logger = cfg.Logger
	}
	if err := cfg.Stream.validate(buf.Size()); err != nil {
		return nil, err
	}
	m, err := ctrl.New(cfg.Ctrl)
	if err != nil {
		return nil, err
	}
	reg := cfg.Transports
	if reg == nil {
		if reg, err = stack.New(stack.Config{Auth: cfg.Auth, Logger: cfg.Logger}); err != nil {
			return nil, err
		}
	}
	trans, missing := reg.Snapshot()
	regions := cfg.Regions
	if regions == nil {
		regions = buffer.NewTable()
	}
	var progressers []transport.Progresser
	for _, t := range trans {
		if p, ok := t.(transport.Progresser); ok {
			progressers = append(progressers, p)
		}
	}
	return &Communicator{
		progressers: progressers,
		buf:         buf,
		cfg:         cfg,
		ctrl:        m,
		trans:       trans,
		missing:     missing,
		log:         cfg.Logger,
		servers:     make(map[transport.ConnType]transport.Server),
		eps:         make(map[peerKey]*peerEP),
		accepted:    make(map[peerKey]accepted),
		regions:     regions,
		streams:     newStreamer(buf, cfg.Stream, m, cfg.Logger),
	}, nil
}

// Regions returns the Communicator's region table: its servers serve every region registered
// there to peers (transport.RMA), beside the ConnBuffer.
func (c *Communicator) Regions() *buffer.Table { return c.regions }

// Buffer returns the Communicator's ConnBuffer.
func (c *Communicator) Buffer() *buffer.ConnBuffer { return c.buf }

// Ctrl returns the control plane, for the CtrlSocketManager operations not wrapped here.
func (c *Communicator) Ctrl() *ctrl.Manager { return c.ctrl }

// kinds returns the transports that ct may use, in order of preference: AUTO prefers shared
// memory (same-host peers) and falls back to TCP. UCX and RDMA exist in -tags ucx builds
// (RDMA also needs an RDMA device); otherwise they are ErrUnsupported with the reason. The
// slice is shared: callers only read it (it is on every operation's path).
func (c *Communicator) kinds(ct transport.ConnType) ([]transport.ConnType, error) {
	var ks []transport.ConnType
	switch ct {
	case transport.AUTO:
		ks = kindsAuto
		if c.usable(transport.SHM) != nil { // a registry without shared memory: TCP alone
			ks = kindsTCP
		}
	case transport.TCP:
		ks = kindsTCP
	case transport.SHM:
		ks = kindsSHM
	case transport.UCX:
		ks = kindsUCX
	case transport.RDMA:
		ks = kindsRDMA
	default:
		return nil, fmt.Errorf("comm: connection type %d: %w", int(ct), status.ErrInvalidConfig)
	}
	for _, k := range ks {
		if err := c.usable(k); err != nil {
			return nil, err
		}
	}
	return ks, nil
}

// usable returns nil if the registry holds a transport of kind k, else why not.
func (c *Communicator) usable(k transport.ConnType) error {
	if _, ok := c.trans[k]; ok {
		return nil
	}
	if err := c.missing[k]; err != nil {
		return fmt.Errorf("comm: connection type %v: %w", k, err)
	}
	return fmt.Errorf("comm: connection type %v: no such transport registered: %w", k, status.ErrUnsupported)
}

var (
	kindsAuto = []transport.ConnType{transport.SHM, transport.TCP}
	kindsTCP  = []transport.ConnType{transport.TCP}
	kindsSHM  = []transport.ConnType{transport.SHM}
	kindsUCX  = []transport.ConnType{transport.UCX}
	kindsRDMA = []transport.ConnType{transport.RDMA}
)

// InitServer starts the control plane listeners (TCP on bindIP:ctrlTCPPort when ctrlTCPPort
// >= 0, and a Unix socket at ctrlUDSPath when non-empty) and the data servers for ct on
// bindIP:dataPort. Port 0 picks a free port (see DataAddr, CtrlAddr). TCP serves the buffer on
// that port; SHM and AUTO also serve it to same-host peers on the abstract Unix socket
// stack.SHMSocketName(port) (AUTO only when the buffer is memfd-backed host memory or device
// memory with an IPC handle; SHM requires it). Every bind error is returned. Calling it again adds what is missing; the control
// listeners start once.
func (c *Communicator) InitServer(bindIP string, dataPort, ctrlTCPPort int, ctrlUDSPath string, ct transport.ConnType) error {
	if dataPort < 0 || dataPort > 65535 {
		return fmt.Errorf("comm: data port %d: %w", dataPort, status.ErrInvalidConfig)
	}
	ks, err := c.kinds(ct)
	if err != nil {
		return err
	}
	wantSHM := slices.Contains(ks, transport.SHM)
	if wantSHM && c.buf.FD() < 0 && c.buf.Bytes() != nil { // device memory is shared through its IPC handle
		if ct == transport.SHM {
			return fmt.Errorf("comm: shm server: the buffer is %v memory without a memfd: %w", c.buf.Type(), status.ErrUnsupported)
		}
		wantSHM = false
		c.log.Info("hmc: not serving shared memory: the buffer is host memory without a memfd", "type", c.buf.Type())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("comm: %w", status.ErrClosed)
	}
	if c.ctrl.TCPAddr() == nil && c.ctrl.UDSPath() == "" && (ctrlTCPPort >= 0 || ctrlUDSPath != "") {
		if err := c.ctrl.Listen(bindIP, ctrlTCPPort, ctrlUDSPath); err != nil {
			return fmt.Errorf("comm: init server: %w", err)
		}
	}
	// UCX and RDMA serve on their own port (upstream's ucx_port / rdma_port): the port is
	// their bootstrap socket.
	if ct == transport.UCX || ct == transport.RDMA {
		if _, ok := c.servers[ct]; !ok {
			return c.listenLocked(ct, net.JoinHostPort(bindIP, strconv.Itoa(dataPort)))
		}
		return nil
	}
	// TCP always: its port names this server, and it serves peers on other hosts.
	if _, ok := c.servers[transport.TCP]; !ok {
		if err := c.listenLocked(transport.TCP, net.JoinHostPort(bindIP, strconv.Itoa(dataPort))); err != nil {
			return err
		}
	}
	if _, ok := c.servers[transport.SHM]; wantSHM && !ok {
		port, _ := splitPort(c.servers[transport.TCP].Addr())
		if err := c.listenLocked(transport.SHM, stack.SHMSocketName(port)); err != nil {
			if ct == transport.SHM || c.buf.Bytes() != nil {
				return err
			}
			// AUTO with device memory the driver cannot export (no IPC handle): TCP serves it.
			c.log.Info("hmc: not serving shared memory: the device buffer cannot be shared", "err", err)
		}
	}
	return nil
}

// listenLocked starts the data server of kind k. Caller holds c.mu.
func (c *Communicator) listenLocked(k transport.ConnType, addr string) error {
	srv, err := c.trans[k].Listen(transport.ServerConfig{
		BindAddr: addr,
		Region:   c.buf,
		Regions:  c.regions,
		OnAccept: func(p transport.PeerInfo) { c.onAccept(k, p) },
		OnWrite:  c.cfg.OnRemoteWrite,
	})
	if err != nil {
		return fmt.Errorf("comm: init server: %w", err)
	}
	c.servers[k] = srv
	c.log.Info("hmc: data server listening", "transport", k, "addr", srv.Addr())
	return nil
}

func splitPort(addr string) (int, string) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, ""
	}
	n, _ := strconv.Atoi(p)
	return n, h
}

func (c *Communicator) onAccept(ct transport.ConnType, p transport.PeerInfo) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.accepted[peerKey{p.IP, p.ListenPort, ct}] = accepted{rank: p.Rank, ip: p.IP, listenPort: p.ListenPort, conn: ct}
	c.log.Info("hmc: peer connected", "rank", p.Rank, "ip", p.IP, "listen_port", p.ListenPort, "transport", ct)
}

// DataAddr returns the address of a data server: for TCP and AUTO the TCP "host:port" that
// peers connect to, for SHM the Unix socket name; "" if none.
func (c *Communicator) DataAddr(ct transport.ConnType) string {
	if ct == transport.AUTO {
		ct = transport.TCP
	}
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
// and a data endpoint to peerIP:dataPort. With AUTO the endpoint is shared memory when the peer
// is on this host (its address is one of ours and its shared-memory server answers with our
// kernel's boot id), else TCP; the log says which and why. If an endpoint for (peerIP,
// dataPort, ct) exists it returns at once. If the data connection fails, the new control link is
// closed.
func (c *Communicator) ConnectTo(ctx context.Context, peerID, selfID uint32, peerIP string, dataPort int, link CtrlLink, ct transport.ConnType) error {
	if _, err := c.kinds(ct); err != nil {
		return err
	}
	if dataPort <= 0 || dataPort > 65535 {
		return fmt.Errorf("comm: data port %d: %w", dataPort, status.ErrInvalidConfig)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return fmt.Errorf("comm: %w", status.ErrClosed)
	}
	c.selfRank = selfID
	_, exists := c.lookupLocked(peerIP, dataPort, ct)
	c.mu.Unlock()
	if exists {
		return nil
	}
	if err := c.connectCtrl(ctx, peerID, selfID, link); err != nil {
		return err
	}
	if _, err := c.dialData(ctx, peerIP, dataPort, ct, peerID, selfID); err != nil {
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

// dialData makes a data endpoint to ip:port with the first kind of ct that works.
func (c *Communicator) dialData(ctx context.Context, ip string, port int, ct transport.ConnType, peerID, selfID uint32) (transport.Endpoint, error) {
	ks, err := c.kinds(ct)
	if err != nil {
		return nil, err
	}
	listenPort, localIP := 0, ""
	c.mu.Lock()
	named := transport.TCP // the server whose port names us to this peer (SHM's is TCP's)
	if ct == transport.UCX || ct == transport.RDMA {
		named = ct
	}
	if s, ok := c.servers[named]; ok {
		listenPort, localIP = splitPort(s.Addr())
		if a := net.ParseIP(localIP); a == nil || a.IsUnspecified() {
			localIP = ""
		}
	}
	c.mu.Unlock()
	var errs []error
	for _, k := range ks {
		addr := net.JoinHostPort(ip, strconv.Itoa(port))
		if k == transport.SHM {
			if !IsLocalIP(ip) {
				errs = append(errs, fmt.Errorf("shm: %s is not an address of this host: %w", ip, status.ErrUnsupported))
				continue
			}
			addr = stack.SHMSocketName(port)
		}
		ep, err := c.trans[k].Dial(ctx, transport.DialConfig{Addr: addr, Local: c.buf, Rank: selfID,
			ListenPort: listenPort, LocalIP: localIP, Lanes: c.cfg.NumChannels})
		if err != nil {
			errs = append(errs, err)
			if cerr := status.FromContext(ctx); cerr != nil {
				break
			}
			continue
		}
		return c.register(ep, peerKey{ip, port, k}, peerID, ct, errs)
	}
	return nil, fmt.Errorf("comm: connect to rank %d at %s:%d over %v: %w", peerID, ip, port, ct, errors.Join(errs...))
}

// register records a new endpoint, unless a concurrent dial won (its endpoint is kept).
func (c *Communicator) register(ep transport.Endpoint, key peerKey, peerID uint32, asked transport.ConnType, skipped []error) (transport.Endpoint, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		_ = ep.Close() // raced with Close
		return nil, fmt.Errorf("comm: %w", status.ErrClosed)
	}
	if old, ok := c.eps[key]; ok {
		_ = ep.Close() // a concurrent ConnectTo won
		return old.ep, nil
	}
	c.eps[key] = &peerEP{ep: ep, rank: peerID}
	why := "requested"
	if asked == transport.AUTO {
		why = "auto: first usable"
		if len(skipped) > 0 {
			why = "auto: " + errors.Join(skipped...).Error()
		}
	}
	c.log.Info("hmc: connected", "rank", peerID, "addr", key.ip, "port", key.port, "transport", key.conn, "why", why)
	return ep, nil
}

// IsLocalIP reports whether ip is a loopback address or one assigned to this host (the test
// behind AUTO's choice of shared memory, and the fabric faces' store racing).
func IsLocalIP(ip string) bool {
	a := net.ParseIP(ip)
	if a == nil {
		return false
	}
	if a.IsLoopback() {
		return true
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, x := range addrs {
		if n, ok := x.(*net.IPNet); ok && n.IP.Equal(a) {
			return true
		}
	}
	return false
}

// lookupLocked finds an endpoint for (ip, port) among ct's kinds. Caller holds c.mu.
func (c *Communicator) lookupLocked(ip string, port int, ct transport.ConnType) (*peerEP, bool) {
	ks, _ := c.kinds(ct)
	for _, k := range ks {
		if pe, ok := c.eps[peerKey{ip, port, k}]; ok {
			return pe, true
		}
	}
	return nil, false
}

// acceptedLocked finds an initiator that connected to us from (ip, port) over one of ct's
// kinds. Caller holds c.mu.
func (c *Communicator) acceptedLocked(ip string, port int, ct transport.ConnType) (accepted, bool) {
	ks, _ := c.kinds(ct)
	for _, k := range ks {
		if a, ok := c.accepted[peerKey{ip, port, k}]; ok {
			return a, true
		}
	}
	return accepted{}, false
}

// endpoint returns the endpoint for (ip, port, ct). A peer that connected to our server with
// its own data listener on (ip, port) is dialed back on first use ("connect once, use both
// ways"), so a target can put to and get from its initiators.
func (c *Communicator) endpoint(ctx context.Context, ip string, port int, ct transport.ConnType) (transport.Endpoint, error) {
	if l := c.lastEP.Load(); l != nil && l.port == port && l.ct == ct && l.ip == ip {
		return l.ep, nil // a stream to one peer: no lock, no map
	}
	if _, err := c.kinds(ct); err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, fmt.Errorf("comm: %w", status.ErrClosed)
	}
	if pe, ok := c.lookupLocked(ip, port, ct); ok {
		c.lastEP.Store(&lastEP{ip: ip, port: port, ct: ct, ep: pe.ep})
		c.mu.Unlock()
		return pe.ep, nil
	}
	acc, known := c.acceptedLocked(ip, port, ct)
	self := c.selfRank
	c.mu.Unlock()
	if !known || port == 0 {
		return nil, fmt.Errorf("comm: no %v connection to %s:%d: %w", ct, ip, port, status.ErrNotFound)
	}
	return c.dialData(ctx, ip, port, ct, acc.rank, self)
}

// route returns the transport that carries transfers to (ip, port) when asked for ct: for
// AUTO, the one the endpoint was made with (SHM or TCP). It is ErrNotFound before a connection.
func (c *Communicator) route(ip string, port int, ct transport.ConnType) (transport.ConnType, error) {
	ks, err := c.kinds(ct)
	if err != nil {
		return 0, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range ks {
		if _, ok := c.eps[peerKey{ip, port, k}]; ok {
			return k, nil
		}
	}
	return 0, fmt.Errorf("comm: no %v connection to %s:%d: %w", ct, ip, port, status.ErrNotFound)
}

// checkConn returns nil if a data endpoint to (ip, port, ct) exists or can be made from a peer
// that connected to us, else an error wrapping ErrNotFound.
func (c *Communicator) checkConn(ip string, port int, ct transport.ConnType) error {
	if _, err := c.kinds(ct); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.lookupLocked(ip, port, ct); ok {
		return nil
	}
	if _, ok := c.acceptedLocked(ip, port, ct); ok && port != 0 {
		return nil
	}
	return fmt.Errorf("comm: no %v connection to %s:%d: %w", ct, ip, port, status.ErrNotFound)
}

// peerRank returns the rank of the peer at (ip, port) over ct, dialed or accepted. Port 0
// matches the only peer seen from ip, if there is exactly one.
func (c *Communicator) peerRank(ip string, port int, ct transport.ConnType) (uint32, error) {
	ks, err := c.kinds(ct)
	if err != nil {
		return 0, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if pe, ok := c.lookupLocked(ip, port, ct); ok {
		return pe.rank, nil
	}
	if a, ok := c.acceptedLocked(ip, port, ct); ok {
		return a.rank, nil
	}
	if port == 0 {
		found := map[uint32]bool{}
		for k, a := range c.accepted {
			if k.ip == ip && slices.Contains(ks, k.conn) {
				found[a.rank] = true
			}
		}
		if len(found) == 1 {
			for r := range found {
				return r, nil
			}
		}
	}
	return 0, fmt.Errorf("comm: no peer known at %s:%d over %v: %w", ip, port, ct, status.ErrNotFound)
}

// disconnect closes the data endpoints to (ip, port) over ct's kinds and the control link to
// the peer's rank. Transfers in flight on them fail with ErrClosed. Disconnecting an unknown
// peer returns nil, as upstream.
func (c *Communicator) disconnect(ip string, port int, ct transport.ConnType) error {
	ks, err := c.kinds(ct)
	if err != nil {
		return err
	}
	var gone []*peerEP
	c.mu.Lock()
	for _, k := range ks {
		key := peerKey{ip, port, k}
		if pe, ok := c.eps[key]; ok {
			gone = append(gone, pe)
		}
		delete(c.eps, key)
		delete(c.accepted, key)
	}
	c.lastEP.Store(nil)
	c.mu.Unlock()
	var first error
	for _, pe := range gone {
		_ = c.ctrl.ClosePeer(pe.rank) // the link may already be gone; the endpoint is what matters
		if err := pe.ep.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
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
	c.lastEP.Store(nil)
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
	if err := c.streams.close(); err != nil && first == nil {
		first = err
	}
	return first
}
