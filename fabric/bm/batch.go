package bm

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hmc-go/hmc/coord/group"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// MaxBatch bounds the elements of one CopyBatch.
const MaxBatch = 1 << 20

// item is one resolved element of a batch.
type item struct {
	s, d end
	n    uint64
	idx  int // its first element's index, for errors
}

// CopyBatch copies every element, each with its own direction (upstream takes element 0's
// for all): elements are resolved and range-checked first (nothing moves if one is bad),
// grouped by (source rank, destination rank), contiguous neighbours merged, and each group's
// transfers posted together and waited for once. flags: FlagAsync returns after the checks;
// Wait completes the copies and reports their first error.
func (b *BigMemory) CopyBatch(ctx context.Context, ps []CopyParams, t CopyType, flags uint32) error {
	if len(ps) == 0 || len(ps) > MaxBatch {
		return fmt.Errorf("bm: batch of %d elements (want 1..%d): %w", len(ps), MaxBatch, status.ErrInvalidConfig)
	}
	if err := b.usable(); err != nil {
		return err
	}
	items := make([]item, 0, len(ps))
	for i, p := range ps {
		s, d, err := b.resolve(p.Src, p.Dst, p.Size, t)
		if err != nil {
			if len(ps) > 1 {
				return fmt.Errorf("bm: batch element %d: %w", i, err)
			}
			return err
		}
		items = append(items, item{s: s, d: d, n: p.Size, idx: i})
	}
	if flags&FlagAsync != 0 {
		b.pend.add()
		go func() { // owned by b: Wait, Leave and Destroy wait for it
			ctx, cancel := context.WithTimeout(context.Background(), b.ctl)
			defer cancel()
			b.pend.done(b.run(ctx, items))
		}()
		return nil
	}
	return b.run(ctx, items)
}

// awaitJoins waits for the ranks items reach that have never been members here to join,
// within ctx and the control timeout: a copy issued before its peer has joined (ranks start in
// any order) runs once it has. A rank that was a member and is gone is not waited for: its
// copies fail with ErrRankDown when they run.
func (b *BigMemory) awaitJoins(ctx context.Context, items []item) error {
	var want []int
	for _, it := range items {
		for _, e := range [2]end{it.s, it.d} {
			if (e.w == globalHost || e.w == globalDevice) && e.rank != b.rank && !slices.Contains(want, e.rank) {
				want = append(want, e.rank)
			}
		}
	}
	for _, r := range want {
		b.mu.RLock()
		_, member := b.members[r]
		seen, joined := b.seen[r], b.joined
		b.mu.RUnlock()
		if member || seen || !joined || b.grp.View().Has(r) {
			continue
		}
		start := time.Now()
		b.log.Info("bm: waiting for a rank to join", "rank", r, "up to", b.ctl)
		wctx, cancel := context.WithTimeout(ctx, b.ctl)
		_, err := b.grp.WaitView(wctx, func(v group.View) bool { return v.Has(r) })
		cancel()
		if err != nil {
			if cerr := status.FromContext(ctx); cerr != nil && !errors.Is(cerr, status.ErrTimeout) {
				return fmt.Errorf("bm: waiting for rank %d to join: %w", r, cerr)
			}
			return fmt.Errorf("bm: rank %d has not joined (waited %v): %w", r, time.Since(start).Round(time.Millisecond), status.ErrTimeout)
		}
		b.log.Info("bm: rank joined; copies to it run", "rank", r, "waited", time.Since(start).Round(time.Millisecond))
	}
	return nil
}

func (b *BigMemory) usable() error {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return fmt.Errorf("bm: object %d: %w", b.id, status.ErrClosed)
	}
	return nil
}

// run executes resolved items: merged per rank pair; the one-sided ones of a pair posted on one
// endpoint together; the rest one by one.
func (b *BigMemory) run(ctx context.Context, items []item) error {
	if err := b.awaitJoins(ctx, items); err != nil {
		return err
	}
	if len(items) == 1 {
		return b.copyOne(ctx, items[0].s, items[0].d, items[0].n)
	}
	// Grouped by rank pair. A batch of one pair (the usual KV block) is its own group, and
	// merge works in place in items, which the batch owns: a batch makes a few allocations,
	// not a copy of its items per step.
	pair := func(it item) [2]int { return [2]int{rankOf(it.s, b.rank), rankOf(it.d, b.rank)} }
	first := pair(items[0])
	groups := map[[2]int][]item{first: items}
	order := [][2]int{first}
	if slices.ContainsFunc(items, func(it item) bool { return pair(it) != first }) {
		clear(groups)
		order = order[:0]
		for _, it := range items {
			k := pair(it)
			if _, ok := groups[k]; !ok {
				order = append(order, k)
			}
			groups[k] = append(groups[k], it)
		}
	}
	type posted struct {
		op  *transport.Op
		its []item // the elements the op carries (several: one vector)
	}
	var ops []posted
	var errs []error
	for _, k := range order {
		g := merge(groups[k])
		if k[0] != b.rank && k[1] != b.rank && k[0] != k[1] && allHost(g) && !b.mapped(k[0]) && !b.mapped(k[1]) {
			// Neither end is here: the source's owner runs the group in one request.
			ps := make([]fwdItem, len(g))
			for i, it := range g {
				ps[i] = fwd(it.s.addr, it.d.addr, it.n)
			}
			if err := b.forward(ctx, k[0], ps); err != nil {
				errs = append(errs, fmt.Errorf("elements from rank %d to rank %d: %w", k[0], k[1], err))
			}
			continue
		}
		rest := make([]item, 0, len(g))
		// One-sided elements on an endpoint that carries vectors (TCP) go as one vector per
		// direction: a KV block's layers cost a message per megabyte, not a request each.
		type vec struct {
			v     transport.VectorRMA
			bufs  [][]byte
			rems  []transport.Remote
			its   []item
			write bool
		}
		var vecs []*vec
		for _, it := range g {
			pl, err := b.plan(ctx, it)
			switch {
			case err != nil:
				errs = append(errs, fmt.Errorf("element %d: %w", it.idx, err))
			case pl.r == nil:
				rest = append(rest, it)
			case pl.v != nil && len(g) > 1:
				var vc *vec
				for _, c := range vecs {
					if c.v == pl.v && c.write == pl.write {
						vc = c
					}
				}
				if vc == nil {
					vc = &vec{v: pl.v, write: pl.write, bufs: make([][]byte, 0, len(g)),
						rems: make([]transport.Remote, 0, len(g)), its: make([]item, 0, len(g))}
					vecs = append(vecs, vc)
				}
				vc.bufs, vc.rems, vc.its = append(vc.bufs, pl.buf), append(vc.rems, pl.remote), append(vc.its, it)
			default:
				op, err := pl.post(ctx)
				if err != nil {
					errs = append(errs, fmt.Errorf("element %d: %w", it.idx, err))
					continue
				}
				ops = append(ops, posted{op, []item{it}})
			}
		}
		for _, vc := range vecs {
			post := vc.v.ReadVAsync
			if vc.write {
				post = vc.v.WriteVAsync
			}
			op, err := post(ctx, vc.bufs, vc.rems)
			if err != nil {
				op = transport.Failed(err)
			}
			ops = append(ops, posted{op, vc.its})
		}
		errs = append(errs, b.runRest(ctx, rest)...)
	}
	for _, p := range ops {
		if err := p.op.Wait(ctx); err != nil {
			if final(ctx, err) {
				errs = append(errs, fmt.Errorf("elements %s: %w", indices(p.its), err))
				continue
			}
			// The endpoint failed: the elements go again with the fallback transports.
			for _, it := range p.its {
				if err := b.copyOne(ctx, it.s, it.d, it.n); err != nil {
					errs = append(errs, fmt.Errorf("element %d: %w", it.idx, err))
				}
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("bm: batch: %w", errors.Join(errs...))
	}
	return nil
}

// allHost says whether every item copies between DRAM slices.
func allHost(g []item) bool {
	for _, it := range g {
		if it.s.w != globalHost || it.d.w != globalHost {
			return false
		}
	}
	return true
}

// mapped says whether rank r's DRAM slice is mapped here (a co-located member).
func (b *BigMemory) mapped(r int) bool {
	m, err := b.member(r)
	if err != nil {
		return false
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.mapd != nil
}

// runRest runs items one by one, except that plain copies between memory this process
// addresses go to the copier together, so discrete pieces (each too small to be split) are
// shared among its helpers.
func (b *BigMemory) runRest(ctx context.Context, rest []item) []error {
	var errs []error
	dsts, srcs := make([][]byte, 0, len(rest)), make([][]byte, 0, len(rest))
	var h held // every member the batch's views reach, locked once until its copy is done
	var later []item
	for _, it := range rest {
		sv, sok, err := b.view(it.s, it.n, &h)
		if err == nil && sok {
			dv, dok, err2 := b.view(it.d, it.n, &h)
			if err2 == nil && dok && !overlaps(memory.AddrOf(sv), it.n, memory.AddrOf(dv), it.n) {
				dsts, srcs = append(dsts, dv), append(srcs, sv)
				continue
			}
			if err2 == nil && dok {
				copy(dv, sv) // overlapping: memmove
				continue
			}
			if err2 == nil {
				later = append(later, it) // copyOne locks members itself: after the release
				continue
			}
			err = err2
		} else if err == nil {
			later = append(later, it)
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("element %d: %w", it.idx, err))
		}
	}
	if len(srcs) > 0 {
		b.copier.CopyV(dsts, srcs)
	}
	h.release()
	for _, it := range later {
		if err := b.copyOne(ctx, it.s, it.d, it.n); err != nil {
			errs = append(errs, fmt.Errorf("element %d: %w", it.idx, err))
		}
	}
	return errs
}

// rankOf is the rank an end lives on (this rank for local memory).
func rankOf(e end, me int) int {
	if e.global() {
		return e.rank
	}
	return me
}

// merge joins neighbours whose sources and destinations are both contiguous, in g's own
// memory (g's items are not used after).
func merge(g []item) []item {
	out := g[:0]
	for _, it := range g {
		if n := len(out); n > 0 {
			last := &out[n-1]
			if last.s.w == it.s.w && last.d.w == it.d.w && last.s.addr+last.n == it.s.addr && last.d.addr+last.n == it.d.addr &&
				(!it.s.global() || last.s.rank == it.s.rank) && (!it.d.global() || last.d.rank == it.d.rank) {
				last.n += it.n
				continue
			}
		}
		out = append(out, it)
	}
	return out
}

// planned is a one-sided element: its local bytes, the remote range and the endpoint (and
// the endpoint as a VectorRMA when it is one).
type planned struct {
	r      transport.RMA
	v      transport.VectorRMA
	buf    []byte
	remote transport.Remote
	write  bool
}

func (p planned) post(ctx context.Context) (*transport.Op, error) {
	if p.write {
		return p.r.WriteAsync(ctx, p.buf, p.remote)
	}
	return p.r.ReadAsync(ctx, p.buf, p.remote)
}

// plan finds how element it goes one-sidedly: r is nil when it does not (a plain copy, or
// one for copyOne).
func (b *BigMemory) plan(ctx context.Context, it item) (planned, error) {
	var remote end
	var write bool
	var localEnd end
	switch {
	case it.d.w == globalHost && it.d.rank != b.rank && it.s.w == localHost, it.d.w == globalHost && it.d.rank != b.rank && it.s.w == globalHost && it.s.rank == b.rank:
		remote, write, localEnd = it.d, true, it.s
	case it.s.w == globalHost && it.s.rank != b.rank && it.d.w == localHost, it.s.w == globalHost && it.s.rank != b.rank && it.d.w == globalHost && it.d.rank == b.rank:
		remote, localEnd = it.s, it.d
	default:
		return planned{}, nil
	}
	m, err := b.member(remote.rank)
	if err != nil {
		return planned{}, err
	}
	m.mu.RLock()
	mapped := m.mapd != nil
	m.mu.RUnlock()
	if mapped {
		return planned{}, nil // a plain copy
	}
	buf, _, _, err := b.hostView(localEnd, it.n)
	if err != nil {
		return planned{}, err
	}
	ep, _, err := b.mesh.First(ctx, remote.rank, m.kinds)
	if err != nil {
		return planned{}, nil // no endpoint: copyOne reports why
	}
	pl := planned{r: ep.(transport.RMA), buf: buf, remote: transport.Remote{Addr: remote.addr}, write: write}
	pl.v, _ = ep.(transport.VectorRMA)
	return pl, nil
}

// indices names elements by their batch indices ("3" or "3, 5, 8").
func indices(its []item) string {
	s := make([]string, len(its))
	for i, it := range its {
		s[i] = strconv.Itoa(it.idx)
	}
	return strings.Join(s, ", ")
}

// Wait waits for every ASYNC copy issued so far and returns the first error among them
// (success when nothing is pending; upstream fails unless SDMA is configured).
func (b *BigMemory) Wait(ctx context.Context) error { return b.pend.wait(ctx) }

// pending counts ASYNC copies in flight.
type pending struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to 0
	err  error         // the first error since the last wait
}

func (p *pending) add() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n == 0 {
		p.idle = make(chan struct{})
	}
	p.n++
}

func (p *pending) done(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil && p.err == nil {
		p.err = err
	}
	if p.n--; p.n == 0 {
		close(p.idle)
	}
}

func (p *pending) wait(ctx context.Context) error {
	p.mu.Lock()
	n, idle := p.n, p.idle
	p.mu.Unlock()
	if n > 0 {
		select {
		case <-idle:
		case <-ctx.Done():
			return status.FromContext(ctx)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	err := p.err
	p.err = nil
	return err
}

// RegisterUserMem registers size bytes of this process's host memory at addr, so peers can
// reach it one-sidedly and local copies from and to it need no staging. The same address with
// the same size again is a no-op; with another size it is an error.
func (b *BigMemory) RegisterUserMem(addr, size uint64) error {
	if addr == 0 || size == 0 || size > 1<<40 || addr+size < addr {
		return fmt.Errorf("bm: register %d bytes at %#x: %w", size, addr, status.ErrInvalidConfig)
	}
	if (b.dram != nil && overlaps(b.dram.Base, b.dram.Size(), addr, size)) || (b.hbm != nil && overlaps(b.hbm.Base, b.hbm.Size(), addr, size)) {
		return fmt.Errorf("bm: register [%#x, +%d): inside the global space: %w", addr, size, status.ErrInvalidConfig)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return fmt.Errorf("bm: %w", status.ErrClosed)
	}
	if r, ok := b.user[addr]; ok {
		if r.Size() != size {
			return fmt.Errorf("bm: %#x is registered with %d bytes, not %d: %w", addr, r.Size(), size, status.ErrInvalidConfig)
		}
		return nil
	}
	mem, err := memory.HostRange(memory.Ptr(addr), size) // a device address would crash a host copy
	if err != nil {
		return fmt.Errorf("bm: register: %w (device memory joins an object as its HBM slice, LocalHBM, and is copied "+
			"with the LocalDevice copy types without registration)", err)
	}
	r, err := b.table.Register(mem)
	if err != nil {
		return fmt.Errorf("bm: register: %w", err)
	}
	b.user[addr] = r
	return nil
}

// UnregisterUserMem undoes RegisterUserMem (an unknown address is a no-op), waiting for peers'
// operations on the memory within ctx.
func (b *BigMemory) UnregisterUserMem(ctx context.Context, addr uint64) error {
	b.mu.Lock()
	r, ok := b.user[addr]
	delete(b.user, addr)
	b.mu.Unlock()
	if !ok {
		return nil
	}
	return b.table.Deregister(ctx, r)
}

// PtrByMemType returns rank's first address in the global space of kind t (Host: DRAM,
// Device: HBM); rank 0 gives the space's base.
func (b *BigMemory) PtrByMemType(t MemType, rank int) (uint64, error) {
	if rank < 0 || rank >= b.f.world {
		return 0, fmt.Errorf("bm: rank %d in a world of %d: %w", rank, b.f.world, status.ErrInvalidConfig)
	}
	switch {
	case t == Host && b.dram != nil:
		return b.dram.Slice(rank), nil
	case t == Device && b.hbm != nil:
		return b.hbm.Slice(rank), nil
	case t == Host || t == Device:
		return 0, fmt.Errorf("bm: object %d has no %v space: %w", b.id, t, status.ErrNotFound)
	}
	return 0, fmt.Errorf("bm: memory type %d has no global space: %w", int(t), status.ErrInvalidConfig)
}

// RankByGVA returns the rank whose slice holds gva (dividing by the stride).
func (b *BigMemory) RankByGVA(gva uint64) (int, error) {
	if b.dram != nil {
		if r, _ := b.dram.RankOf(gva); r >= 0 {
			return r, nil
		}
	}
	if b.hbm != nil {
		if r, _ := b.hbm.RankOf(gva); r >= 0 {
			return r, nil
		}
	}
	return -1, fmt.Errorf("bm: %#x is not a global address of object %d: %w", gva, b.id, status.ErrOutOfRange)
}

// LocalMemSize returns this rank's slice size of kind t (LocalHost/Host: DRAM,
// LocalDevice/Device: HBM).
func (b *BigMemory) LocalMemSize(t MemType) uint64 {
	switch t {
	case Host, LocalHost:
		return b.opts.LocalDRAM
	case Device, LocalDevice:
		return b.opts.LocalHBM
	}
	return 0
}

func (t MemType) String() string {
	switch t {
	case LocalDevice:
		return "local device"
	case LocalHost:
		return "local host"
	case Device:
		return "device"
	case Host:
		return "host"
	}
	return fmt.Sprintf("MemType(%d)", int(t))
}
