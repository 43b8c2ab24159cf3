package ctrl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hmc-go/hmc/auth"
	"github.com/hmc-go/hmc/internal/peercred"
	"github.com/hmc-go/hmc/status"
)

// Transport selects how a control connection is carried.
type Transport uint8

// Control transports, with upstream's CtrlTransport values.
const (
	TCP Transport = 0
	UDS Transport = 1
)

// String returns "tcp" or "uds".
func (t Transport) String() string {
	switch t {
	case TCP:
		return "tcp"
	case UDS:
		return "uds"
	}
	return fmt.Sprintf("Transport(%d)", int(t))
}

// UDSPathFor returns the Unix socket path of rank in dir: dir (without one trailing slash) +
// "/hmc_ctrl_rank_<rank>.sock", as upstream.
func UDSPathFor(dir string, rank uint32) string {
	dir = strings.TrimSuffix(dir, "/")
	return dir + "/hmc_ctrl_rank_" + strconv.FormatUint(uint64(rank), 10) + ".sock"
}

// Defaults for Config's zero fields.
const (
	DefaultMaxFrame     = 4 << 20
	DefaultInboxDepth   = 1024
	DefaultHelloTimeout = 5 * time.Second
	maxPendingHellos    = 64
	maxInternalTypes    = 16
)

// Config configures a Manager. The zero value of each field means its default.
type Config struct {
	// MaxFrame caps the payload of a received frame (default 4 MiB); a larger frame is a
	// protocol error that closes the connection before anything is allocated.
	MaxFrame uint32
	// InboxDepth bounds the messages queued per peer and class (default 1024); when full, the
	// connection's reader stops reading, which pushes back on the sender.
	InboxDepth int
	// HelloTimeout bounds how long an accepted connection may take to send its HELLO (default 5 s).
	HelloTimeout time.Duration
	// AllowUIDs lists the users, besides this process's own, whose processes may connect to the
	// Unix socket (or serve the one this Manager dials). The kernel's record of the peer
	// (SO_PEERCRED) is checked before the HELLO is read or sent. Nil: this process's user only.
	AllowUIDs []uint32
	// Auth authenticates every connection at connect, both ways, before the HELLO: a shared
	// secret on TCP and Unix sockets, mutual TLS on TCP (the frames then travel encrypted).
	// The zero value authenticates nothing.
	Auth auth.Config
	// ReadSpin, when positive, is how long a read of a connection polls its socket before it
	// lets the runtime park it until data arrive (zero: park at once). A Recv whose answer
	// comes within it sees the answer as it lands instead of after a netpoll wake-up: with
	// 20 µs a UDS round trip between two processes takes 4.1 µs instead of 9.5. But a poll holds
	// its core, and when processes outnumber cores the peer that would answer may be waiting
	// for it: four such pairs on two cores took 52-68 µs a round trip polling, 9-13 parked. So
	// it is for processes that have a core each. TLS connections are never polled.
	ReadSpin time.Duration
	// Netpoll keeps connections on the runtime's netpoller. By default a TCP or Unix
	// connection without TLS and without ReadSpin leaves it once its HELLO is through: the
	// goroutine that reads or writes it blocks its thread in poll(2) (internal/fdconn) and the
	// kernel wakes that thread itself, as a C program's blocking read; a UDS round trip between
	// two processes measured ~9 µs instead of ~15 (bench/compare-ctrl.sh). The price is a
	// thread for each connection while it waits for a message (its reader's, or a Recv's).
	Netpoll bool
	// Logger receives connection events; nil means silent.
	Logger *slog.Logger
}

// DefaultConfig returns a Config with every default filled in.
func DefaultConfig() Config {
	c := Config{}
	c.setDefaults()
	return c
}

func (c *Config) setDefaults() {
	if c.MaxFrame == 0 {
		c.MaxFrame = DefaultMaxFrame
	}
	if c.InboxDepth == 0 {
		c.InboxDepth = DefaultInboxDepth
	}
	if c.HelloTimeout == 0 {
		c.HelloTimeout = DefaultHelloTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate reports contradictory settings.
func (c Config) Validate() error {
	if c.InboxDepth < 0 || c.HelloTimeout < 0 || c.ReadSpin < 0 {
		return fmt.Errorf("ctrl: negative InboxDepth, HelloTimeout or ReadSpin: %w", status.ErrInvalidConfig)
	}
	if err := c.Auth.Validate(); err != nil {
		return fmt.Errorf("ctrl: %w", err)
	}
	return nil
}

// Message is one received frame.
type Message struct {
	Type    MsgType
	Flags   uint16
	Payload []byte // owned by the receiver
}

// Manager is a set of rank-addressed control connections, plus optional listeners. Its methods
// are safe for concurrent use.
type Manager struct {
	cfg  Config
	done chan struct{} // closed by Close
	wg   sync.WaitGroup

	mu        sync.Mutex
	peers     map[uint32]*peer     // guarded by mu
	last      atomic.Pointer[peer] // the rank peerFor found last, if still in peers; stored under mu
	listeners []net.Listener       // guarded by mu
	tcpAddr   *net.TCPAddr         // guarded by mu
	udsPath   string               // guarded by mu
	closed    bool                 // guarded by mu
	hellos    chan struct{}        // semaphore of handshakes in progress
}

// New returns a Manager. It starts nothing until Listen or a Dial.
func New(cfg Config) (*Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	return &Manager{
		cfg:    cfg,
		done:   make(chan struct{}),
		peers:  make(map[uint32]*peer),
		hellos: make(chan struct{}, maxPendingHellos),
	}, nil
}

// Listen starts a TCP listener on bindIP:tcpPort (if tcpPort >= 0; 0 picks a free port) and a
// Unix socket listener at udsPath (if non-empty). A negative tcpPort means no TCP listener.
// A socket file at udsPath that a live server answers on is an error (upstream unlinks it); a
// stale one is removed. Listen may be called once.
func (m *Manager) Listen(bindIP string, tcpPort int, udsPath string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("ctrl: listen: %w", status.ErrClosed)
	}
	if len(m.listeners) > 0 {
		return fmt.Errorf("ctrl: already listening: %w", status.ErrInvalidConfig)
	}
	if tcpPort < 0 && udsPath == "" {
		return fmt.Errorf("ctrl: listen with neither a TCP port nor a UDS path: %w", status.ErrInvalidConfig)
	}
	if tcpPort > 65535 {
		return fmt.Errorf("ctrl: tcp port %d: %w", tcpPort, status.ErrInvalidConfig)
	}
	var ls []net.Listener
	fail := func(err error) error {
		for _, l := range ls {
			_ = l.Close() // undoing a partial start; the listen error is reported
		}
		return err
	}
	if tcpPort >= 0 {
		l, err := net.Listen("tcp", net.JoinHostPort(bindIP, strconv.Itoa(tcpPort)))
		if err != nil {
			return fail(fmt.Errorf("ctrl: listen tcp %s:%d: %w: %w", bindIP, tcpPort, status.ErrInvalidConfig, err))
		}
		ls = append(ls, l)
		m.tcpAddr = l.Addr().(*net.TCPAddr)
	}
	if udsPath != "" {
		l, err := listenUDS(udsPath)
		if err != nil {
			return fail(err)
		}
		ls = append(ls, l)
		m.udsPath = udsPath
	}
	m.listeners = ls
	for _, l := range ls {
		m.wg.Add(1)
		go m.acceptLoop(l) // owned by m: Close closes l and waits
	}
	return nil
}

func listenUDS(path string) (net.Listener, error) {
	if len(path) > 107 {
		return nil, fmt.Errorf("ctrl: uds path %q longer than 107 bytes: %w", path, status.ErrInvalidConfig)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("ctrl: %s exists and is not a socket: %w", path, status.ErrInvalidConfig)
		}
		if c, err := net.DialTimeout("unix", path, 200*time.Millisecond); err == nil {
			_ = c.Close() // only probing for a live server
			return nil, fmt.Errorf("ctrl: %s is in use by a live server: %w", path, status.ErrInvalidConfig)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("ctrl: removing stale socket %s: %w: %w", path, status.ErrInvalidConfig, err)
		}
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("ctrl: listen unix %s: %w: %w", path, status.ErrInvalidConfig, err)
	}
	return l, nil
}

// TCPAddr returns the TCP listener's address, or nil.
func (m *Manager) TCPAddr() *net.TCPAddr {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.tcpAddr
}

// UDSPath returns the Unix listener's path, or "".
func (m *Manager) UDSPath() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.udsPath
}

func (m *Manager) acceptLoop(l net.Listener) {
	defer m.wg.Done()
	for {
		c, err := l.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				m.cfg.Logger.Warn("ctrl accept stopped", "addr", l.Addr(), "err", err)
			}
			return
		}
		select {
		case m.hellos <- struct{}{}:
		default:
			m.cfg.Logger.Warn("ctrl: too many handshakes in progress, dropping", "remote", c.RemoteAddr())
			_ = c.Close() // shedding load; nothing to report to anyone
			continue
		}
		m.wg.Add(1)
		go m.handshake(c) // owned by m; bounded by the hellos semaphore and HelloTimeout
	}
}

// handshake reads the HELLO of an accepted connection off the accept loop, so a silent client
// cannot block other accepts.
func (m *Manager) handshake(c net.Conn) {
	defer m.wg.Done()
	defer func() { <-m.hellos }()
	a := m.cfg.Auth
	if uc, ok := c.(*net.UnixConn); ok {
		if _, err := (peercred.Policy{UIDs: m.cfg.AllowUIDs}).Check(uc); err != nil {
			m.cfg.Logger.Warn("ctrl: refused a connection", "path", uc.LocalAddr(), "err", err)
			_ = c.Close() // refused peer: told nothing
			return
		}
		a = a.Local()
	}
	dl := time.Now().Add(m.cfg.HelloTimeout)
	raw := c
	c, err := auth.Server(c, a, "ctrl", dl)
	if err != nil {
		m.cfg.Logger.Warn("ctrl: refused a connection", "remote", raw.RemoteAddr(), "err", err)
		_ = raw.Close() // refused peer: told why by auth, nothing else
		return
	}
	_ = c.SetReadDeadline(dl)
	var h Header
	var p [helloLen]byte
	_, err = io.ReadFull(c, h[:])
	if err == nil && h.Length() == helloLen {
		_, err = io.ReadFull(c, p[:])
	}
	var rank uint32
	if err == nil {
		rank, err = ParseHello(h, p[:])
	}
	if err != nil {
		if aerr := auth.Refuse(c, h[:]); aerr != nil {
			err = aerr // a peer that authenticates, and this side does not
		}
		m.cfg.Logger.Warn("ctrl: bad HELLO", "remote", c.RemoteAddr(), "err", err)
		_ = c.Close() // rejected connection
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	if err := m.attach(rank, c); err != nil {
		_ = c.Close() // manager closed
	}
}

// DialTCP connects to a peer's TCP control listener at addr ("host:port"), introduces itself
// as rank selfID in the HELLO, and binds the connection to rank peerID (upstream connectTcp). An
// existing connection to peerID is replaced.
func (m *Manager) DialTCP(ctx context.Context, peerID, selfID uint32, addr string) error {
	return m.dial(ctx, peerID, selfID, "tcp", addr)
}

// DialUDS connects to a peer's Unix control socket at path, as DialTCP.
func (m *Manager) DialUDS(ctx context.Context, peerID, selfID uint32, path string) error {
	return m.dial(ctx, peerID, selfID, "unix", path)
}

func (m *Manager) dial(ctx context.Context, peerID, selfID uint32, network, addr string) error {
	if addr == "" {
		return fmt.Errorf("ctrl: dial %s with an empty address: %w", network, status.ErrInvalidConfig)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		if cerr := status.FromContext(ctx); cerr != nil {
			return fmt.Errorf("ctrl: dial rank %d at %s: %w", peerID, addr, cerr)
		}
		return fmt.Errorf("ctrl: dial rank %d at %s %s: %w: %w", peerID, network, addr, status.ErrFailed, err)
	}
	a := m.cfg.Auth
	if uc, ok := c.(*net.UnixConn); ok {
		if _, err := (peercred.Policy{UIDs: m.cfg.AllowUIDs}).Check(uc); err != nil {
			_ = c.Close() // a socket of another user: nothing is sent to it
			return fmt.Errorf("ctrl: dial rank %d at %s: %w", peerID, addr, err)
		}
		a = a.Local()
	}
	dl, ok := ctx.Deadline()
	if a.Enabled() {
		if !ok {
			dl = time.Now().Add(m.cfg.HelloTimeout)
		}
		raw := c
		if c, err = auth.Client(c, a, "ctrl", dl); err != nil {
			_ = raw.Close() // refused; that error is reported
			return fmt.Errorf("ctrl: dial rank %d at %s: %w", peerID, addr, err)
		}
	}
	hello := AppendHello(make([]byte, 0, HeaderSize+helloLen), selfID)
	if ok {
		_ = c.SetWriteDeadline(dl)
	}
	if _, err := c.Write(hello); err != nil {
		_ = c.Close() // the HELLO failed; that error is reported
		return fmt.Errorf("ctrl: HELLO to rank %d: %w: %w", peerID, status.ErrFailed, err)
	}
	_ = c.SetWriteDeadline(time.Time{})
	if err := m.attach(peerID, c); err != nil {
		_ = c.Close() // manager closed
		return err
	}
	return nil
}

// Close closes the listeners (unlinking the Unix socket) and every connection, fails every
// waiting call with ErrClosed, and returns when all goroutines have exited. It is idempotent.
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		m.wg.Wait()
		return nil
	}
	m.closed = true
	m.last.Store(nil)
	close(m.done)
	ls := m.listeners
	peers := make([]*peer, 0, len(m.peers))
	for _, p := range m.peers {
		peers = append(peers, p)
	}
	m.mu.Unlock()
	for _, l := range ls {
		_ = l.Close() // shutting down; accept loops see net.ErrClosed
	}
	for _, p := range peers {
		p.closeConn(nil)
	}
	m.wg.Wait()
	return nil
}
