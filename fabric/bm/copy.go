package bm

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"syscall"

	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// where is the kind of memory one end of a copy lies in.
type where uint8

const (
	localHost    where = iota // this process's memory, by address
	localDevice               // this process's GPU memory, by device address
	globalHost                // a rank's DRAM slice
	globalDevice              // a rank's HBM slice
	peerHost                  // memory a peer registered in its table (its staging buffer)
)

func (w where) String() string {
	return [...]string{"local host", "local device", "global host", "global device", "peer host"}[w]
}

// end is one side of a copy, resolved.
type end struct {
	w    where
	addr uint64
	rank int    // owner of a global end
	off  uint64 // offset in the owner's slice
}

func (e end) global() bool { return e.w == globalHost || e.w == globalDevice }

// oneSided says whether e is reached by RMA at its address on its rank (a DRAM slice or a
// peer's registered memory).
func (e end) oneSided() bool { return e.w == globalHost || e.w == peerHost }

// CopyParams is one element of a batch (upstream's smem_copy_params).
type CopyParams struct {
	Src, Dst, Size uint64
}

// global resolves a GVA; hostOnly refuses the HBM space.
func (b *BigMemory) global(addr, n uint64, hostOnly bool) (end, error) {
	if b.dram != nil && b.dram.Contains(addr, 1) {
		r, off := b.dram.RankOf(addr)
		return end{w: globalHost, addr: addr, rank: r, off: off}, b.checkSlice(r, off, n, b.dram.Stride, true)
	}
	if !hostOnly && b.hbm != nil && b.hbm.Contains(addr, 1) {
		r, off := b.hbm.RankOf(addr)
		return end{w: globalDevice, addr: addr, rank: r, off: off}, b.checkSlice(r, off, n, b.hbm.Stride, false)
	}
	space := "global"
	if hostOnly {
		space = "global host"
	}
	return end{}, fmt.Errorf("bm: %#x is not a %s address of object %d: %w", addr, space, b.id, status.ErrOutOfRange)
}

// checkSlice checks [off, off+n) against rank r's slice: inside the stride, and inside what
// the rank backs (its local size; a non-member's is checked when the copy runs).
func (b *BigMemory) checkSlice(r int, off, n, stride uint64, host bool) error {
	if n > stride-off {
		return fmt.Errorf("bm: %d bytes at offset %#x of rank %d's slice cross its end (stride %#x): %w", n, off, r, stride, status.ErrOutOfRange)
	}
	size, ok := b.sliceSize(r, host)
	if ok && n > size-min(off, size) {
		return fmt.Errorf("bm: %d bytes at offset %#x of rank %d's slice: it backs %#x bytes: %w", n, off, r, size, status.ErrOutOfRange)
	}
	return nil
}

// sliceSize returns the size rank r backs in the DRAM (host) or HBM space, if known.
func (b *BigMemory) sliceSize(r int, host bool) (uint64, bool) {
	if r == b.rank {
		if host {
			return b.opts.LocalDRAM, true
		}
		return b.opts.LocalHBM, true
	}
	b.mu.RLock()
	m, ok := b.members[r]
	b.mu.RUnlock()
	if !ok {
		return 0, false
	}
	if host {
		return m.d.DRAM, true
	}
	return m.d.HBM, true
}

// local resolves a local address; one inside a global space is global whatever the type says
// (treating it as plain memory would touch unmapped reservations).
func (b *BigMemory) localEnd(addr, n uint64, w where) (end, error) {
	if addr == 0 {
		return end{}, fmt.Errorf("bm: null address: %w", status.ErrInvalidConfig)
	}
	if addr+n < addr {
		return end{}, fmt.Errorf("bm: %d bytes at %#x wrap around: %w", n, addr, status.ErrOutOfRange)
	}
	if (b.dram != nil && overlaps(b.dram.Base, b.dram.Size(), addr, n)) || (b.hbm != nil && overlaps(b.hbm.Base, b.hbm.Size(), addr, n)) {
		return b.global(addr, n, false)
	}
	return end{w: w, addr: addr, rank: b.rank}, nil
}

func overlaps(base, size, addr, n uint64) bool { return addr < base+size && base < addr+n }

// resolve turns a copy's addresses and type into its two ends (upstream's direction rules,
// with L2GH and GH2L handled).
func (b *BigMemory) resolve(src, dst, n uint64, t CopyType) (s, d end, err error) {
	if n == 0 {
		return s, d, fmt.Errorf("bm: copy of 0 bytes: %w", status.ErrInvalidConfig)
	}
	if src == 0 || dst == 0 {
		return s, d, fmt.Errorf("bm: copy with a null address: %w", status.ErrInvalidConfig)
	}
	type rule struct {
		s, d     where
		sg, dg   bool // global side
		hostOnly bool // the global side must be DRAM
	}
	var r rule
	switch t {
	case L2G:
		r = rule{s: localDevice, dg: true}
	case G2L:
		r = rule{sg: true, d: localDevice}
	case G2H:
		r = rule{sg: true, d: localHost}
	case H2G:
		r = rule{s: localHost, dg: true}
	case L2GH:
		r = rule{s: localDevice, dg: true, hostOnly: true}
	case GH2L:
		r = rule{sg: true, d: localDevice, hostOnly: true}
	case GH2H:
		r = rule{sg: true, d: localHost, hostOnly: true}
	case H2GH:
		r = rule{s: localHost, dg: true, hostOnly: true}
	case G2G:
		r = rule{sg: true, dg: true}
	case Auto:
		if s, err = b.auto(src, n); err == nil {
			d, err = b.auto(dst, n)
		}
		if err == nil && !s.global() && !d.global() {
			err = fmt.Errorf("bm: AUTO copy between two local addresses (%#x -> %#x): %w", src, dst, status.ErrInvalidConfig)
		}
		return s, d, err
	default:
		return s, d, fmt.Errorf("bm: copy type %d: %w", int(t), status.ErrInvalidConfig)
	}
	if r.sg {
		s, err = b.global(src, n, r.hostOnly)
	} else {
		s, err = b.localEnd(src, n, r.s)
	}
	if err != nil {
		return s, d, fmt.Errorf("%v source: %w", t, err)
	}
	if r.dg {
		d, err = b.global(dst, n, r.hostOnly)
	} else {
		d, err = b.localEnd(dst, n, r.d)
	}
	if err != nil {
		return s, d, fmt.Errorf("%v destination: %w", t, err)
	}
	return s, d, nil
}

// auto classifies an address for SMEMB_COPY_AUTO: a GVA, else local host memory.
func (b *BigMemory) auto(addr, n uint64) (end, error) {
	if (b.dram != nil && b.dram.Contains(addr, 1)) || (b.hbm != nil && b.hbm.Contains(addr, 1)) {
		return b.global(addr, n, false)
	}
	return b.localEnd(addr, n, localHost)
}

// Copy copies size bytes from src to dst in the direction t (AUTO infers it from the
// addresses). The global side(s) must lie in one rank's slice. flags: FlagAsync (Wait
// completes it).
func (b *BigMemory) Copy(ctx context.Context, src, dst, size uint64, t CopyType, flags uint32) error {
	return b.CopyBatch(ctx, []CopyParams{{Src: src, Dst: dst, Size: size}}, t, flags)
}

// Write copies p to the global address dst (H2G).
func (b *BigMemory) Write(ctx context.Context, dst uint64, p []byte) error {
	if len(p) == 0 {
		return nil
	}
	return b.Copy(ctx, memory.AddrOf(p), dst, uint64(len(p)), H2G, 0)
}

// Read copies len(p) bytes at the global address src into p (G2H).
func (b *BigMemory) Read(ctx context.Context, p []byte, src uint64) error {
	if len(p) == 0 {
		return nil
	}
	return b.Copy(ctx, src, memory.AddrOf(p), uint64(len(p)), G2H, 0)
}

// hostView returns e's bytes when this process can address them directly (local host memory,
// this rank's DRAM slice, a co-located member's mapped slice), with the function that ends the
// use; ok is false otherwise.
func (b *BigMemory) hostView(e end, n uint64) (p []byte, done func(), ok bool, err error) {
	var h held
	p, ok, err = b.view(e, n, &h)
	return p, h.release, ok, err
}

// held is the members whose mappings a copy uses: each read-locked once, however many of the
// copy's views are in it. A second RLock of a member while an unmapping waits for its Lock
// would never return (sync.RWMutex), so a batch whose pieces reach one member many times,
// or a copy between two places of one member, locks it once.
type held []*member

// release ends the use of every member held.
func (h *held) release() {
	for _, m := range *h {
		m.mu.RUnlock()
	}
	*h = (*h)[:0]
}

// view is hostView with the members' locks recorded in h (released by the caller, once).
func (b *BigMemory) view(e end, n uint64, h *held) (p []byte, ok bool, err error) {
	switch {
	case e.w == localHost:
		return memory.HostSlice(memory.Ptr(e.addr), n), true, nil
	case e.w == globalHost && e.rank == b.rank:
		return b.local[e.off : e.off+n], true, nil
	case e.w == globalHost:
		m, err := b.member(e.rank)
		if err != nil {
			return nil, false, err
		}
		if !slices.Contains(*h, m) {
			m.mu.RLock()
			if m.gone || m.mapd == nil {
				gone := m.gone
				m.mu.RUnlock()
				if gone {
					return nil, false, fmt.Errorf("rank %d: %w", e.rank, ErrRankDown)
				}
				return nil, false, nil
			}
			*h = append(*h, m)
		}
		return m.mapd[e.off : e.off+n], true, nil
	}
	return nil, false, nil
}

// devicePtr returns e's device address when it is this process's GPU memory.
func (b *BigMemory) devicePtr(e end) (memory.Ptr, bool) {
	switch {
	case e.w == localDevice:
		return memory.Ptr(e.addr), true
	case e.w == globalDevice && e.rank == b.rank && b.hbmBuf != nil:
		return b.hbmBuf.Ptr() + memory.Ptr(e.off), true
	}
	return 0, false
}

// copyOne runs one resolved copy, choosing the path: plain copy, device copy, one-sided RMA
// (with a host bounce for device memory), or the owner's agent.
func (b *BigMemory) copyOne(ctx context.Context, s, d end, n uint64) error {
	var h held // s and d may be places of one member: locked once
	defer h.release()
	sv, sok, err := b.view(s, n, &h)
	if err != nil {
		return err
	}
	dv, dok, err := b.view(d, n, &h)
	if err != nil {
		return err
	}
	sp, sdev := b.devicePtr(s)
	dp, ddev := b.devicePtr(d)
	switch {
	case sok && dok:
		if overlaps(memory.AddrOf(sv), n, memory.AddrOf(dv), n) {
			copy(dv, sv) // memmove: the copier's pieces and glibc's memcpy assume disjoint ranges
			return nil
		}
		b.copier.Copy(dv, sv)
		return nil
	case sdev || ddev:
		dev, err := b.f.device()
		if err != nil {
			return err
		}
		switch {
		case sdev && ddev:
			return dev.CopyDeviceToDevice(dp, sp, n)
		case sdev && dok:
			return dev.CopyDeviceToHost(dv, sp)
		case sok && ddev:
			return dev.CopyHostToDevice(dp, sv)
		case sdev && d.oneSided():
			return b.bounce(ctx, n, func(tmp []byte, off uint64) error {
				if err := dev.CopyDeviceToHost(tmp, sp+memory.Ptr(off)); err != nil {
					return err
				}
				return b.rma(ctx, d.rank, true, tmp, d.addr+off)
			})
		case ddev && s.oneSided():
			return b.bounce(ctx, n, func(tmp []byte, off uint64) error {
				if err := b.rma(ctx, s.rank, false, tmp, s.addr+off); err != nil {
					return err
				}
				return dev.CopyHostToDevice(dp+memory.Ptr(off), tmp)
			})
		}
	case sok && d.oneSided():
		return b.rma(ctx, d.rank, true, sv, d.addr)
	case dok && s.oneSided():
		return b.rma(ctx, s.rank, false, dv, s.addr)
	case d.w == globalDevice && d.rank != b.rank && !s.global():
		// Into another rank's HBM from memory only this process reaches: staged here, pulled
		// by the owner.
		return b.staged(ctx, n, func(stage []byte, off uint64) error {
			if err := b.toHost(ctx, stage, s, off); err != nil {
				return err
			}
			return b.forward(ctx, d.rank, []fwdItem{{Src: memory.AddrOf(stage), SrcRank: b.rank, Dst: d.addr + off, DstRank: -1, Size: uint64(len(stage))}})
		})
	case s.w == globalDevice && s.rank != b.rank && !d.global():
		// Out of another rank's HBM: the owner writes into this process's staging buffer.
		return b.staged(ctx, n, func(stage []byte, off uint64) error {
			if err := b.forward(ctx, s.rank, []fwdItem{{Src: s.addr + off, SrcRank: -1, Dst: memory.AddrOf(stage), DstRank: b.rank, Size: uint64(len(stage))}}); err != nil {
				return err
			}
			return b.fromHost(ctx, d, off, stage)
		})
	case s.global() && d.global() && !(s.w == globalDevice && d.w == globalDevice):
		// This process reaches neither end directly: the owner of the device end, else the
		// source's owner, copies (the bytes cross the network once).
		owner := s.rank
		if d.w == globalDevice {
			owner = d.rank
		}
		if owner == b.rank {
			break // forwarding to ourselves would come back here
		}
		return b.forward(ctx, owner, []fwdItem{fwd(s.addr, d.addr, n)})
	}
	return fmt.Errorf("bm: copy from %v of rank %d to %v of rank %d: another rank's HBM is reachable only through its owner's GPU, which host transports cannot address yet: %w",
		s.w, s.rank, d.w, d.rank, status.ErrUnsupported)
}

// toHost copies len(p) bytes of local end e from offset off into host memory p.
func (b *BigMemory) toHost(ctx context.Context, p []byte, e end, off uint64) error {
	if v, done, ok, err := b.hostView(e, off+uint64(len(p))); err != nil {
		return err
	} else if ok {
		copy(p, v[off:])
		done()
		return nil
	}
	if ptr, ok := b.devicePtr(e); ok {
		dev, err := b.f.device()
		if err != nil {
			return err
		}
		return dev.CopyDeviceToHost(p, ptr+memory.Ptr(off))
	}
	return fmt.Errorf("bm: %v is not local: %w", e.w, status.ErrInvalidConfig)
}

// fromHost copies host memory p into local end e at offset off.
func (b *BigMemory) fromHost(ctx context.Context, e end, off uint64, p []byte) error {
	if v, done, ok, err := b.hostView(e, off+uint64(len(p))); err != nil {
		return err
	} else if ok {
		copy(v[off:], p)
		done()
		return nil
	}
	if ptr, ok := b.devicePtr(e); ok {
		dev, err := b.f.device()
		if err != nil {
			return err
		}
		return dev.CopyHostToDevice(ptr+memory.Ptr(off), p)
	}
	return fmt.Errorf("bm: %v is not local: %w", e.w, status.ErrInvalidConfig)
}

// staged runs fn over n bytes in chunks of one of the object's staging buffers (registered
// in its table, so a peer's agent reaches them one-sidedly).
func (b *BigMemory) staged(ctx context.Context, n uint64, fn func(stage []byte, off uint64) error) error {
	var st []byte
	select {
	case st = <-b.stages:
	case <-ctx.Done():
		return status.FromContext(ctx)
	}
	defer func() { b.stages <- st }()
	for off := uint64(0); off < n; off += uint64(len(st)) {
		if err := fn(st[:min(uint64(len(st)), n-off)], off); err != nil {
			return err
		}
	}
	return nil
}

// bounceChunk is the host staging unit of device copies to and from remote ranks.
const bounceChunk = 4 << 20

// bounce runs fn over n bytes in chunks of a host staging buffer.
func (b *BigMemory) bounce(ctx context.Context, n uint64, fn func(tmp []byte, off uint64) error) error {
	buf := make([]byte, min(n, bounceChunk))
	for off := uint64(0); off < n; off += uint64(len(buf)) {
		if err := status.FromContext(ctx); err != nil {
			return err
		}
		tmp := buf[:min(uint64(len(buf)), n-off)]
		if err := fn(tmp, off); err != nil {
			return err
		}
	}
	return nil
}

// kindsFor returns the transports to a member with descriptor d in priority order, as the data
// ops allowed between the two ranks (ops) and their placement permit. Computed once, when the
// member is admitted (parsing its tag table on every copy cost the hot path).
func (b *BigMemory) kindsFor(ops DataOp, d desc) []transport.ConnType {
	var ks []transport.ConnType
	for _, op := range priority {
		if ops&op == 0 || (op == OpHostSHM && !b.mesh.SameHost(d.Card)) {
			continue
		}
		ks = append(ks, op.kind())
	}
	return ks
}

// rma moves buf to (write) or from rank's memory at addr one-sidedly, trying the allowed
// transports in priority order and falling back on a transport error.
func (b *BigMemory) rma(ctx context.Context, rank int, write bool, buf []byte, addr uint64) error {
	m, err := b.member(rank)
	if err != nil {
		return err
	}
	ks := m.kinds
	if len(ks) == 0 {
		return fmt.Errorf("bm: no data op allowed between rank %d (tag %s, %v) and rank %d (tag %s, %v): %w",
			b.rank, b.opts.Tag, b.opts.DataOps, rank, m.d.Tag, m.d.Ops, status.ErrUnsupported)
	}
	var errs []error
	for _, k := range ks {
		ep, err := b.mesh.Endpoint(ctx, rank, k)
		if err == nil {
			err = post(ctx, ep.(transport.RMA), write, buf, addr)
			if err == nil {
				return nil
			}
			if final(ctx, err) {
				return b.rankErr(rank, err)
			}
			b.mesh.Drop(rank, k, ep)
		}
		errs = append(errs, err)
		if status.FromContext(ctx) != nil {
			break
		}
	}
	err = errors.Join(errs...)
	if errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, status.ErrPeerClosed) {
		// The member's own address refuses connections: it has left or died, and this rank
		// has not seen the view that says so yet.
		return b.rankErr(rank, fmt.Errorf("bm: rank %d: every transport failed, its address refusing connections (it left or died): %w: %w", rank, status.ErrPeerClosed, err))
	}
	return b.rankErr(rank, fmt.Errorf("bm: rank %d: every transport failed: %w", rank, err))
}

func post(ctx context.Context, ep transport.RMA, write bool, buf []byte, addr uint64) error {
	var op *transport.Op
	var err error
	if write {
		op, err = ep.WriteAsync(ctx, buf, transport.Remote{Addr: addr})
	} else {
		op, err = ep.ReadAsync(ctx, buf, transport.Remote{Addr: addr})
	}
	if err != nil {
		return err
	}
	return op.Wait(ctx)
}

// final says whether err is the answer rather than a transport's failure: another transport
// would meet the same refusal, or the caller gave up.
func final(ctx context.Context, err error) bool {
	return status.FromContext(ctx) != nil || errors.Is(err, status.ErrOutOfRange) || errors.Is(err, status.ErrInvalidConfig) ||
		errors.Is(err, status.ErrPermission)
}

// rankErr makes a failure against a rank that has meanwhile stopped being a member read as
// ErrRankDown.
func (b *BigMemory) rankErr(rank int, err error) error {
	if _, merr := b.member(rank); merr != nil && !errors.Is(err, ErrRankDown) {
		return fmt.Errorf("%w (%w)", merr, err)
	}
	return err
}
