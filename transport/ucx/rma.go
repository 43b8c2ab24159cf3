//go:build ucx && cgo

package ucx

/*
#include "hmc_ucx.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// peerRegion is a region of the target that this endpoint resolved: its range and unpacked
// rkey. inflight and dead are guarded by the worker's pmu.
type peerRegion struct {
	key        buffer.Key
	addr, size uint64
	rkey       C.ucp_rkey_h
	inflight   int  // requests posted on it and not yet complete
	dead       bool // revoked by the target: new operations fail
}

// peerRegions is an endpoint's cache of resolved regions and its requests on the link.
type peerRegions struct {
	mu    sync.Mutex
	index transport.RegionIndex[*peerRegion] // guarded by mu

	reqMu   sync.Mutex // one RESOLVE on the link at a time
	wmu     sync.Mutex // one message written at a time (RESOLVE, REVOKED)
	ids     uint64     // guarded by reqMu
	replies chan resolved
}

// resolved is the link reader's answer to a RESOLVE.
type resolved struct {
	id  uint64
	reg *peerRegion
	err error
}

func errRevoked(k buffer.Key) error {
	return fmt.Errorf("ucx: region %d: deregistered by the target: %w", k, status.ErrNotFound)
}

// readLink reads the target's region messages until the link ends: a RESOLVED is unpacked and
// cached before it is handed to the requester, a REVOKE handled in order (so it always finds
// the region its RESOLVED cached).
func (e *endpoint) readLink() error {
	p := &e.peer
	for {
		m, err := readLinkMsg(e.link, lmResolved, lmRevoke)
		if err != nil {
			return err
		}
		if m.typ == lmRevoke {
			if err := e.revoked(buffer.Key(m.key)); err != nil {
				return err
			}
			continue
		}
		r := resolved{id: m.id}
		switch m.status {
		case lsOK:
			rkey, err := readBlob(e.link, "rkey")
			if err != nil {
				return err
			}
			r.reg, r.err = e.cache(m, rkey)
		case lsOutOfRange:
			r.err = fmt.Errorf("ucx: target refused the range: %w", status.ErrOutOfRange)
		case lsFailed:
			r.err = fmt.Errorf("ucx: target could not register the region with UCX (device memory needs a UCX with a CUDA or ROCm "+
				"memory domain; reach it over tcp or shm): %w", status.ErrFailed)
		default:
			r.err = fmt.Errorf("ucx: target has no such region (unknown, stale or deregistered): %w", status.ErrNotFound)
		}
		select { // a requester that gave up leaves its answer here; the next one discards it by id
		case p.replies <- r:
		case <-e.quit:
			return nil
		}
	}
}

// cache unpacks a resolved region's rkey and caches the region (or returns the one cached).
func (e *endpoint) cache(m linkMsg, packed []byte) (*peerRegion, error) {
	p := &e.peer
	p.mu.Lock()
	defer p.mu.Unlock()
	if r, ok := p.index.Get(buffer.Key(m.key)); ok {
		return r, nil
	}
	r := &peerRegion{key: buffer.Key(m.key), addr: m.a, size: m.b}
	var st C.ucs_status_t
	e.w.call(func() {
		rk := C.CBytes(packed)
		defer C.free(rk)
		st = C.ucp_ep_rkey_unpack(e.ep, rk, &r.rkey)
	})
	if st != C.UCS_OK {
		return nil, ucsErr("rkey unpack", st)
	}
	if err := p.index.Add(r.key, r.addr, r.size, r); err != nil {
		e.w.call(func() { C.ucp_rkey_destroy(r.rkey) })
		return nil, fmt.Errorf("ucx: %w", err)
	}
	return r, nil
}

// revoked handles the target's REVOKE of region k: new operations on it fail at once, those in
// flight complete (a flush makes the puts among them complete at the target too), the rkey is
// destroyed, and the target is told.
func (e *endpoint) revoked(k buffer.Key) error {
	p := &e.peer
	p.mu.Lock()
	r, ok := p.index.Remove(k)
	p.mu.Unlock()
	if ok {
		w := e.w
		flushed := false
		for deadline := time.Now().Add(e.t.closeTimeout()); ; {
			var done bool
			w.call(func() {
				r.dead = true
				if !flushed && r.inflight == 0 {
					flushed = true
					// Everything posted before is visible at the target once this flush
					// completes; a closing endpoint's own drain flushes instead.
					if !e.closed.Load() {
						var st C.ucs_status_t
						if req := C.hmc_flush(e.ep, &st); st == C.UCS_OK && req != nil {
							w.add(&pend{req: req, reg: r, what: "revoke flush"})
						}
					}
				}
				w.progress()
				done = flushed && r.inflight == 0
			})
			if done || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Microsecond)
		}
		w.call(func() { C.ucp_rkey_destroy(r.rkey) })
	}
	p.wmu.Lock()
	defer p.wmu.Unlock()
	_, err := e.link.Write(linkMsg{typ: lmRevoked, key: uint32(k)}.encode())
	return err
}

// resolve finds the target's region for n bytes at dst, asking the target on a cache miss.
func (e *endpoint) resolve(ctx context.Context, dst transport.Remote, n uint64) (*peerRegion, uint64, error) {
	p := &e.peer
	if r, off, ok := p.lookup(dst, n); ok {
		return r, off, nil
	}
	if e.version < 2 {
		return nil, 0, fmt.Errorf("ucx: the target speaks bootstrap version %d, which has no registered regions: %w", e.version, status.ErrUnsupported)
	}
	p.reqMu.Lock()
	defer p.reqMu.Unlock()
	p.ids++
	q := linkMsg{typ: lmResolve, key: uint32(dst.Key), id: p.ids, a: dst.Addr, b: n}
	for drained := false; !drained; { // answers to requesters that gave up
		select {
		case <-p.replies:
		default:
			drained = true
		}
	}
	p.wmu.Lock()
	_, err := e.link.Write(q.encode())
	p.wmu.Unlock()
	if err != nil {
		return nil, 0, fmt.Errorf("ucx: region request: %w: %w", status.ErrPeerClosed, err)
	}
	for {
		select {
		case r := <-p.replies:
			if r.id != q.id {
				continue
			}
			if r.err != nil {
				return nil, 0, r.err
			}
			off := dst.Addr
			if dst.Key == 0 {
				off = dst.Addr - r.reg.addr
			}
			if err := buffer.CheckRange(r.reg.size, off, n); err != nil {
				return nil, 0, fmt.Errorf("ucx: region %d: %w", r.reg.key, err)
			}
			return r.reg, off, nil
		case <-e.linkDone:
			return nil, 0, fmt.Errorf("ucx: region request: target gone: %w", status.ErrPeerClosed)
		case <-ctx.Done():
			return nil, 0, fmt.Errorf("ucx: region request: %w", status.FromContext(ctx))
		}
	}
}

// lookup returns the cached region holding n bytes at dst, and the offset there.
func (p *peerRegions) lookup(dst transport.Remote, n uint64) (*peerRegion, uint64, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.index.Lookup(dst, n)
}

// destroyAll destroys the cached regions' rkeys (Close, after the endpoint drained). Caller
// holds pmu.
func (p *peerRegions) destroyAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range p.index.Reset() {
		C.ucp_rkey_destroy(r.rkey)
	}
}

// targetOf returns where n bytes at remote are: the default region or a resolved one.
func (e *endpoint) targetOf(ctx context.Context, remote transport.Remote, n uint64) (target, error) {
	if err := e.usable(); err != nil {
		return target{}, err
	}
	if err := status.FromContext(ctx); err != nil {
		return target{}, err
	}
	if remote.Key == transport.DefaultRegion {
		if err := buffer.CheckRange(e.remoteSize, remote.Addr, n); err != nil {
			return target{}, fmt.Errorf("ucx: %w", err)
		}
		return e.at(remote.Addr), nil
	}
	r, off, err := e.resolve(ctx, remote, n)
	if err != nil {
		return target{}, err
	}
	return target{rkey: r.rkey, addr: r.addr + off, reg: r}, nil
}

// WriteAsync implements transport.RMA: a put and its flush; the Op completes when the bytes are
// visible at the target. src need not be registered (UCX registers or copies it itself).
func (e *endpoint) WriteAsync(ctx context.Context, src []byte, dst transport.Remote) (*transport.Op, error) {
	return e.rma(ctx, true, src, dst)
}

// ReadAsync implements transport.RMA.
func (e *endpoint) ReadAsync(ctx context.Context, dst []byte, src transport.Remote) (*transport.Op, error) {
	return e.rma(ctx, false, dst, src)
}

func (e *endpoint) rma(ctx context.Context, put bool, b []byte, remote transport.Remote) (*transport.Op, error) {
	rt, err := e.targetOf(ctx, remote, uint64(len(b)))
	if err != nil {
		return nil, err
	}
	if len(b) == 0 {
		return transport.Succeeded(), nil
	}
	return e.postRaw(put, unsafe.Pointer(unsafe.SliceData(b)), nil, rt, uint64(len(b))), nil
}

// usable checks that the endpoint may post.
func (e *endpoint) usable() error {
	if e.closed.Load() {
		return fmt.Errorf("ucx: endpoint: %w", status.ErrClosed)
	}
	return e.broken()
}

// broken says why the endpoint can no longer move bytes (its target's link ended, or UCX
// failed the endpoint), or nil.
func (e *endpoint) broken() error {
	if p := e.dead.Load(); p != nil {
		return *p
	}
	if *(*int32)(unsafe.Pointer(e.errflag)) != 0 {
		return ucsErr("endpoint", C.ucs_status_t(*e.errflag))
	}
	return nil
}

// ucpAtomic is the UCX operation and the io words (operand or compare, then swap value) of op.
func ucpAtomic(op buffer.AtomicOp, operand, compare uint64) (C.int, [2]uint64) {
	switch op {
	case buffer.AtomicLoad:
		return C.UCP_ATOMIC_OP_ADD, [2]uint64{0, 0}
	case buffer.AtomicStore, buffer.AtomicSwap:
		return C.UCP_ATOMIC_OP_SWAP, [2]uint64{operand, 0}
	case buffer.AtomicFetchAdd:
		return C.UCP_ATOMIC_OP_ADD, [2]uint64{operand, 0}
	default: // AtomicCAS; the bitwise operations are compare-swap loops (see Atomic)
		return C.UCP_ATOMIC_OP_CSWAP, [2]uint64{compare, operand}
	}
}

// Atomic implements transport.RMA with ucp_atomic_op_nbx (a fetching 64-bit atomic): atomic
// with respect to every other UCX atomic on the word, and to the owner's sync/atomic where UCX
// runs it on the target's CPU or a shared mapping.
//
// Fetch-and, fetch-or and fetch-xor are compare-swap loops: UCX 1.13 over its shared-memory
// transports (posix, cma) leaves the word unchanged for a fetching OR and ANDs for an XOR
// (seen with TestRMA/posix,cma,self), while fetch-add, swap and compare-swap are right on every
// transport; a loop of those is as atomic.
func (e *endpoint) Atomic(ctx context.Context, op buffer.AtomicOp, dst transport.Remote, operand, compare uint64) (uint64, error) {
	if !op.Valid() {
		return 0, fmt.Errorf("ucx: %v: %w", op, status.ErrInvalidConfig)
	}
	var f func(uint64) uint64
	switch op {
	case buffer.AtomicFetchAnd:
		f = func(v uint64) uint64 { return v & operand }
	case buffer.AtomicFetchOr:
		f = func(v uint64) uint64 { return v | operand }
	case buffer.AtomicFetchXor:
		f = func(v uint64) uint64 { return v ^ operand }
	default:
		return e.atomic(ctx, op, dst, operand, compare)
	}
	old, err := e.atomic(ctx, buffer.AtomicLoad, dst, 0, 0)
	for err == nil {
		var prev uint64
		if prev, err = e.atomic(ctx, buffer.AtomicCAS, dst, f(old), old); err == nil && prev == old {
			return old, nil
		}
		old = prev
	}
	return 0, err
}

// atomic runs one UCX atomic (load, store, swap, fetch-add or compare-swap).
func (e *endpoint) atomic(ctx context.Context, op buffer.AtomicOp, dst transport.Remote, operand, compare uint64) (uint64, error) {
	rt, err := e.targetOf(ctx, dst, 8)
	if err != nil {
		return 0, err
	}
	if rt.addr%8 != 0 {
		return 0, fmt.Errorf("ucx: atomic word at %#x: not 8-byte aligned: %w", rt.addr, status.ErrInvalidConfig)
	}
	code, vals := ucpAtomic(op, operand, compare)
	var old uint64
	var opErr error
	w := e.w
	var o *transport.Op
	w.users.Add(1)
	w.pmu.Lock()
	if refused := e.refusedLocked(rt); refused != nil {
		o = transport.Failed(refused)
	} else {
		io := (*[2]C.uint64_t)(C.calloc(2, 8)) // C memory: UCX writes the reply after this call returns
		io[0], io[1] = C.uint64_t(vals[0]), C.uint64_t(vals[1])
		var st C.ucs_status_t
		req := C.hmc_atomic(e.ep, code, &io[0], C.uint64_t(rt.addr), rt.rkey, &st)
		switch {
		case st != C.UCS_OK:
			o = transport.Failed(ucsErr("atomic", st))
			C.free(unsafe.Pointer(io))
		case req == nil:
			old = uint64(io[1])
			o = transport.Succeeded()
			C.free(unsafe.Pointer(io))
		default:
			o = e.newOp(1)
			w.add(&pend{req: req, ep: e, reg: rt.reg, op: o, what: "atomic", after: func(st C.ucs_status_t) {
				if st == C.UCS_OK {
					old = uint64(io[1]) // read before o finishes: the waiter sees it after Wait
				} else {
					opErr = ucsErr("atomic", st)
				}
				C.free(unsafe.Pointer(io))
			}})
			w.signalLocked()
		}
	}
	w.pmu.Unlock()
	if err := o.Wait(ctx); err != nil {
		return 0, err
	}
	if opErr != nil {
		return 0, opErr
	}
	return old, nil
}

var _ transport.RMA = (*endpoint)(nil)

// linkReader is watchLink's body on a version-2 link.
func (e *endpoint) linkReader() error {
	if e.version >= 2 {
		return e.readLink()
	}
	_, err := io.Copy(io.Discard, e.link)
	return err
}

// WriteVAsync implements transport.VectorRMA: every piece is checked and resolved first, then
// posted in one call into UCX with one flush after them; the Op completes with the flush (every
// piece visible at the target), or fails with the first piece UCX refused.
func (e *endpoint) WriteVAsync(ctx context.Context, srcs [][]byte, dsts []transport.Remote) (*transport.Op, error) {
	return e.vec(ctx, true, srcs, dsts)
}

// ReadVAsync implements transport.VectorRMA: the gets, then one flush (which completes them).
func (e *endpoint) ReadVAsync(ctx context.Context, dsts [][]byte, srcs []transport.Remote) (*transport.Op, error) {
	return e.vec(ctx, false, dsts, srcs)
}

func (e *endpoint) vec(ctx context.Context, put bool, bufs [][]byte, rem []transport.Remote) (*transport.Op, error) {
	if len(bufs) != len(rem) {
		return nil, fmt.Errorf("ucx: a vector of %d buffers and %d remote ranges: %w", len(bufs), len(rem), status.ErrInvalidConfig)
	}
	addrs := make([]C.uintptr_t, 0, len(bufs))
	lens := make([]C.size_t, 0, len(bufs))
	raddrs := make([]C.uint64_t, 0, len(bufs))
	rkeys := make([]C.uintptr_t, 0, len(bufs))
	var regs []*peerRegion // the distinct peer regions the pieces reach
	locals := make([][]byte, 0, len(bufs))
	for i, b := range bufs {
		rt, err := e.targetOf(ctx, rem[i], uint64(len(b)))
		if err != nil {
			return nil, err
		}
		if len(b) == 0 {
			continue
		}
		locals = append(locals, b)
		addrs = append(addrs, handle(unsafe.Pointer(unsafe.SliceData(b))))
		lens = append(lens, C.size_t(len(b)))
		raddrs = append(raddrs, C.uint64_t(rt.addr))
		rkeys = append(rkeys, handle(unsafe.Pointer(rt.rkey)))
		if rt.reg != nil && (len(regs) == 0 || regs[len(regs)-1] != rt.reg) && !slices.Contains(regs, rt.reg) {
			regs = append(regs, rt.reg)
		}
	}
	if len(addrs) == 0 {
		return transport.Succeeded(), nil
	}
	w := e.w
	w.users.Add(1)
	w.pmu.Lock()
	defer w.pmu.Unlock()
	for _, r := range regs {
		if err := e.refusedLocked(target{reg: r}); err != nil {
			return transport.Failed(err), nil
		}
	}
	if err := e.refusedLocked(target{}); err != nil {
		return transport.Failed(err), nil
	}
	if e.amVec && len(addrs) > 1 {
		return e.vecAM(put, locals, addrs, lens, raddrs, rkeys, regs), nil
	}
	op := e.newOp(1)
	e.postVecLocked(put, addrs, lens, raddrs, rkeys, regs, op)
	return op, nil
}

// postVecLocked posts the pieces as puts (put) or gets and one flush after them, which finishes
// a part of op when every piece is complete (or the first failure). Caller holds pmu.
func (e *endpoint) postVecLocked(put bool, addrs []C.uintptr_t, lens []C.size_t, raddrs []C.uint64_t, rkeys []C.uintptr_t, regs []*peerRegion, op *transport.Op) {
	w := e.w
	res := w.posted
	C.hmc_post_vec(handle(unsafe.Pointer(w.w)), handle(unsafe.Pointer(e.ep)), cbool(put), C.int(len(addrs)),
		&addrs[0], &lens[0], &raddrs[0], &rkeys[0], handle(unsafe.Pointer(res)))
	var perr error
	if res.pst != C.UCS_OK {
		what := "get"
		if put {
			what = "put"
		}
		perr = ucsErr(what, res.pst)
	}
	freq, fst := res.freq, res.fst
	ops := e.batch // the flush covers the puts batched before it too
	e.batch = nil
	switch {
	case fst != C.UCS_OK:
		err := ucsErr("flush", fst)
		finishAll(ops, err)
		op.Finish(errors.Join(perr, err))
	case freq == nil: // complete at once (shared memory)
		finishAll(ops, nil)
		op.Finish(perr)
	default:
		for _, r := range regs {
			r.inflight++ // the flush holds the regions' rkeys until every piece is complete
		}
		e.flushing++
		w.add(&pend{req: freq, ep: e, what: "flush", flush: e, ops: ops, after: func(st C.ucs_status_t) {
			for _, r := range regs {
				r.inflight--
			}
			var ferr error
			if st != C.UCS_OK {
				ferr = ucsErr("flush", st)
			}
			op.Finish(errors.Join(perr, ferr))
		}})
		w.signalLocked()
	}
}

var _ transport.VectorRMA = (*endpoint)(nil)
