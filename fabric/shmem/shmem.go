package shmem

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hmc-go/hmc/auth"
	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/comm"
	"github.com/hmc-go/hmc/coord/group"
	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/fabric/internal/gva"
	"github.com/hmc-go/hmc/fabric/internal/mesh"
	"github.com/hmc-go/hmc/fabric/internal/startup"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// Limits, as upstream's.
const (
	MaxWorldSize        = store.MaxWorldSize
	MaxID               = 63
	MinSize      uint64 = 2 << 20
	MaxSize      uint64 = 4 << 30
	SizeAlign    uint64 = 2 << 20
	// MaxExtraContext bounds SetExtraContext's blob.
	MaxExtraContext = 64 << 10
	// privSize is each rank's private block: team flags for barriers and signals.
	privSize uint64 = 2 << 20
)

// DataOp is a set of data operations (upstream's smem_shm_data_op_type values): MTE is a
// plain load/store through a mapping (a co-located rank), RDMA a one-sided transport (TCP or
// UCX here; upstream's device RDMA).
type DataOp uint32

// The data operations.
const (
	OpMTE  DataOp = 1
	OpSDMA DataOp = 2
	OpRDMA DataOp = 4
)

// Config configures Init (upstream's smem_shm_config_t).
type Config struct {
	// World is the number of ranks (1..MaxWorldSize), Rank this process's (explicit, as
	// upstream), Device its GPU. DefaultConfig: a world of 1, rank 0, device 0.
	World, Rank, Device int
	// InitTimeout bounds Init; ControlTimeout each control operation and collective set-up.
	// Defaults 120 s.
	InitTimeout, ControlTimeout time.Duration
	// StartStore lets rank 0 start the store when the URL's address is local and free.
	// Default true (DefaultConfig).
	StartStore bool
	// BindIP is the address data servers listen on and peers dial. Default 127.0.0.1.
	BindIP string
	// Kinds are the transports to use: SHM maps co-located ranks' blocks (leave it out to
	// reach them over the network too); TCP always; UCX for UCX/RDMA builds. Default SHM, TCP.
	Kinds []transport.ConnType
	// Secret and TLS secure the store link; the secret also authenticates every data link
	// (package auth).
	Secret []byte
	TLS    *tls.Config
	// Transports builds the transports; nil: transport/stack's defaults (stack.New).
	Transports *comm.Registry
	// Logger receives set-up events; nil discards them.
	Logger *slog.Logger
}

// DefaultConfig returns upstream's defaults (smem_shm_config_init).
func DefaultConfig() Config {
	return Config{World: 1, InitTimeout: startup.DefaultTimeout, ControlTimeout: startup.DefaultTimeout, StartStore: true,
		Kinds: []transport.ConnType{transport.SHM, transport.TCP}}
}

// World is one process's place in a Share Memory world (upstream's smem_shm_init state).
type World struct {
	cfg    Config
	world  int
	rank   int
	client store.Client
	server *store.Server
	grp    *group.Group // static: ranks 0..world-1
	log    *slog.Logger

	mu    sync.Mutex
	heaps map[int]*Heap // guarded by mu
	extra []byte        // guarded by mu
}

// Init joins the world of cfg.World ranks as cfg.Rank (explicit ranks only, as upstream); rank
// 0 starts the store at storeURL when StartStore is set and the address is local and free.
//
// Every face starts the same way: Init or Create(ctx, URL, Config).
func Init(ctx context.Context, storeURL string, cfg Config) (*World, error) {
	worldSize, rank := cfg.World, cfg.Rank
	if cfg.Kinds == nil {
		cfg.Kinds = DefaultConfig().Kinds
	}
	set := cfg.settings()
	set.Fill()
	cfg.InitTimeout, cfg.ControlTimeout, cfg.Logger = set.InitTimeout, set.ControlTimeout, set.Logger
	if err := set.Validate("shmem"); err != nil {
		return nil, err
	}
	if worldSize < 1 || worldSize > MaxWorldSize || rank < 0 || rank >= worldSize {
		return nil, fmt.Errorf("shmem: rank %d in a world of %d (1..%d): %w", rank, worldSize, MaxWorldSize, status.ErrInvalidConfig)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.InitTimeout)
	defer cancel()
	w := &World{cfg: cfg, world: worldSize, rank: rank, heaps: make(map[int]*Heap), log: cfg.Logger.With("shmem_rank", rank)}
	var err error
	if w.client, w.server, err = startup.OpenStore(ctx, "shmem", storeURL, set, startup.Member{World: worldSize, Rank: rank}); err != nil {
		return nil, err
	}
	if w.grp, err = startup.JoinGroup(ctx, w.client, "SHM_W", worldSize, startup.Settings{ControlTimeout: cfg.ControlTimeout, Logger: w.log}); err != nil {
		_ = w.client.Close()
		if w.server != nil {
			_ = w.server.Close()
		}
		return nil, fmt.Errorf("shmem: init: %w", err)
	}
	return w, nil
}

// settings are cfg's share of what every face is configured with.
func (cfg Config) settings() startup.Settings {
	return startup.Settings{InitTimeout: cfg.InitTimeout, ControlTimeout: cfg.ControlTimeout, StartStore: cfg.StartStore,
		BindIP: cfg.BindIP, Secret: cfg.Secret, TLS: cfg.TLS, Transports: cfg.Transports, Logger: cfg.Logger}
}

// Rank returns this process's rank; Size the world's.
func (w *World) Rank() int { return w.rank }

// Size returns the number of ranks.
func (w *World) Size() int { return w.world }

// Store returns the store link.
func (w *World) Store() store.Client { return w.client }

// Close destroys the heaps still open and leaves the store (upstream's smem_shm_uninit).
func (w *World) Close() error {
	w.mu.Lock()
	hs := make([]*Heap, 0, len(w.heaps))
	for _, h := range w.heaps {
		hs = append(hs, h)
	}
	w.mu.Unlock()
	var errs []error
	for _, h := range hs {
		errs = append(errs, h.destroy())
	}
	errs = append(errs, w.grp.Close(), w.client.Close())
	if w.server != nil {
		errs = append(errs, w.server.Close())
	}
	return errors.Join(errs...)
}

// peer is another rank as the heap reaches it.
type peer struct {
	card mesh.Card
	heap []byte // its block, mapped at its global address (same host), or nil
	priv []byte // its private block, likewise
	ops  DataOp
}

// Heap is a symmetric heap (upstream's smem_shm_t).
type Heap struct {
	w      *World
	id     int
	size   uint64
	space  *gva.Space // the heap: rank r's block at Base + r × size
	pspace *gva.Space // the private blocks (team flags)
	local  []byte
	priv   []byte
	fds    [2]int
	table  *buffer.Table
	regs   []*buffer.Region
	mesh   *mesh.Mesh
	copier *startup.Copier
	peers  []*peer // by rank; nil for this rank
	kinds  []transport.ConnType

	nbiMu sync.Mutex
	nbi   []*transport.Op // non-blocking operations since the last Quiet

	maps [][]byte // by rank: the bitmap of private blocks it maps (mapsBitmap), from Create

	teamMu sync.Mutex
	teams  int // team slots handed out (world = 0)
	world  *Team
}

// desc is what a rank tells the others at Create.
type desc struct {
	Card mesh.Card `json:"card"`
	SHM  bool      `json:"shm"` // it maps co-located blocks
}

// Create makes heap id (0..63) of size bytes per rank (2 MiB multiples, 2 MiB .. 4 GiB):
// collective over the world. Rank r's block is Base() + r × size in every process.
func (w *World) Create(ctx context.Context, id int, size uint64) (h *Heap, err error) {
	if id < 0 || id > MaxID {
		return nil, fmt.Errorf("shmem: heap id %d (0..%d): %w", id, MaxID, status.ErrInvalidConfig)
	}
	if size < MinSize || size > MaxSize || size%SizeAlign != 0 {
		return nil, fmt.Errorf("shmem: heap of %d bytes (2 MiB multiples, 2 MiB .. 4 GiB): %w", size, status.ErrInvalidConfig)
	}
	w.mu.Lock()
	if _, ok := w.heaps[id]; ok {
		w.mu.Unlock()
		return nil, fmt.Errorf("shmem: heap %d exists: %w", id, status.ErrInvalidConfig)
	}
	h = &Heap{w: w, id: id, size: size, table: buffer.NewTable(), fds: [2]int{-1, -1}, peers: make([]*peer, w.world)}
	w.heaps[id] = h
	w.mu.Unlock()
	made := h // the error returns below return a nil h
	defer func() {
		if err != nil {
			_ = made.destroy()
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, w.cfg.ControlTimeout)
	defer cancel()
	if err := w.grp.Barrier(ctx); err != nil {
		return nil, fmt.Errorf("shmem: create: %w", err)
	}
	if h.copier, err = startup.NewCopier(); err != nil {
		return nil, err
	}
	kv := store.Prefixed(w.client, "SHM_"+strconv.Itoa(id)+"_")
	if h.space, err = gva.ReservePublished(ctx, kv, "layout/heap", size, w.world); err != nil {
		return nil, fmt.Errorf("shmem: %w", err)
	}
	if h.pspace, err = gva.ReservePublished(ctx, kv, "layout/priv", privSize, w.world); err != nil {
		return nil, fmt.Errorf("shmem: %w", err)
	}
	if h.local, h.fds[0], err = h.back(h.space, size, "hmc-shmem"); err != nil {
		return nil, err
	}
	if h.priv, h.fds[1], err = h.back(h.pspace, privSize, "hmc-shmem-priv"); err != nil {
		return nil, err
	}
	var extra []transport.ConnType
	useSHM := false
	for _, k := range w.cfg.Kinds {
		switch k {
		case transport.SHM:
			useSHM = true
			extra = append(extra, k)
		case transport.TCP:
		default:
			extra = append(extra, k)
			h.kinds = append(h.kinds, k)
		}
	}
	h.kinds = append(h.kinds, transport.TCP)
	if h.mesh, err = mesh.New(h.table, mesh.Config{Rank: w.rank, BindIP: w.cfg.BindIP, Kinds: extra, Transports: w.cfg.Transports, Auth: auth.Config{Secret: w.cfg.Secret}, Logger: w.log}); err != nil {
		return nil, fmt.Errorf("shmem: %w", err)
	}
	me, _ := json.Marshal(desc{Card: h.mesh.Card(), SHM: useSHM}) // a desc always marshals
	all, err := w.grp.AllGather(ctx, me)
	if err != nil {
		return nil, fmt.Errorf("shmem: create: %w", err)
	}
	for r, raw := range all {
		if r == w.rank {
			continue
		}
		d, err := decodeDesc(raw, r)
		if err != nil {
			return nil, err
		}
		h.mesh.Add(d.Card)
		p := &peer{card: d.Card, ops: OpRDMA}
		if useSHM && d.SHM && h.mesh.SameHost(d.Card) {
			if err := h.mapPeer(ctx, r, p); err != nil {
				w.log.Info("shmem: co-located block not mapped; reached over the network", "rank", r, "err", err)
			}
		}
		h.peers[r] = p
	}
	// Every rank learns which blocks every other maps, so all members of a team choose the same
	// barrier (team.go); this allgather is also the closing barrier of Create.
	if all, err = w.grp.AllGather(ctx, h.mapsBitmap()); err != nil {
		return nil, fmt.Errorf("shmem: create: %w", err)
	}
	h.maps = all
	h.world = h.newTeam(seq(w.world), w.rank, 0)
	h.teams = 1
	return h, nil
}

// mapsBitmap is bit s set for every rank s whose private block this rank maps (itself included).
func (h *Heap) mapsBitmap() []byte {
	b := make([]byte, (h.w.world+7)/8)
	for s := range h.w.world {
		if h.mapped(s, true) != nil {
			b[s/8] |= 1 << (s % 8)
		}
	}
	return b
}

// rankMaps says whether rank r maps rank s's private block, as r told everyone at Create (a
// short or missing entry says no).
func (h *Heap) rankMaps(r, s int) bool {
	if r < 0 || r >= len(h.maps) || s < 0 || s/8 >= len(h.maps[r]) {
		return false
	}
	return h.maps[r][s/8]&(1<<(s%8)) != 0
}

// decodeDesc decodes rank r's descriptor (from the allgather: untrusted) and refuses one that
// names another rank or carries a card no process of ours would publish.
func decodeDesc(raw []byte, r int) (desc, error) {
	var d desc
	if err := json.Unmarshal(raw, &d); err != nil {
		return desc{}, fmt.Errorf("shmem: rank %d's descriptor: %w: %w", r, status.ErrProtocol, err)
	}
	if d.Card.Rank != r {
		return desc{}, fmt.Errorf("shmem: rank %d's descriptor names rank %d: %w", r, d.Card.Rank, status.ErrProtocol)
	}
	if err := d.Card.Validate(); err != nil {
		return desc{}, fmt.Errorf("shmem: rank %d's descriptor: %w", r, err)
	}
	return d, nil
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// back maps this rank's block of space from a new memfd and registers it.
func (h *Heap) back(space *gva.Space, size uint64, name string) ([]byte, int, error) {
	fd, err := gva.NewSliceFD(name, size)
	if err != nil {
		return nil, -1, err
	}
	b, err := space.MapShared(uint64(h.w.rank)*space.Stride, size, fd, 0)
	if err != nil {
		_ = unix.Close(fd)
		return nil, -1, err
	}
	r, err := h.table.RegisterShared(b, fd, 0)
	if err != nil {
		_ = unix.Close(fd)
		return nil, -1, err
	}
	h.regs = append(h.regs, r)
	return b, fd, nil
}

// mapPeer maps co-located rank r's blocks at their global addresses.
func (h *Heap) mapPeer(ctx context.Context, r int, p *peer) error {
	ep, err := h.mesh.Endpoint(ctx, r, transport.SHM)
	if err != nil {
		return err
	}
	if p.heap, err = h.space.MapPeer(ctx, ep, r, h.size); err != nil {
		return err
	}
	if p.priv, err = h.pspace.MapPeer(ctx, ep, r, privSize); err != nil {
		_ = h.space.Unmap(h.space.Slice(r) - h.space.Base)
		p.heap = nil
		return err
	}
	p.ops |= OpMTE
	return nil
}

// Destroy ends the heap (collective: every rank calls it).
//
// The closing barrier only keeps a rank from unmapping its block while others still copy to it;
// a rank that is gone by then (it finished first; often the one that served the store) leaves
// nothing to wait for, so its absence is logged, not returned: the local teardown's errors are.
func (h *Heap) Destroy(ctx context.Context) error {
	if err := h.w.grp.Barrier(ctx); err != nil {
		h.w.log.Info("shmem: destroy: closing barrier incomplete", "heap", h.id, "err", err)
	}
	return h.destroy()
}

func (h *Heap) destroy() error {
	h.w.mu.Lock()
	if h.w.heaps[h.id] != h {
		h.w.mu.Unlock()
		return nil
	}
	delete(h.w.heaps, h.id)
	h.w.mu.Unlock()
	var errs []error
	_ = h.Quiet(context.Background()) // their errors went to their callers
	if h.mesh != nil {
		errs = append(errs, h.mesh.Close())
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.w.cfg.ControlTimeout)
	defer cancel()
	for _, r := range h.regs {
		errs = append(errs, h.table.Deregister(ctx, r))
	}
	for _, fd := range h.fds {
		if fd >= 0 {
			errs = append(errs, unix.Close(fd))
		}
	}
	for _, s := range []*gva.Space{h.space, h.pspace} {
		if s != nil {
			errs = append(errs, s.Release())
		}
	}
	if h.copier != nil {
		h.copier.Close()
	}
	return errors.Join(errs...)
}

// Base returns the heap's global base address: rank r's block is Base() + r × Size().
func (h *Heap) Base() uint64 { return h.space.Base }

// Size returns the per-rank block size.
func (h *Heap) Size() uint64 { return h.size }

// Rank returns this process's rank; NumRanks the world's size.
func (h *Heap) Rank() int { return h.w.rank }

// NumRanks returns the number of ranks.
func (h *Heap) NumRanks() int { return h.w.world }

// Local returns this rank's block.
func (h *Heap) Local() []byte { return h.local }

// Ptr returns rank pe's block when this process maps it (this rank, or a co-located rank):
// plain loads and stores reach it. nil otherwise (OpenSHMEM's shmem_ptr).
func (h *Heap) Ptr(pe int) []byte {
	if pe == h.w.rank {
		return h.local
	}
	if pe < 0 || pe >= len(h.peers) || h.peers[pe] == nil {
		return nil
	}
	return h.peers[pe].heap
}

// TopologyCanReach returns the data operations that reach rank pe: MTE (load/store) for a
// mapped rank, RDMA (a one-sided transport) for every rank.
func (h *Heap) TopologyCanReach(pe int) (DataOp, error) {
	if pe < 0 || pe >= h.w.world {
		return 0, fmt.Errorf("shmem: rank %d of %d: %w", pe, h.w.world, status.ErrInvalidConfig)
	}
	if pe == h.w.rank {
		return OpMTE | OpRDMA, nil
	}
	return h.peers[pe].ops, nil
}

// QuerySupportDataOperation returns the operations this build offers.
func QuerySupportDataOperation() DataOp { return OpMTE | OpRDMA }

// SetExtraContext keeps a blob of 1..64 KiB for the application (upstream copies it to the
// device for its kernels).
func (w *World) SetExtraContext(b []byte) error {
	if len(b) == 0 || len(b) > MaxExtraContext {
		return fmt.Errorf("shmem: extra context of %d bytes (1..%d): %w", len(b), MaxExtraContext, status.ErrInvalidConfig)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.extra = append([]byte(nil), b...)
	return nil
}

// ExtraContext returns the blob SetExtraContext kept.
func (w *World) ExtraContext() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]byte(nil), w.extra...)
}

// ControlBarrier is a barrier over the store among all ranks (upstream's
// smem_shm_control_barrier); Heap teams' Barrier is the fast one.
func (w *World) ControlBarrier(ctx context.Context) error { return w.grp.Barrier(ctx) }

// ControlAllGather gathers every rank's data (1..64 KiB, the same length everywhere) in rank
// order over the store.
func (w *World) ControlAllGather(ctx context.Context, data []byte) ([]byte, error) {
	if len(data) == 0 || len(data) > 64<<10 {
		return nil, fmt.Errorf("shmem: allgather of %d bytes (1..65536): %w", len(data), status.ErrInvalidConfig)
	}
	parts, err := w.grp.AllGather(ctx, data)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(data)*len(parts))
	for r, p := range parts {
		if len(p) != len(data) {
			return nil, fmt.Errorf("shmem: rank %d gave %d bytes, not %d: %w", r, len(p), len(data), status.ErrInvalidConfig)
		}
		out = append(out, p...)
	}
	return out, nil
}

// SubGroup returns the keyed sub-group of the given ranks (upstream's subgroup barrier and
// allgather); every member uses the same key and ranks.
func (w *World) SubGroup(key string, ranks []int) (*group.SubGroup, error) {
	if len(key) == 0 || len(key) >= 64 {
		return nil, fmt.Errorf("shmem: sub-group key of %d characters (1..63): %w", len(key), status.ErrInvalidConfig)
	}
	return w.grp.Sub(key, ranks)
}

// AllocNumber takes the lowest free number of 0..limit-1 (limit ≤ 1024) shared by the world
// (upstream's atomic value allocator); ReleaseNumber frees it.
func (w *World) AllocNumber(ctx context.Context, limit int) (int, error) {
	if limit < 1 || limit > group.MaxNumbers {
		return 0, fmt.Errorf("shmem: number limit %d (1..%d): %w", limit, group.MaxNumbers, status.ErrInvalidConfig)
	}
	n, err := w.grp.AllocNumber(ctx)
	if err != nil {
		return 0, err
	}
	if n >= limit {
		_ = w.grp.ReleaseNumber(ctx, n)
		return 0, fmt.Errorf("shmem: the lowest free number %d is not below %d: %w", n, limit, status.ErrFailed)
	}
	return n, nil
}

// ReleaseNumber frees a number AllocNumber gave.
func (w *World) ReleaseNumber(ctx context.Context, n int) error { return w.grp.ReleaseNumber(ctx, n) }

// OnExit registers fn for the world's exit broadcast; GlobalExit broadcasts status.
func (w *World) OnExit(fn func(status int)) (stop func()) {
	return w.grp.OnExit(func(s string) {
		v, _ := strconv.Atoi(s)
		fn(v)
	})
}

// GlobalExit tells every rank that registered OnExit (upstream's smem_shm_global_exit).
func (w *World) GlobalExit(ctx context.Context, status int) error {
	return w.grp.Exit(ctx, strconv.Itoa(status))
}
