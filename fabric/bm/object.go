package bm

import (
	"context"
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
	"github.com/hmc-go/hmc/coord/group"
	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/fabric/internal/gva"
	"github.com/hmc-go/hmc/fabric/internal/mesh"
	"github.com/hmc-go/hmc/fabric/internal/startup"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// ErrRankDown is returned by copies to or from a rank that is not a member: it never joined,
// left, or died (the group removed it).
var ErrRankDown = fmt.Errorf("%w: bm: rank is not a member", status.ErrPeerClosed)

// desc is what a joining rank publishes about its slices.
type desc struct {
	Card      mesh.Card `json:"card"`
	Agent     string    `json:"agent"` // its copy agent's address (G2G forwarding)
	Tag       string    `json:"tag"`
	TagOpInfo string    `json:"tag_ops"`
	Ops       DataOp    `json:"ops"`
	DRAM      uint64    `json:"dram"` // local sizes
	HBM       uint64    `json:"hbm"`
}

// member is a joined rank as this process sees it.
type member struct {
	rank  int
	d     desc
	kinds []transport.ConnType // the transports to it, in priority order (fixed at admission)
	mu    sync.RWMutex         // copies through mapped hold it shared; unmapping takes it
	mapd  []byte               // its DRAM slice mapped at its GVA (same host), or nil
	gone  bool                 // guarded by mu
}

// BigMemory is one Big Memory object (upstream's smem_bm_t): this rank's slices and its view
// of every member's. Its methods are safe for concurrent use.
type BigMemory struct {
	f    *Fabric
	id   int
	opts Options
	rank int
	log  *slog.Logger
	ctl  time.Duration

	dram, hbm *gva.Space     // nil when the object has no such space
	local     []byte         // this rank's DRAM slice, at its GVA
	hbmBuf    *memory.Buffer // this rank's HBM slice (device memory)
	table     *buffer.Table
	region    *buffer.Region // the DRAM slice in table
	mesh      *mesh.Mesh
	agent     *agent
	kv        store.Client // prefixed with the object's namespace
	grp       *group.Group
	tags      tagTable

	localFD   int         // the memfd behind local (0: none)
	stages    chan []byte // staging buffers for other ranks' HBM (registered in table)
	stageRegs []*buffer.Region
	copier    *startup.Copier // host-to-host copies (parallel from 1 MiB)
	followMu  sync.Mutex      // serialises follow

	mu      sync.RWMutex
	members map[int]*member           // guarded by mu
	seen    map[int]bool              // ranks ever admitted (a rank not here has never joined); guarded by mu
	user    map[uint64]*buffer.Region // RegisterUserMem, by address; guarded by mu
	joined  bool                      // guarded by mu
	closed  bool                      // guarded by mu
	stopCB  func()

	pend pending // ASYNC copies
}

// Create makes object id (0..254) in this process: it reserves the object's spaces at the bases
// every rank uses, backs this rank's slices and starts serving them. Peers reach them after
// Join. (Upstream's smem_bm_create2; purely local but for reading or publishing the layout.)
func (f *Fabric) Create(ctx context.Context, id int, o Options) (b *BigMemory, err error) {
	if id < 0 || id > MaxID {
		return nil, fmt.Errorf("bm: object id %d (want 0..%d): %w", id, MaxID, status.ErrInvalidConfig)
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	tags, err := parseTagOps(o.TagOpInfo)
	if err != nil {
		return nil, err
	}
	tags[tagKey(o.Tag, o.Tag)] |= o.DataOps
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil, fmt.Errorf("bm: %w", status.ErrClosed)
	}
	if _, ok := f.objects[id]; ok {
		f.mu.Unlock()
		return nil, fmt.Errorf("bm: object %d exists: %w", id, status.ErrInvalidConfig)
	}
	b = &BigMemory{f: f, id: id, opts: o, rank: f.Rank(), log: f.log.With("bm", id), ctl: f.cfg.ControlTimeout,
		table: buffer.NewTable(), tags: tags, members: make(map[int]*member), seen: make(map[int]bool), user: make(map[uint64]*buffer.Region)}
	f.objects[id] = b
	f.mu.Unlock()
	made := b // the error returns below return a nil b
	defer func() {
		if err != nil {
			_ = made.teardown()
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, b.ctl)
	defer cancel()
	b.kv = store.Prefixed(f.client, "SMEM_BM_"+strconv.Itoa(id)+"_")
	if b.copier, err = startup.NewCopier(); err != nil {
		return nil, err
	}
	if err := b.reserve(ctx); err != nil {
		return nil, err
	}
	if err := b.backSlices(); err != nil {
		return nil, err
	}
	var kinds []transport.ConnType
	if o.DataOps&OpHostSHM != 0 {
		kinds = append(kinds, transport.SHM)
	}
	if o.DataOps&OpHostRDMA != 0 {
		kinds = append(kinds, transport.UCX)
	}
	mc := mesh.Config{Rank: b.rank, BindIP: f.cfg.BindIP, Kinds: kinds, Transports: f.cfg.Transports, Auth: auth.Config{Secret: f.cfg.Secret}, Logger: b.log}
	if b.mesh, err = mesh.New(b.table, mc); err != nil {
		if o.DataOps&OpHostRDMA == 0 || !errors.Is(err, status.ErrUnsupported) {
			return nil, err
		}
		// UCX is not in this build or has no device: the rank goes on without HOST_RDMA.
		b.log.Info("bm: HOST_RDMA unavailable", "err", err)
		b.opts.DataOps &^= OpHostRDMA
		mc.Kinds = kinds[:len(kinds)-1]
		if b.mesh, err = mesh.New(b.table, mc); err != nil {
			return nil, err
		}
	}
	if b.agent, err = startAgent(b); err != nil {
		return nil, err
	}
	if b.grp, err = startup.JoinGroup(ctx, f.client, "SMEM_BM_"+strconv.Itoa(id)+"_G", 0, startup.Settings{ControlTimeout: b.ctl, Logger: b.log}); err != nil {
		return nil, err
	}
	b.stopCB = b.grp.OnViewChange(func(_, v group.View) { b.follow(v) })
	return b, nil
}

// reserve reserves the object's spaces where the first creator did (each space's layout is
// published in the store), or first-fit when this process is the first.
func (b *BigMemory) reserve(ctx context.Context) (err error) {
	if b.opts.MaxDRAM > 0 {
		if b.dram, err = gva.ReservePublished(ctx, b.kv, "layout/dram", b.opts.MaxDRAM, b.f.world); err != nil {
			return fmt.Errorf("bm: object %d DRAM space: %w", b.id, err)
		}
	}
	if b.opts.MaxHBM > 0 {
		if b.hbm, err = gva.ReservePublished(ctx, b.kv, "layout/hbm", b.opts.MaxHBM, b.f.world); err != nil {
			b.releaseSpaces()
			return fmt.Errorf("bm: object %d HBM space: %w", b.id, err)
		}
	}
	return nil
}

func (b *BigMemory) releaseSpaces() {
	if b.dram != nil {
		_ = b.dram.Release() // nothing was mapped by others through it yet
		b.dram = nil
	}
	if b.hbm != nil {
		_ = b.hbm.Release()
		b.hbm = nil
	}
}

// backSlices maps this rank's DRAM slice at its GVA (from a new memfd, or the caller's) and
// allocates its HBM slice.
func (b *BigMemory) backSlices() error {
	if n := b.opts.LocalDRAM; n > 0 {
		var fd int
		var err error
		if b.opts.Flags&FlagCreateWithShm != 0 {
			var st unix.Stat_t
			if err := unix.Fstat(b.opts.DRAMShmFD, &st); err != nil {
				return fmt.Errorf("bm: DRAM shm descriptor %d: %w: %w", b.opts.DRAMShmFD, status.ErrInvalidConfig, err)
			}
			if uint64(st.Size) < n {
				if err := unix.Ftruncate(b.opts.DRAMShmFD, int64(n)); err != nil {
					return fmt.Errorf("bm: growing the DRAM shm descriptor to %d: %w: %w", n, status.ErrFailed, err)
				}
			}
			fd, err = unix.FcntlInt(uintptr(b.opts.DRAMShmFD), unix.F_DUPFD_CLOEXEC, 0)
		} else {
			fd, err = gva.NewSliceFD("hmc-bm-"+strconv.Itoa(b.id), n)
		}
		if err != nil {
			if fd > 0 {
				_ = unix.Close(fd)
			}
			return fmt.Errorf("bm: DRAM slice of %d bytes: %w: %w", n, status.ErrFailed, err)
		}
		b.local, err = b.dram.MapShared(uint64(b.rank)*b.dram.Stride, n, fd, 0)
		if err != nil {
			_ = unix.Close(fd)
			return fmt.Errorf("bm: DRAM slice: %w", err)
		}
		b.region, err = b.table.RegisterShared(b.local, fd, 0)
		if err != nil {
			_ = unix.Close(fd)
			return err
		}
		b.localFD = fd
	}
	if b.opts.MaxHBM > 0 {
		// Copies between this process's memory and another rank's HBM are staged here, where
		// the owner's agent reaches them one-sidedly.
		b.stages = make(chan []byte, stageCount)
		for range stageCount {
			st := make([]byte, bounceChunk)
			r, err := b.table.Register(st)
			if err != nil {
				return err
			}
			b.stageRegs = append(b.stageRegs, r)
			b.stages <- st
		}
	}
	if n := b.opts.LocalHBM; n > 0 {
		dev, err := b.f.device()
		if err != nil {
			return err
		}
		if b.hbmBuf, err = dev.Alloc(n); err != nil {
			return fmt.Errorf("bm: HBM slice of %d bytes: %w", n, err)
		}
	}
	return nil
}

// stageCount is the number of staging buffers of an object with HBM.
const stageCount = 2

// ID returns the object's id.
func (b *BigMemory) ID() int { return b.id }

// Rank returns this process's rank.
func (b *BigMemory) Rank() int { return b.rank }

// Local returns this rank's DRAM slice (at its GVA).
func (b *BigMemory) Local() []byte { return b.local }

// Join publishes this rank's slices and adds it to the object's members; peers map or reach
// them from then on, and this rank reaches theirs. A member's Join returns at once.
func (b *BigMemory) Join(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, b.ctl)
	defer cancel()
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return fmt.Errorf("bm: %w", status.ErrClosed)
	}
	joined := b.joined
	b.mu.Unlock()
	if joined {
		return nil
	}
	d := desc{Card: b.mesh.Card(), Agent: b.agent.addr(), Tag: b.opts.Tag, TagOpInfo: b.opts.TagOpInfo, Ops: b.opts.DataOps,
		DRAM: b.opts.LocalDRAM, HBM: b.opts.LocalHBM}
	enc, _ := json.Marshal(d) // a desc always marshals
	if err := b.kv.Set(ctx, "desc/"+strconv.Itoa(b.rank), enc); err != nil {
		return fmt.Errorf("bm: join: %w", err)
	}
	v, err := b.grp.Join(ctx)
	if err != nil {
		return fmt.Errorf("bm: join: %w", err)
	}
	b.mu.Lock()
	b.joined = true
	b.mu.Unlock()
	b.follow(v)
	b.log.Info("bm: joined", "rank", b.rank, "members", v.Members)
	return nil
}

// Leave removes this rank from the members: peers drop its slices, and it drops theirs.
func (b *BigMemory) Leave(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, b.ctl)
	defer cancel()
	b.mu.Lock()
	joined := b.joined
	b.mu.Unlock()
	if !joined {
		return fmt.Errorf("bm: leave: not joined: %w", status.ErrInvalidConfig)
	}
	if err := b.pend.wait(ctx); err != nil {
		b.log.Info("bm: leave: an async copy failed", "err", err)
	}
	if _, err := b.grp.Leave(ctx); err != nil {
		return fmt.Errorf("bm: leave: %w", err)
	}
	b.mu.Lock()
	b.joined = false
	b.mu.Unlock()
	b.follow(group.View{})
	b.log.Info("bm: left", "rank", b.rank)
	return nil
}

// Members returns the ranks this process knows as members now (itself included once joined).
func (b *BigMemory) Members() []int {
	return b.grp.View().Members
}

// WaitMembers waits until n ranks are members in this process's view.
func (b *BigMemory) WaitMembers(ctx context.Context, n int) error {
	_, err := b.grp.WaitView(ctx, func(v group.View) bool { return v.Size() >= n })
	if err != nil {
		return fmt.Errorf("bm: waiting for %d members: %w", n, err)
	}
	b.follow(b.grp.View())
	return nil
}

// Barrier returns when every member has called it (upstream's BM has none; its examples build
// one over TCP).
func (b *BigMemory) Barrier(ctx context.Context) error {
	if err := b.grp.Barrier(ctx); err != nil {
		return fmt.Errorf("bm: barrier: %w", err)
	}
	return nil
}

// follow brings the members in line with the group's current view (the view a caller passes
// may be stale: a view-change callback can run before Join has marked this rank joined, and
// Join's own view is older than one adopted meanwhile): new ranks' descriptors are read and
// their slices mapped (same host) or made reachable; gone ranks' are dropped. Serialised by
// followMu.
func (b *BigMemory) follow(group.View) {
	b.followMu.Lock()
	defer b.followMu.Unlock()
	v := b.grp.View()
	b.mu.RLock()
	joined, closed := b.joined, b.closed
	b.mu.RUnlock()
	if closed {
		return
	}
	want := map[int]bool{}
	if joined && v.Has(b.rank) {
		for _, r := range v.Members {
			if r != b.rank {
				want[r] = true
			}
		}
	}
	b.mu.RLock()
	var drop []*member
	for r, m := range b.members {
		if !want[r] {
			drop = append(drop, m)
		}
	}
	b.mu.RUnlock()
	for _, m := range drop {
		b.drop(m)
	}
	for r := range want {
		b.mu.RLock()
		_, ok := b.members[r]
		b.mu.RUnlock()
		if !ok {
			if err := b.admit(r); err != nil {
				b.log.Warn("bm: member not admitted", "rank", r, "err", err)
			}
		}
	}
}

// decodeDesc decodes rank r's descriptor (from the store: untrusted) and refuses one that
// names another rank, carries a card no process of ours would publish, or has slices past the
// strides (0: this process has no such space, and does not look).
func decodeDesc(raw []byte, r int, dramStride, hbmStride uint64) (desc, error) {
	var d desc
	if err := json.Unmarshal(raw, &d); err != nil {
		return desc{}, fmt.Errorf("bm: rank %d's descriptor: %w: %w", r, status.ErrProtocol, err)
	}
	if d.Card.Rank != r {
		return desc{}, fmt.Errorf("bm: rank %d's descriptor names rank %d: %w", r, d.Card.Rank, status.ErrProtocol)
	}
	if err := d.Card.Validate(); err != nil {
		return desc{}, fmt.Errorf("bm: rank %d's descriptor: %w", r, err)
	}
	if dramStride != 0 && d.DRAM > dramStride || hbmStride != 0 && d.HBM > hbmStride {
		return desc{}, fmt.Errorf("bm: rank %d's slices exceed the strides: %w", r, status.ErrProtocol)
	}
	if _, err := parseTagOps(d.TagOpInfo); err != nil {
		return desc{}, fmt.Errorf("bm: rank %d's descriptor: %w: %w", r, status.ErrProtocol, err)
	}
	return d, nil
}

// admit reads rank r's descriptor, teaches the mesh its card and maps its DRAM slice when it
// is on this host and both may use shared memory.
func (b *BigMemory) admit(r int) error {
	ctx, cancel := context.WithTimeout(context.Background(), b.ctl)
	defer cancel()
	raw, err := b.kv.Get(ctx, "desc/"+strconv.Itoa(r), 10*time.Second)
	if err != nil {
		return err
	}
	var dramStride, hbmStride uint64
	if b.dram != nil {
		dramStride = b.dram.Stride
	}
	if b.hbm != nil {
		hbmStride = b.hbm.Stride
	}
	d, err := decodeDesc(raw, r, dramStride, hbmStride)
	if err != nil {
		return err
	}
	b.mesh.Add(d.Card)
	ops := b.pairOps(d)
	m := &member{rank: r, d: d, kinds: b.kindsFor(ops, d)}
	if d.DRAM > 0 && b.dram != nil && b.mesh.SameHost(d.Card) && ops&OpHostSHM != 0 {
		if err := b.mapMember(ctx, m); err != nil {
			b.log.Info("bm: co-located slice not mapped; copies go through the transports", "rank", r, "err", err)
		}
	}
	b.mu.Lock()
	b.members[r] = m
	b.seen[r] = true
	b.mu.Unlock()
	b.log.Debug("bm: member admitted", "rank", r, "mapped", m.mapd != nil)
	return nil
}

// mapMember maps co-located member m's DRAM slice at its GVA.
func (b *BigMemory) mapMember(ctx context.Context, m *member) error {
	ep, err := b.mesh.Endpoint(ctx, m.rank, transport.SHM)
	if err != nil {
		return err
	}
	mem, err := b.dram.MapPeer(ctx, ep, m.rank, m.d.DRAM)
	if err != nil {
		return err
	}
	m.mapd = mem
	return nil
}

// drop forgets member m: its mapping goes back to no access once no copy uses it, and its
// endpoints close (copies in flight fail).
func (b *BigMemory) drop(m *member) {
	b.mu.Lock()
	if b.members[m.rank] == m {
		delete(b.members, m.rank)
	}
	b.mu.Unlock()
	m.mu.Lock()
	m.gone = true
	if m.mapd != nil {
		if err := b.dram.Unmap(b.dram.Slice(m.rank) - b.dram.Base); err != nil {
			b.log.Warn("bm: unmapping a member's slice", "rank", m.rank, "err", err)
		}
		m.mapd = nil
	}
	m.mu.Unlock()
	b.mesh.Remove(m.rank)
	b.log.Info("bm: member dropped (it left, or died)", "rank", m.rank)
}

// member returns rank r's member entry (not this rank). A rank the group has but this
// process has not admitted (its admission failed, say) is admitted now.
func (b *BigMemory) member(r int) (*member, error) {
	b.mu.RLock()
	m, ok := b.members[r]
	joined := b.joined
	b.mu.RUnlock()
	if !ok && joined && b.grp.View().Has(r) {
		m, ok = b.admitLate(r)
	}
	if !ok {
		return nil, fmt.Errorf("rank %d: %w", r, ErrRankDown)
	}
	return m, nil
}

// admitLate admits rank r, a member of the view that follow has not admitted. It only adds
// (a caller may hold another member's mapping lock, which dropping would wait for).
func (b *BigMemory) admitLate(r int) (*member, bool) {
	b.followMu.Lock()
	defer b.followMu.Unlock()
	b.mu.RLock()
	m, ok := b.members[r]
	b.mu.RUnlock()
	if ok {
		return m, true
	}
	if err := b.admit(r); err != nil {
		b.log.Warn("bm: member not admitted", "rank", r, "err", err)
		return nil, false
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	m, ok = b.members[r]
	return m, ok
}

// pairOps returns the data ops allowed between this rank and a member with descriptor d:
// both ranks' own ops, filtered by the tag table of each side for the pair.
func (b *BigMemory) pairOps(d desc) DataOp {
	ops := b.opts.DataOps & d.Ops
	mine := b.tags[tagKey(b.opts.Tag, d.Tag)]
	theirs, err := parseTagOps(d.TagOpInfo)
	if err != nil {
		return 0
	}
	theirs[tagKey(d.Tag, d.Tag)] |= d.Ops
	if b.opts.Tag == d.Tag {
		return ops // same tag: both ranks' ops
	}
	return ops & (mine | theirs[tagKey(b.opts.Tag, d.Tag)])
}

// Destroy leaves (if joined), stops serving and frees this rank's slices and spaces.
func (b *BigMemory) Destroy(ctx context.Context) error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	joined := b.joined
	b.mu.Unlock()
	var errs []error
	if joined {
		if err := b.Leave(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, b.teardown())
	return errors.Join(errs...)
}

// teardown releases everything Create made (after a failed Create too).
func (b *BigMemory) teardown() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	b.mu.Unlock()
	b.pend.wait(context.Background()) //nolint:errcheck // errors went to their callers' Wait
	var errs []error
	if b.stopCB != nil {
		b.stopCB()
	}
	if b.grp != nil {
		errs = append(errs, b.grp.Close())
	}
	if b.agent != nil {
		errs = append(errs, b.agent.close())
	}
	b.mu.Lock()
	ms := make([]*member, 0, len(b.members))
	for _, m := range b.members {
		ms = append(ms, m)
	}
	user := b.user
	b.user = map[uint64]*buffer.Region{}
	b.mu.Unlock()
	b.followMu.Lock()
	for _, m := range ms {
		b.drop(m)
	}
	b.followMu.Unlock()
	if b.mesh != nil {
		errs = append(errs, b.mesh.Close())
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.ctl)
	defer cancel()
	for _, r := range user {
		errs = append(errs, b.table.Deregister(ctx, r))
	}
	if b.region != nil {
		errs = append(errs, b.table.Deregister(ctx, b.region))
	}
	for _, r := range b.stageRegs {
		errs = append(errs, b.table.Deregister(ctx, r))
	}
	if b.localFD > 0 {
		errs = append(errs, unix.Close(b.localFD))
	}
	if b.hbmBuf != nil {
		dev, _ := b.f.device() // it allocated the buffer
		errs = append(errs, dev.Free(b.hbmBuf))
	}
	b.releaseSpaces()
	if b.copier != nil {
		b.copier.Close()
	}
	b.f.mu.Lock()
	if b.f.objects[b.id] == b {
		delete(b.f.objects, b.id)
	}
	b.f.mu.Unlock()
	return errors.Join(errs...)
}
