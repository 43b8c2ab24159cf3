package hmc

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"

	"github.com/hmc-go/hmc/auth"
	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/comm"
	"github.com/hmc-go/hmc/ctrl"
	"github.com/hmc-go/hmc/status"
)

// Option adjusts the Config a Session's Communicator is built with.
type Option func(*comm.Config)

// WithLogger sends connection events to l.
func WithLogger(l *slog.Logger) Option { return func(c *comm.Config) { c.Logger = l } }

// WithAuth authenticates every link of the session, data and control (comm.Config.Auth): a
// shared secret both ends prove at connect, and mutual TLS on links that leave the host. Every
// peer needs the same; a peer without is refused with ErrPermission.
func WithAuth(a auth.Config) Option { return func(c *comm.Config) { c.Auth = a } }

// WithConfig replaces the Communicator's whole Config (NumChannels is still taken from
// NewSession's argument when cfg leaves it 0).
func WithConfig(cfg comm.Config) Option {
	return func(c *comm.Config) { n := c.NumChannels; *c = cfg; c.NumChannels = max(c.NumChannels, n) }
}

// Session is a ConnBuffer and a Communicator over it: the Python SDK's Session in Go. Its
// methods are safe for concurrent use.
type Session struct {
	buf  *buffer.ConnBuffer
	comm *comm.Communicator

	mu        sync.Mutex
	localIP   string         // guarded by mu: InitServer may set it while Connect reads it
	ctrlForce ctrl.Transport // guarded by mu: the control transport Connect must use
	forced    bool           // guarded by mu: whether ctrlForce is set
}

// ForceCtrlTransport makes Connect use t for every control link (the Python SDK's
// CTRL_TRANSPORT, which the C and Python faces read and pass here) instead of choosing: a Unix
// socket for a peer on this Session's IP, TCP otherwise.
func (s *Session) ForceCtrlTransport(t ctrl.Transport) {
	s.mu.Lock()
	s.ctrlForce, s.forced = t, true
	s.mu.Unlock()
}

// NewSession allocates a bufferSize-byte ConnBuffer of memType on deviceID and a Communicator
// with numChannels lanes per connection (0: the transport's default). localIP is this host's
// address, used to pick a Unix control socket for peers on the same IP (as the Python SDK).
func NewSession(deviceID int, bufferSize uint64, memType MemoryType, numChannels int, localIP string, opts ...Option) (*Session, error) {
	buf, err := buffer.New(deviceID, bufferSize, memType)
	if err != nil {
		return nil, err
	}
	cfg := comm.Config{NumChannels: numChannels}
	for _, o := range opts {
		o(&cfg)
	}
	c, err := comm.New(buf, cfg)
	if err != nil {
		_ = buf.Close() // construction failed; that error is reported
		return nil, err
	}
	return &Session{buf: buf, comm: c, localIP: localIP}, nil
}

// Buffer returns the Session's ConnBuffer.
func (s *Session) Buffer() *buffer.ConnBuffer { return s.buf }

// DataPort returns the TCP port the data server listens on (for AUTO, SHM and TCP alike: the
// shared-memory socket is named after it), or 0 before InitServer. It tells peers where to
// connect when InitServer was given port 0.
func (s *Session) DataPort() int { return addrPort(s.comm.DataAddr(TCP)) }

// CtrlPort returns the control plane's TCP port, or 0 when it does not listen on TCP.
func (s *Session) CtrlPort() int {
	if a := s.comm.CtrlAddr(); a != nil {
		return a.Port
	}
	return 0
}

func addrPort(addr string) int {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(p)
	return n
}

// Comm returns the Session's Communicator.
func (s *Session) Comm() *comm.Communicator { return s.comm }

// InitServer starts the control plane on bindIP:ctrlTCPPort and on the Unix socket
// ctrl.UDSPathFor(ctrlUDSDir, selfID) (when ctrlUDSDir is non-empty), and a data server of type
// ct on bindIP:dataPort.
func (s *Session) InitServer(bindIP string, dataPort, ctrlTCPPort int, selfID uint32, ctrlUDSDir string, ct ConnType) error {
	uds := ""
	if ctrlUDSDir != "" {
		uds = ctrl.UDSPathFor(ctrlUDSDir, selfID)
	}
	s.mu.Lock()
	if bindIP != "" && bindIP != "0.0.0.0" && s.localIP == "" {
		s.localIP = bindIP
	}
	s.mu.Unlock()
	return s.comm.InitServer(bindIP, dataPort, ctrlTCPPort, uds, ct)
}

// Connect connects to rank peerID at peerIP (data on dataPort) and returns the peer's handle,
// which carries the operations (Put, Get, PutFrom, GetTo, their NB and pipelined forms,
// streams, CtrlSend, Disconnect). Connecting again to a connected peer returns its handle. The
// control link is a Unix socket in udsDir when ForceCtrlTransport(UDS) was called, or when no
// transport was forced and the peer's IP equals this Session's local IP (and udsDir is
// non-empty); otherwise TCP to peerIP:ctrlTCPPort.
func (s *Session) Connect(ctx context.Context, peerID, selfID uint32, peerIP string, dataPort, ctrlTCPPort int, udsDir string, ct ConnType) (*Peer, error) {
	p := s.comm.Peer(peerIP, dataPort, ct)
	if p.Check() == nil {
		return p, nil
	}
	link := comm.CtrlLink{Transport: ctrl.TCP, IP: peerIP, Port: ctrlTCPPort}
	s.mu.Lock()
	localIP, t, forced := s.localIP, s.ctrlForce, s.forced
	s.mu.Unlock()
	useUDS := (forced && t == ctrl.UDS) || (!forced && localIP != "" && localIP != "0.0.0.0" && localIP == peerIP && udsDir != "")
	if useUDS {
		if udsDir == "" {
			return nil, fmt.Errorf("hmc: a forced UDS control link (CTRL_TRANSPORT=uds) needs a UDS directory: %w", status.ErrInvalidConfig)
		}
		link = comm.CtrlLink{Transport: ctrl.UDS, UDSPath: ctrl.UDSPathFor(udsDir, peerID)}
	}
	if err := s.comm.ConnectTo(ctx, peerID, selfID, peerIP, dataPort, link, ct); err != nil {
		return nil, err
	}
	return p, nil
}

// Peer returns the handle of the process with control rank rank, connected by Connect or
// connected to this Session (ErrNotFound otherwise).
func (s *Session) Peer(rank uint32) (*Peer, error) { return s.comm.PeerByRank(rank) }

// Wait waits for operation ids, in any order.
func (s *Session) Wait(ctx context.Context, ids ...uint64) error { return s.comm.Wait(ctx, ids...) }

// CtrlSend sends a u64 tag to rank peer.
func (s *Session) CtrlSend(ctx context.Context, peer uint32, tag uint64) error {
	return s.comm.CtrlSend(ctx, peer, tag)
}

// CtrlRecv receives a u64 tag from rank peer.
func (s *Session) CtrlRecv(ctx context.Context, peer uint32) (uint64, error) {
	return s.comm.CtrlRecv(ctx, peer)
}

// Put copies data into the local buffer at off and returns the byte count (the Python
// buf.put).
func (s *Session) Put(data []byte, off uint64) (uint64, error) {
	if err := s.buf.WriteFromCPU(data, off); err != nil {
		return 0, err
	}
	return uint64(len(data)), nil
}

// GetInto copies len(dst) bytes of the local buffer at off into dst (the Python buf.get_into).
func (s *Session) GetInto(dst []byte, off uint64) error { return s.buf.ReadToCPU(dst, off) }

// CopyWithin copies n bytes inside the local buffer (overlap-safe on CPU buffers).
func (s *Session) CopyWithin(dstOff, srcOff, n uint64) error {
	return s.buf.CopyWithin(dstOff, srcOff, n)
}

// CloseServer stops the data servers and the control plane; it never exits the process.
func (s *Session) CloseServer() error { return s.comm.CloseServer() }

// Close closes the Communicator, then the buffer. It is idempotent.
func (s *Session) Close() error {
	err := s.comm.Close()
	if berr := s.buf.Close(); err == nil {
		err = berr
	}
	return err
}
