package mesh

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/hmc-go/hmc/auth"
	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/comm"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/shm"
	"github.com/hmc-go/hmc/transport/stack"
)

// Card is what a process publishes so that peers can reach its registered memory.
type Card struct {
	Rank  int               `json:"rank"`
	IP    string            `json:"ip"`
	Boot  string            `json:"boot"`  // kernel boot id: equal means the same host
	Addrs map[string]string `json:"addrs"` // transport name (tcp, shm, ucx, rdma) -> data address
}

// Encode returns the card as JSON.
func (c Card) Encode() []byte {
	b, _ := json.Marshal(c) // a Card always marshals
	return b
}

// ParseCard decodes a card and validates it.
func ParseCard(b []byte) (Card, error) {
	var c Card
	if err := json.Unmarshal(b, &c); err != nil {
		return Card{}, fmt.Errorf("mesh: card: %w: %w", status.ErrProtocol, err)
	}
	if err := c.Validate(); err != nil {
		return Card{}, err
	}
	return c, nil
}

// cardKinds are the transports a card may name.
var cardKinds = []transport.ConnType{transport.TCP, transport.SHM, transport.UCX, transport.RDMA}

// Validate refuses a card (from the store or a peer: untrusted) that no process of ours would
// publish: a negative rank, no address, a transport we do not know, an address that is not
// ip:port (shm: a Unix socket's name), an IP or boot id that is not one.
func (c Card) Validate() error {
	bad := func(what string) error {
		return fmt.Errorf("mesh: card of rank %d: %s: %w", c.Rank, what, status.ErrProtocol)
	}
	if c.Rank < 0 {
		return bad("negative rank")
	}
	if len(c.Addrs) == 0 || len(c.Addrs) > len(cardKinds) {
		return bad(fmt.Sprintf("%d addresses", len(c.Addrs)))
	}
	for k, a := range c.Addrs {
		if !slices.ContainsFunc(cardKinds, func(t transport.ConnType) bool { return t.String() == k }) {
			return bad(fmt.Sprintf("unknown transport %q", k))
		}
		if k == transport.SHM.String() { // a Unix socket: abstract (@name) or a path
			if len(a) < 2 || len(a) > 107 || (a[0] != '@' && a[0] != '/') || strings.ContainsRune(a, 0) || !utf8.ValidString(a) {
				return bad(fmt.Sprintf("%s address %q", k, a))
			}
			continue
		}
		host, port, err := net.SplitHostPort(a)
		if n, perr := strconv.Atoi(port); err != nil || perr != nil || n <= 0 || n > 65535 || net.ParseIP(host) == nil {
			return bad(fmt.Sprintf("%s address %q", k, a))
		}
	}
	if c.IP != "" && net.ParseIP(c.IP) == nil {
		return bad(fmt.Sprintf("IP %q", c.IP))
	}
	if len(c.Boot) > 64 || !utf8.ValidString(c.Boot) {
		return bad(fmt.Sprintf("boot id %q", c.Boot))
	}
	return nil
}

// Config configures a Mesh.
type Config struct {
	// Rank is this process's rank, told to peers.
	Rank int
	// BindIP is the address the data servers listen on and peers dial. Default 127.0.0.1.
	BindIP string
	// Kinds are the transports to serve (TCP is always served: it names the process). SHM is
	// served on its own socket for same-host peers; UCX and RDMA when the registry has them.
	Kinds []transport.ConnType
	// Transports builds the transports; nil: stack.New with default settings and
	// Auth.
	Transports *comm.Registry
	// Auth authenticates the data links when Transports is nil (comm.Config.Auth): the faces
	// pass their Config.Secret, so a process without it can neither dial nor serve them.
	Auth auth.Config
	// Logger receives connection events; nil discards them.
	Logger *slog.Logger
}

// Mesh serves a Table on its transports and holds endpoints to peers by rank.
type Mesh struct {
	cfg     Config
	table   *buffer.Table
	local   *buffer.ConnBuffer // the transports' default region: one page, never addressed
	trans   map[transport.ConnType]transport.Transport
	servers map[transport.ConnType]transport.Server
	card    Card
	boot    string

	mu     sync.Mutex
	peers  map[int]*peer // guarded by mu
	closed bool          // guarded by mu
}

type peer struct {
	card Card
	mu   sync.Mutex // serialises dials to this peer
	eps  map[transport.ConnType]transport.Endpoint
}

// New starts serving table on the configured transports.
func New(table *buffer.Table, cfg Config) (_ *Mesh, err error) {
	if table == nil {
		return nil, fmt.Errorf("mesh: no region table: %w", status.ErrInvalidConfig)
	}
	if cfg.BindIP == "" {
		cfg.BindIP = "127.0.0.1"
	}
	if net.ParseIP(cfg.BindIP) == nil {
		return nil, fmt.Errorf("mesh: bind address %q is not an IP: %w", cfg.BindIP, status.ErrInvalidConfig)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	reg := cfg.Transports
	if reg == nil {
		if reg, err = stack.New(stack.Config{Auth: cfg.Auth}); err != nil {
			return nil, err
		}
	}
	boot, err := shm.BootID()
	if err != nil {
		return nil, err
	}
	local, err := buffer.New(0, uint64(4096), memory.CPU)
	if err != nil {
		return nil, err
	}
	m := &Mesh{cfg: cfg, table: table, local: local, trans: make(map[transport.ConnType]transport.Transport),
		servers: make(map[transport.ConnType]transport.Server), peers: make(map[int]*peer), boot: string(boot[:])}
	defer func() {
		if err != nil {
			_ = m.Close() // what started is stopped; err is the one reported
		}
	}()
	m.card = Card{Rank: cfg.Rank, IP: cfg.BindIP, Boot: m.boot, Addrs: make(map[string]string)}
	kinds := append([]transport.ConnType{transport.TCP}, cfg.Kinds...)
	for _, k := range kinds {
		if _, ok := m.servers[k]; ok || k == transport.AUTO {
			continue
		}
		t, err := reg.Get(k)
		if err != nil {
			return nil, fmt.Errorf("mesh: %w", err)
		}
		addr := net.JoinHostPort(cfg.BindIP, "0")
		if k == transport.SHM {
			_, port, _ := net.SplitHostPort(m.servers[transport.TCP].Addr())
			p, _ := strconv.Atoi(port)
			addr = shm.SocketName(p)
		}
		srv, err := t.Listen(transport.ServerConfig{BindAddr: addr, Region: local, Regions: table, Rank: uint32(cfg.Rank)})
		if err != nil {
			return nil, fmt.Errorf("mesh: serving %v: %w", k, err)
		}
		m.trans[k], m.servers[k] = t, srv
		m.card.Addrs[k.String()] = srv.Addr()
	}
	return m, nil
}

// Card returns this process's card.
func (m *Mesh) Card() Card { return m.card }

// Table returns the region table the mesh serves.
func (m *Mesh) Table() *buffer.Table { return m.table }

// SameHost says whether card names a process on this host.
func (m *Mesh) SameHost(c Card) bool { return c.Boot == m.boot }

// Add learns a peer's card. A card that differs from the one known replaces it and closes the
// endpoints made from the old one (the peer restarted).
func (m *Mesh) Add(c Card) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	old := m.peers[c.Rank]
	if old != nil && cardEqual(old.card, c) {
		m.mu.Unlock()
		return
	}
	m.peers[c.Rank] = &peer{card: c, eps: make(map[transport.ConnType]transport.Endpoint)}
	m.mu.Unlock()
	if old != nil {
		old.close()
	}
}

func cardEqual(a, b Card) bool {
	if a.Rank != b.Rank || a.IP != b.IP || a.Boot != b.Boot || len(a.Addrs) != len(b.Addrs) {
		return false
	}
	for k, v := range a.Addrs {
		if b.Addrs[k] != v {
			return false
		}
	}
	return true
}

// Remove forgets rank and closes its endpoints: operations in flight fail.
func (m *Mesh) Remove(rank int) {
	m.mu.Lock()
	p := m.peers[rank]
	delete(m.peers, rank)
	m.mu.Unlock()
	if p != nil {
		p.close()
	}
}

// Peer returns rank's card, if known.
func (m *Mesh) Peer(rank int) (Card, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.peers[rank]
	if !ok {
		return Card{}, false
	}
	return p.card, true
}

func (p *peer) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, ep := range p.eps {
		_ = ep.Close() // the peer is gone or replaced; operations in flight fail with ErrClosed
		delete(p.eps, k)
	}
}

// ErrNoPeer is returned for a rank whose card is not known (never added, or removed).
var ErrNoPeer = fmt.Errorf("%w: mesh: no such peer", status.ErrNotFound)

// Endpoint returns the endpoint to rank over kind, dialling it on first use.
func (m *Mesh) Endpoint(ctx context.Context, rank int, kind transport.ConnType) (transport.Endpoint, error) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, fmt.Errorf("mesh: %w", status.ErrClosed)
	}
	p := m.peers[rank]
	m.mu.Unlock()
	if p == nil {
		return nil, fmt.Errorf("rank %d: %w", rank, ErrNoPeer)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if ep, ok := p.eps[kind]; ok {
		return ep, nil
	}
	t, ok := m.trans[kind]
	if !ok {
		return nil, fmt.Errorf("mesh: this process does not serve %v: %w", kind, status.ErrUnsupported)
	}
	addr, ok := p.card.Addrs[kind.String()]
	if !ok {
		return nil, fmt.Errorf("mesh: rank %d does not serve %v: %w", rank, kind, status.ErrUnsupported)
	}
	if kind == transport.SHM && !m.SameHost(p.card) {
		return nil, fmt.Errorf("mesh: rank %d is on another host: %w", rank, status.ErrUnsupported)
	}
	ep, err := t.Dial(ctx, transport.DialConfig{Addr: addr, Local: m.local, Rank: uint32(m.cfg.Rank)})
	if err != nil {
		return nil, fmt.Errorf("mesh: rank %d over %v: %w", rank, kind, err)
	}
	if _, ok := ep.(transport.RMA); !ok {
		_ = ep.Close()
		return nil, fmt.Errorf("mesh: %v endpoints have no RMA: %w", kind, status.ErrUnsupported)
	}
	m.cfg.Logger.Debug("mesh: connected", "rank", rank, "kind", kind, "addr", addr)
	p.eps[kind] = ep
	return ep, nil
}

// Drop closes rank's endpoint over kind (after an error that may have broken it); the next
// Endpoint dials again.
func (m *Mesh) Drop(rank int, kind transport.ConnType, ep transport.Endpoint) {
	m.mu.Lock()
	p := m.peers[rank]
	m.mu.Unlock()
	if p == nil {
		return
	}
	p.mu.Lock()
	if cur, ok := p.eps[kind]; ok && cur == ep {
		delete(p.eps, kind)
	} else {
		ep = nil
	}
	p.mu.Unlock()
	if ep != nil {
		_ = ep.Close() // already failing
	}
}

// First returns the endpoint to rank over the first of kinds that connects (every endpoint the
// mesh makes is a transport.RMA), with the kind used. Errors of the kinds tried are joined.
func (m *Mesh) First(ctx context.Context, rank int, kinds []transport.ConnType) (transport.Endpoint, transport.ConnType, error) {
	var errs []error
	for _, k := range kinds {
		ep, err := m.Endpoint(ctx, rank, k)
		if err == nil {
			return ep, k, nil
		}
		errs = append(errs, err)
		if errors.Is(err, ErrNoPeer) || status.FromContext(ctx) != nil {
			break
		}
	}
	if len(errs) == 0 {
		return nil, 0, fmt.Errorf("mesh: rank %d: no transport allowed: %w", rank, status.ErrUnsupported)
	}
	return nil, 0, errors.Join(errs...)
}

// Close stops the servers and closes every endpoint.
func (m *Mesh) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	peers := m.peers
	m.peers = nil
	m.mu.Unlock()
	for _, p := range peers {
		p.close()
	}
	var errs []error
	for _, s := range m.servers {
		errs = append(errs, s.Close())
	}
	errs = append(errs, m.local.Close())
	return errors.Join(errs...)
}
