package trans

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hmc-go/hmc/auth"
	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/comm"
	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/fabric/internal/mesh"
	"github.com/hmc-go/hmc/fabric/internal/rpc"
	"github.com/hmc-go/hmc/fabric/internal/startup"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// Role is an engine's role (memfabric's smem_trans_role_t values).
type Role int

// The roles. A receiver does not initiate transfers; the others do. Every engine serves its
// registered memory.
const (
	RoleNone Role = iota
	Sender
	Receiver
	Both
)

// P2P is the metadata URL of Mooncake's store-less mode: peers are asked for their card.
const P2P = "P2PHANDSHAKE"

// Config configures an engine.
type Config struct {
	// UniqueID names the engine: "ip:port" or "[v6]:port", the address of its request socket
	// (port 0 picks a free one: see Engine.UniqueID). Required.
	UniqueID string
	// Role: Sender, Receiver or Both (the default).
	Role Role
	// Timeout bounds each transfer and request whose context has none (Mooncake's
	// MC_TRANSFER_TIMEOUT). Default 30 s.
	Timeout time.Duration
	// Kinds are the transports to serve and use, in order of preference: shared memory is
	// used only for peers on this host. Default SHM, TCP; add UCX for UCX/RDMA (-tags ucx).
	Kinds []transport.ConnType
	// Secret and TLS secure the store link; the secret also authenticates the hello/notify
	// requests and every data link (package auth).
	Secret []byte
	TLS    *tls.Config
	// Redis logs in to a redis:// metadata server.
	Redis RedisConfig
	// Transports builds the transports; nil: transport/stack's defaults (stack.New).
	Transports *comm.Registry
	// Logger receives connection and peer events; nil discards them.
	Logger *slog.Logger
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{Role: Both, Timeout: 30 * time.Second, Kinds: []transport.ConnType{transport.SHM, transport.TCP}}
}

// Buffer is a range of this process's memory.
type Buffer struct {
	Addr, Size uint64
	// Location is where the memory lives, as its driver said at registration, in Mooncake's
	// location names: "cpu" for host memory, "cuda:N" for CUDA device (or managed) memory of
	// device N, "hip:N" for HIP's. Empty in a request to register (and from older peers).
	Location string `json:",omitempty"`
}

// location names place p as a Buffer's Location.
func location(p memory.Place) string {
	if p.Kind == memory.Host || p.Kind == memory.PinnedHost {
		return "cpu"
	}
	if p.Vendor == memory.AMDGPU {
		return fmt.Sprintf("hip:%d", p.Device)
	}
	return fmt.Sprintf("cuda:%d", p.Device)
}

// Engine is one process's transfer engine. Its methods are safe for concurrent use.
type Engine struct {
	cfg     Config
	id      string // our unique id: the request socket's address
	log     *slog.Logger
	table   *buffer.Table
	mesh    *mesh.Mesh
	srv     *rpc.Server
	client  *rpc.Client
	kv      store.Client // a store's client (tcp://, etcd://); nil otherwise
	web     kvMeta       // an HTTP or Redis metadata server's client; nil otherwise
	unwatch func()
	rank    int // our slot in the store (-1 without one)

	mu      sync.Mutex
	regs    map[uint64]*buffer.Region            // registered by address; guarded by mu
	order   []uint64                             // registration order; guarded by mu
	managed map[uint64]*buffer.ConnBuffer        // Malloc'ed, by address; guarded by mu
	peers   map[string]*peer                     // by unique id; guarded by mu
	byRank  map[int]string                       // store slot -> unique id of known peers; guarded by mu
	nextID  int                                  // mesh ids handed to peers; guarded by mu
	rings   map[memory.Place]*transport.HostRing // staging for local device memory; guarded by mu
	notifs  []Notify                             // received; guarded by mu
	closed  bool                                 // guarded by mu

	wg sync.WaitGroup // batches' goroutines
}

type peer struct {
	uid  string
	id   int // its id in the mesh (local)
	card mesh.Card
	rank int // its store slot, -1 when unknown
}

// hello is what a peer answers about itself.
type hello struct {
	Card    mesh.Card `json:"card"`
	Rank    int       `json:"rank"`
	Buffers []Buffer  `json:"buffers"`
}

// Notify is a notification delivered with (after) a transfer, or alone (Mooncake's NotifyDesc,
// NIXL's notif): the sender's unique id and a message.
type Notify struct {
	Name string `json:"name"`
	Msg  string `json:"msg"`
}

// MaxNotifies bounds the notifications an engine keeps unread; past it the oldest are dropped.
const MaxNotifies = 1 << 16

// ParseUniqueID checks a unique id, "ip:port" or "[v6]:port", and returns host and port.
func ParseUniqueID(uid string) (string, int, error) {
	host, port, err := net.SplitHostPort(uid)
	if err == nil && net.ParseIP(host) == nil {
		err = fmt.Errorf("%q is not an IP address", host)
	}
	p, perr := strconv.Atoi(port)
	if err == nil && (perr != nil || p < 0 || p > 65535) {
		err = fmt.Errorf("port %q", port)
	}
	if err != nil {
		return "", 0, fmt.Errorf("trans: unique id %q (want ip:port or [v6]:port): %w: %w", uid, status.ErrInvalidConfig, err)
	}
	return host, p, nil
}

// Create starts an engine named cfg.UniqueID with metadata at metadataURL, in any form
// NormalizeMetadata takes: P2P / "" for none, tcp:// or etcd:// (or Mooncake's bare host:port)
// for a store, http:// for Mooncake's HTTP metadata server, redis://. Every face starts the
// same way: Init or Create(ctx, URL, Config).
func Create(ctx context.Context, metadataURL string, cfg Config) (_ *Engine, err error) {
	uniqueID := cfg.UniqueID
	metadataURL, err = NormalizeMetadata(metadataURL)
	if err != nil {
		return nil, err
	}
	def := DefaultConfig()
	if cfg.Role == RoleNone {
		cfg.Role = def.Role
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = def.Timeout
	}
	if cfg.Kinds == nil {
		cfg.Kinds = def.Kinds
	}
	if cfg.Role < Sender || cfg.Role > Both || cfg.Timeout < 0 {
		return nil, fmt.Errorf("trans: role %d, timeout %v: %w", cfg.Role, cfg.Timeout, status.ErrInvalidConfig)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	host, _, err := ParseUniqueID(uniqueID)
	if err != nil {
		return nil, err
	}
	e := &Engine{cfg: cfg, log: cfg.Logger.With("trans", uniqueID), table: buffer.NewTable(), rank: -1,
		regs: make(map[uint64]*buffer.Region), managed: make(map[uint64]*buffer.ConnBuffer),
		peers: make(map[string]*peer), byRank: make(map[int]string)}
	defer func() {
		if err != nil {
			_ = e.Close()
		}
	}()
	var kinds []transport.ConnType
	for _, k := range cfg.Kinds {
		if k != transport.TCP {
			kinds = append(kinds, k)
		}
	}
	if e.mesh, err = mesh.New(e.table, mesh.Config{BindIP: host, Kinds: kinds, Transports: cfg.Transports, Auth: auth.Config{Secret: cfg.Secret}, Logger: e.log}); err != nil {
		if slices.Contains(kinds, transport.RDMA) {
			return nil, fmt.Errorf("trans: protocol rdma: %w (pass protocol \"tcp\", or set MC_FORCE_TCP=1 to make \"rdma\" mean tcp)", err)
		}
		return nil, fmt.Errorf("trans: %w", err)
	}
	if e.srv, err = rpc.Listen(uniqueID, e.handle, cfg.Timeout, cfg.Secret); err != nil {
		return nil, fmt.Errorf("trans: %w", err)
	}
	e.id = e.srv.Addr()
	e.client = rpc.NewClient(cfg.Timeout, cfg.Secret)
	switch {
	case metadataURL == P2P:
	case strings.HasPrefix(metadataURL, "http://"), strings.HasPrefix(metadataURL, "https://"), strings.HasPrefix(metadataURL, "redis://"):
		if err := e.openKV(ctx, metadataURL); err != nil {
			return nil, err
		}
	default:
		if err := e.openStore(ctx, metadataURL); err != nil {
			return nil, err
		}
	}
	e.log.Info("trans: engine up", "id", e.id, "card", e.mesh.Card().Addrs, "slot", e.rank)
	return e, nil
}

// openStore takes this engine's slot by its unique id, publishes its card and follows peers'
// liveness.
func (e *Engine) openStore(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	set := startup.Settings{InitTimeout: e.cfg.Timeout, ControlTimeout: e.cfg.Timeout, Secret: e.cfg.Secret, TLS: e.cfg.TLS,
		Transports: e.cfg.Transports, Logger: e.log}
	kv, rank, err := startup.OpenStoreByName(ctx, "trans", url, set, "trans/", e.id)
	if err != nil {
		return err
	}
	e.kv, e.rank = kv, rank
	e.unwatch = e.kv.WatchRankDown(e.rankDown)
	h, _ := json.Marshal(e.hello()) // a hello always marshals
	if err := e.kv.Set(ctx, engineKey(e.id), h); err != nil {
		return fmt.Errorf("trans: publishing the card: %w", err)
	}
	return nil
}

// rankDown drops the peer whose store link died.
func (e *Engine) rankDown(rank int) {
	e.mu.Lock()
	uid, ok := e.byRank[rank]
	e.mu.Unlock()
	if ok {
		e.log.Info("trans: peer down", "peer", uid, "slot", rank)
		e.forget(uid)
	}
}

// UniqueID returns this engine's unique id (its request socket's address).
func (e *Engine) UniqueID() string { return e.id }

// Slot returns this engine's stable slot in the metadata store (-1 without one).
func (e *Engine) Slot() int { return e.rank }

func (e *Engine) hello() hello {
	e.mu.Lock()
	defer e.mu.Unlock()
	h := hello{Card: e.mesh.Card(), Rank: e.rank}
	for _, a := range e.order {
		if r, ok := e.regs[a]; ok {
			h.Buffers = append(h.Buffers, Buffer{Addr: r.Addr(), Size: r.Size(), Location: location(r.Place())})
		}
	}
	return h
}

// handle answers peers' requests: hello (our card and buffers) and notify.
func (e *Engine) handle(_ context.Context, method string, body json.RawMessage) (any, error) {
	switch method {
	case "hello":
		return e.hello(), nil
	case "notify":
		var n []Notify
		if err := json.Unmarshal(body, &n); err != nil {
			return nil, fmt.Errorf("trans: notify: %w: %w", status.ErrProtocol, err)
		}
		e.mu.Lock()
		e.notifs = append(e.notifs, n...)
		if over := len(e.notifs) - MaxNotifies; over > 0 {
			e.notifs = slices.Delete(e.notifs, 0, over)
		}
		e.mu.Unlock()
		return nil, nil
	}
	return nil, fmt.Errorf("trans: no method %q: %w", method, status.ErrProtocol)
}

// Notifies returns the notifications received since the last call (Mooncake's get_notifies).
func (e *Engine) Notifies() []Notify {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := e.notifs
	e.notifs = nil
	return n
}

// Register registers size bytes at addr, which stay valid until Deregister: peers may read and
// write them from the moment Register returns. A range inside a registered one is counted
// (each needs its Deregister); one straddling a registered range's edge is refused.
func (e *Engine) Register(addr, size uint64) error {
	if addr == 0 || size == 0 || addr+size < addr {
		return fmt.Errorf("trans: register %d bytes at %#x: %w", size, addr, status.ErrInvalidConfig)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return fmt.Errorf("trans: %w", status.ErrClosed)
	}
	if r, ok := e.regs[addr]; ok {
		if r.Size() == size {
			return nil
		}
		return fmt.Errorf("trans: %#x is registered with %d bytes, not %d: %w", addr, r.Size(), size, status.ErrInvalidConfig)
	}
	pl, err := memory.LocateRange(memory.Ptr(addr), size) // the driver says what it is: never assumed
	if err != nil {
		return fmt.Errorf("trans: register: %w", err)
	}
	var r *buffer.Region
	if pl.OnDevice() {
		r, err = e.table.RegisterDevice(memory.Ptr(addr), size, pl)
	} else {
		r, err = e.table.Register(memory.HostSlice(memory.Ptr(addr), size))
	}
	if err != nil {
		return fmt.Errorf("trans: register: %w", err)
	}
	e.regs[addr] = r
	e.order = append(e.order, addr)
	return nil
}

// BatchRegister registers many ranges: overlapping and adjacent ones are coalesced first
// (memfabric's batch semantics); on error none stays registered.
func (e *Engine) BatchRegister(bufs []Buffer) error {
	if len(bufs) == 0 || len(bufs) > 1<<20 {
		return fmt.Errorf("trans: batch of %d buffers: %w", len(bufs), status.ErrInvalidConfig)
	}
	sorted := slices.Clone(bufs)
	slices.SortFunc(sorted, func(a, b Buffer) int { return compare(a.Addr, b.Addr) })
	var merged []Buffer
	for _, b := range sorted {
		if b.Addr == 0 || b.Size == 0 || b.Addr+b.Size < b.Addr {
			return fmt.Errorf("trans: register %d bytes at %#x: %w", b.Size, b.Addr, status.ErrInvalidConfig)
		}
		if n := len(merged); n > 0 && b.Addr <= merged[n-1].Addr+merged[n-1].Size {
			merged[n-1].Size = max(merged[n-1].Size, b.Addr+b.Size-merged[n-1].Addr)
			continue
		}
		merged = append(merged, b)
	}
	for i, b := range merged {
		if err := e.Register(b.Addr, b.Size); err != nil {
			for _, done := range merged[:i] {
				_ = e.Deregister(context.Background(), done.Addr) // undoing this call's own work
			}
			return err
		}
	}
	return nil
}

func compare(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Deregister undoes Register of the range at addr (unknown: ErrNotFound), waiting within ctx
// for peers' transfers in flight on it; later ones fail.
func (e *Engine) Deregister(ctx context.Context, addr uint64) error {
	e.mu.Lock()
	r, ok := e.regs[addr]
	if ok {
		delete(e.regs, addr)
		e.order = slices.DeleteFunc(e.order, func(a uint64) bool { return a == addr })
	}
	e.mu.Unlock()
	if !ok {
		return fmt.Errorf("trans: nothing registered at %#x: %w", addr, status.ErrNotFound)
	}
	return e.table.Deregister(ctx, r)
}

// Malloc allocates size bytes of shareable host memory (a memfd, which peers on this host map)
// and registers it; Free gives it back.
func (e *Engine) Malloc(size uint64) (uint64, error) {
	if size == 0 || size > 128<<30 {
		return 0, fmt.Errorf("trans: malloc of %d bytes (1 .. 128 GiB): %w", size, status.ErrInvalidConfig)
	}
	cb, err := buffer.New(0, size, memory.CPU)
	if err != nil {
		return 0, err
	}
	r, err := e.table.RegisterBuffer(cb)
	if err != nil {
		_ = cb.Close()
		return 0, err
	}
	addr := r.Addr()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		_ = e.table.Deregister(context.Background(), r)
		_ = cb.Close()
		return 0, fmt.Errorf("trans: %w", status.ErrClosed)
	}
	e.regs[addr], e.managed[addr] = r, cb
	e.order = append(e.order, addr)
	return addr, nil
}

// Free deregisters and frees memory from Malloc.
func (e *Engine) Free(ctx context.Context, addr uint64) error {
	e.mu.Lock()
	cb, ok := e.managed[addr]
	delete(e.managed, addr)
	e.mu.Unlock()
	if !ok {
		return fmt.Errorf("trans: %#x was not allocated by Malloc: %w", addr, status.ErrNotFound)
	}
	err := e.Deregister(ctx, addr)
	return errors.Join(err, cb.Close())
}

// Buffers returns this engine's registered ranges, in registration order.
func (e *Engine) Buffers() []Buffer { return e.hello().Buffers }

// PeerBuffers asks peer for its registered ranges (Mooncake's get_first_buffer_address is the
// first's address).
func (e *Engine) PeerBuffers(ctx context.Context, uid string) ([]Buffer, error) {
	var h hello
	if err := e.call(ctx, uid, "hello", nil, &h); err != nil {
		return nil, err
	}
	return h.Buffers, nil
}

func (e *Engine) call(ctx context.Context, uid, method string, req, resp any) error {
	if _, _, err := ParseUniqueID(uid); err != nil {
		return err
	}
	if err := e.client.Call(ctx, uid, method, req, resp); err != nil {
		return fmt.Errorf("trans: peer %s: %w", uid, err)
	}
	return nil
}

// peer returns the peer named uid, asking it for its card on first use.
func (e *Engine) peer(ctx context.Context, uid string) (*peer, error) {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil, fmt.Errorf("trans: %w", status.ErrClosed)
	}
	p := e.peers[uid]
	e.mu.Unlock()
	if p != nil {
		return p, nil
	}
	if err := e.published(ctx, uid); err != nil {
		return nil, err
	}
	var h hello
	if err := e.call(ctx, uid, "hello", nil, &h); err != nil {
		return nil, err
	}
	if err := h.Card.Validate(); err != nil { // the peer's answer: untrusted
		return nil, fmt.Errorf("trans: peer %s: %w", uid, err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if p := e.peers[uid]; p != nil {
		return p, nil // a concurrent caller was first
	}
	e.nextID++
	p = &peer{uid: uid, id: e.nextID, card: h.Card, rank: h.Rank}
	p.card.Rank = p.id // the mesh knows peers by local id
	e.peers[uid] = p
	if h.Rank >= 0 && e.kv != nil {
		e.byRank[h.Rank] = uid
	}
	e.mesh.Add(p.card)
	e.log.Debug("trans: peer known", "peer", uid, "addrs", h.Card.Addrs)
	return p, nil
}

// forget drops a peer: its endpoints close, and the next transfer asks it again (a restarted
// process under the same id is reached anew).
func (e *Engine) forget(uid string) {
	e.mu.Lock()
	p := e.peers[uid]
	delete(e.peers, uid)
	if p != nil && p.rank >= 0 && e.byRank[p.rank] == uid {
		delete(e.byRank, p.rank)
	}
	e.mu.Unlock()
	if p != nil {
		e.mesh.Remove(p.id)
	}
	e.client.Forget(uid)
}

// Peers returns the unique ids of the engines published in the metadata store (nil in P2P
// mode).
func (e *Engine) Peers(ctx context.Context) ([]string, error) {
	if e.kv == nil {
		return nil, nil
	}
	var out []string
	for r := 0; ; r++ {
		name, err := e.kv.Get(ctx, "trans/rank_by_name#"+strconv.Itoa(r), 0)
		if errors.Is(err, store.ErrNotExist) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if s := string(name); s != e.id && !strings.ContainsRune(s, 0) {
			out = append(out, s)
		}
	}
}

// Close stops serving, waits for submitted transfers, and frees what Malloc allocated. Memory
// registered with Register stays the caller's.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	managed := e.managed
	e.managed = map[uint64]*buffer.ConnBuffer{}
	e.mu.Unlock()
	e.wg.Wait()
	var errs []error
	if e.unwatch != nil {
		e.unwatch()
	}
	if e.kv != nil {
		errs = append(errs, e.kv.Close())
	}
	if e.web != nil {
		ctx, cancel := context.WithTimeout(context.Background(), e.cfg.Timeout)
		if err := e.web.Delete(ctx, kvPrefix+engineKey(e.id)); err != nil && !errors.Is(err, status.ErrNotFound) {
			e.log.Warn("trans: could not withdraw this engine from the metadata server", "err", err) // peers find it dead
		}
		cancel()
		e.web.Close()
	}
	if e.srv != nil {
		errs = append(errs, e.srv.Close())
	}
	if e.client != nil {
		e.client.Close()
	}
	if e.mesh != nil {
		errs = append(errs, e.mesh.Close())
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.Timeout)
	defer cancel()
	e.mu.Lock()
	regs := e.regs
	e.regs = map[uint64]*buffer.Region{}
	for _, r := range e.rings { // every batch has ended (wg): no transfer uses them
		errs = append(errs, r.Close())
	}
	e.rings = nil
	e.mu.Unlock()
	for _, r := range regs {
		errs = append(errs, e.table.Deregister(ctx, r))
	}
	for _, cb := range managed {
		errs = append(errs, cb.Close())
	}
	return errors.Join(errs...)
}
