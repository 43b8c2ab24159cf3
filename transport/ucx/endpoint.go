//go:build ucx && cgo

package ucx

/*
#include "hmc_ucx.h"
*/
import "C"

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/hmc-go/hmc/auth"
	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// endpoint is an initiator's connection to one target.
type endpoint struct {
	t               *Transport
	w               *worker
	ep              C.ucp_ep_h
	rkey            C.ucp_rkey_h
	errflag         *C.int             // set by UCX's error callback (C memory)
	region          *buffer.ConnBuffer // the local region
	local           []byte             // its bytes (nil for a device region, staged through ring)
	localMemh       C.ucp_mem_h
	unregisterLocal func()   // undoes the registration of local
	ring            [][]byte // registered host chunks for a device region
	ringMemh        []C.ucp_mem_h
	ringFree        []func() error
	stageMu         sync.Mutex // one staged transfer at a time
	remoteAddr      uint64
	remoteSize      uint64
	link            net.Conn
	dead            atomic.Pointer[error]
	closed          atomic.Bool
	closeOnce       sync.Once
	linkDone        chan struct{}

	// Flush coalescing (guarded by the worker's pmu): at most maxFlushes in flight per
	// endpoint; puts posted meanwhile wait in batch for the next one, which a completing flush
	// issues. A flush completes every operation posted before it, so each put is still visible
	// at the target when its Op completes, and a stream of puts pays one flush per batch.
	flushing int // flushes in flight (at most maxFlushes)
	batch    []*transport.Op
	inflight int // this endpoint's requests in w.pending; guarded by pmu

	stagingMu sync.Mutex     // orders staging.Add after closed is set against Close's Wait
	staging   sync.WaitGroup // staged transfers' goroutines (staged); Close waits for them

	version  uint16        // the bootstrap link's: 2 serves registered regions, 3 takes PUTVs and GETVs
	token    uint64        // the link's token (version 3), which PUTVs and GETVs carry
	amVec    bool          // vectors go as active messages: version 3, RMA emulated over tcp (am.go)
	rndvPutv bool          // a vector's lone PUTV goes as a rendezvous: version 4 (am.go)
	peer     peerRegions   // the target's regions resolved so far
	quit     chan struct{} // closed by Close: the link reader stops handing out answers
}

// finishAll finishes every op with err.
func finishAll(ops []*transport.Op, err error) {
	for _, op := range ops {
		op.Finish(err)
	}
}

// maxFlushes bounds the flushes in flight per endpoint: one would serialise the flushes' round
// trips (over TCP each waits for the target), many would flush every put on its own.
const maxFlushes = 4

// flushBatch issues one flush for the batched puts, unless maxFlushes are in flight. Caller
// holds pmu.
func (e *endpoint) flushBatch() {
	if e.flushing >= maxFlushes || len(e.batch) == 0 {
		return
	}
	ops := e.batch
	e.batch = nil
	var st C.ucs_status_t
	req := C.hmc_flush(e.ep, &st)
	e.flushed(req, st, nil, ops)
}

// flushed takes a flush just issued (its request and status, as hmc_flush returns them) for
// op (nil: none) and the batched ops: they fail with its error, finish now if it completed at
// once (shared memory UCX allocated), else finish when it does. Caller holds pmu.
func (e *endpoint) flushed(req unsafe.Pointer, st C.ucs_status_t, op *transport.Op, ops []*transport.Op) {
	var err error
	switch {
	case st != C.UCS_OK:
		err = ucsErr("flush", st)
	case req != nil:
		e.flushing++
		e.w.add(&pend{req: req, ep: e, what: "flush", flush: e, op: op, ops: ops})
		return
	}
	if op != nil {
		op.Finish(err)
	}
	finishAll(ops, err)
}

// Dial connects to the target's bootstrap socket, then creates the UCX endpoint.
func (t *Transport) Dial(ctx context.Context, cfg transport.DialConfig) (transport.Endpoint, error) {
	if cfg.Local == nil {
		return nil, fmt.Errorf("ucx: dial without a local region: %w", status.ErrInvalidConfig)
	}
	local := cfg.Local.Bytes()
	if local == nil && hasCUDA() {
		local = memory.HostSlice(cfg.Local.Ptr(), cfg.Local.Size()) // a device range, only ever handed to UCX
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", cfg.Addr)
	if err != nil {
		if cerr := status.FromContext(ctx); cerr != nil {
			return nil, fmt.Errorf("ucx: dial %s: %w", cfg.Addr, cerr)
		}
		return nil, fmt.Errorf("ucx: dial %s: %w: %w", cfg.Addr, status.ErrFailed, err)
	}
	w, err := t.acquire()
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	ep, err := t.setup(ctx, w, conn, cfg, local)
	if err != nil {
		_ = conn.Close()
		t.release()
		return nil, err
	}
	go ep.watchLink() // owned by ep: Close closes the link and waits
	return ep, nil
}

func (t *Transport) setup(ctx context.Context, w *worker, conn net.Conn, cfg transport.DialConfig, local []byte) (*endpoint, error) {
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(10 * time.Second)
	}
	conn, err := auth.Client(conn, t.cfg.Auth, "ucx", dl)
	if err != nil {
		return nil, fmt.Errorf("ucx: %s: %w", cfg.Addr, err)
	}
	_ = conn.SetDeadline(dl)
	if _, err := conn.Write(hello{rank: cfg.Rank, listenPort: uint32(cfg.ListenPort), workerAddr: w.addr}.encode()); err != nil {
		return nil, fmt.Errorf("ucx: hello to %s: %w: %w", cfg.Addr, status.ErrPeerClosed, err)
	}
	var first [8]byte
	n, err := io.ReadFull(conn, first[:])
	if aerr := auth.Refusal(first[:n], cfg.Addr); aerr != nil {
		return nil, fmt.Errorf("ucx: %w", aerr) // the target authenticates; this side has no credentials
	}
	if err != nil {
		if cerr := status.FromContext(ctx); cerr != nil {
			return nil, fmt.Errorf("ucx: welcome from %s: %w", cfg.Addr, cerr)
		}
		return nil, fmt.Errorf("ucx: reading welcome: %w: %w", status.ErrPeerClosed, err)
	}
	wel, err := readWelcome(io.MultiReader(bytes.NewReader(first[:]), conn))
	if err != nil {
		if cerr := status.FromContext(ctx); cerr != nil {
			return nil, fmt.Errorf("ucx: welcome from %s: %w", cfg.Addr, cerr)
		}
		return nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	e := &endpoint{t: t, w: w, region: cfg.Local, local: local, remoteAddr: wel.regionAddr, remoteSize: wel.regionSize, link: conn,
		linkDone: make(chan struct{}), version: wel.version, quit: make(chan struct{}),
		peer: peerRegions{replies: make(chan resolved, 1)}}
	if local == nil {
		if err := e.makeRing(); err != nil {
			return nil, err
		}
	}
	e.errflag = (*C.int)(C.calloc(1, C.size_t(unsafe.Sizeof(C.int(0)))))
	if local != nil {
		if e.localMemh, e.unregisterLocal, err = w.register(local); err != nil {
			C.free(unsafe.Pointer(e.errflag))
			return nil, err
		}
	}
	var st C.ucs_status_t
	what := "endpoint create"
	w.call(func() {
		addr := C.CBytes(wel.workerAddr)
		defer C.free(addr)
		// Peer failure handling where the transports support it (tcp, rc, ...); shared-memory
		// transports do not (UCX 1.13), so they go without it: the bootstrap link still tells
		// a closed or dead target.
		mode := C.int(0)
		if w.peerFailureTLs() {
			mode = 1
		}
		if st = C.hmc_ep_create(w.w, addr, e.errflag, mode, &e.ep); st == C.UCS_ERR_UNREACHABLE && mode == 1 {
			st = C.hmc_ep_create(w.w, addr, e.errflag, 0, &e.ep)
		}
		if st != C.UCS_OK {
			return
		}
		e.token = wel.token
		e.amVec = wel.version >= 3 && !t.cfg.PiecewiseVectors && C.hmc_ep_rma_emulated(e.ep) != 0
		e.rndvPutv = wel.version >= 4
		rk := C.CBytes(wel.rkey)
		defer C.free(rk)
		if st = C.ucp_ep_rkey_unpack(e.ep, rk, &e.rkey); st != C.UCS_OK {
			what = "rkey unpack"
			w.wait(C.hmc_ep_close(e.ep, 1))
		}
	})
	if st != C.UCS_OK {
		e.unmapLocal()
		C.free(unsafe.Pointer(e.errflag))
		return nil, ucsErr(what+" for "+cfg.Addr, st)
	}
	return e, nil
}

// watchLink marks the endpoint dead when the target's bootstrap link ends.
func (e *endpoint) watchLink() {
	defer close(e.linkDone)
	_ = e.linkReader() // until the target or Close ends the link, or the target breaks protocol
	err := fmt.Errorf("ucx: target closed its link: %w", status.ErrPeerClosed)
	e.dead.CompareAndSwap(nil, &err)
	e.w.call(func() { e.failAMLocked(err) }) // no answer comes any more
}

func (e *endpoint) RemoteSize() uint64 { return e.remoteSize }

func (e *endpoint) check(localOff, remoteOff, n uint64) error {
	if err := e.usable(); err != nil {
		return err
	}
	return transport.CheckRanges(e.region.Size(), e.remoteSize, localOff, remoteOff, n)
}

// PutAsync posts the put and a flush; the Op completes when the flush does (bytes visible).
func (e *endpoint) PutAsync(ctx context.Context, localOff, remoteOff, n uint64) (*transport.Op, error) {
	return e.post(ctx, true, localOff, remoteOff, n)
}

// GetAsync posts the get; the Op completes when the bytes are in the local region.
func (e *endpoint) GetAsync(ctx context.Context, localOff, remoteOff, n uint64) (*transport.Op, error) {
	return e.post(ctx, false, localOff, remoteOff, n)
}

func (e *endpoint) post(ctx context.Context, put bool, localOff, remoteOff, n uint64) (*transport.Op, error) {
	if err := e.check(localOff, remoteOff, n); err != nil {
		return nil, err
	}
	if err := status.FromContext(ctx); err != nil {
		return nil, err
	}
	if n == 0 {
		return transport.Succeeded(), nil
	}
	if e.local == nil {
		return e.staged(put, localOff, remoteOff, n), nil
	}
	return e.postRaw(put, unsafe.Pointer(&e.local[localOff]), e.localMemh, e.at(remoteOff), n), nil
}

// postRaw posts a put (and its flush) or a get between host memory at buf, registered as memh,
// and the target's region at remoteOff; ranges are already checked. A put is one call into UCX
// (put, flush unless coalesced, a round of progress); its Op completes when the flush does. An
// operation complete on return (shared memory UCX allocated) gets transport.Succeeded: nothing
// is allocated for it.
func (e *endpoint) postRaw(put bool, buf unsafe.Pointer, memh C.ucp_mem_h, rt target, n uint64) *transport.Op {
	w := e.w
	raddr := C.uint64_t(rt.addr)
	var op *transport.Op
	w.users.Add(1)
	w.pmu.Lock()
	refused := e.refusedLocked(rt)
	switch {
	case refused != nil:
		op = transport.Failed(refused)
	case put:
		flush := e.flushing < maxFlushes // else the next flush to complete issues one for the batch
		r := w.posted
		C.hmc_post_put(handle(unsafe.Pointer(w.w)), handle(unsafe.Pointer(e.ep)), handle(buf), C.size_t(n), raddr,
			handle(unsafe.Pointer(rt.rkey)), handle(unsafe.Pointer(memh)), cbool(flush), handle(unsafe.Pointer(r)))
		preq, freq, pst, fst := r.preq, r.freq, r.pst, r.fst
		switch {
		case pst != C.UCS_OK:
			op = transport.Failed(ucsErr("put", pst))
		case flush && preq == nil && freq == nil && fst == C.UCS_OK: // put and flush done at once
			op = transport.Succeeded()
			e.flushed(nil, C.UCS_OK, nil, e.batch) // the flush covers the batched puts too
			e.batch = nil
		default:
			op = e.newOp(2)
			w.track(e, rt.reg, preq, op, "put")
			if !flush {
				e.batch = append(e.batch, op)
				break
			}
			ops := e.batch // this flush covers every put batched before it too
			e.batch = nil
			e.flushed(freq, fst, op, ops)
		}
	default:
		var st C.ucs_status_t
		req := C.hmc_get(e.ep, buf, C.size_t(n), raddr, rt.rkey, memh, &st)
		switch {
		case st != C.UCS_OK:
			op = transport.Failed(ucsErr("get", st))
		case req == nil:
			op = transport.Succeeded()
		default:
			op = e.newOp(1)
			w.track(e, rt.reg, req, op, "get")
		}
	}
	if len(w.pending) > 0 || len(e.batch) > 0 {
		w.signalLocked() // something is in flight: the loop must progress it
	}
	w.pmu.Unlock()
	return op
}

// refusedLocked says why nothing may be posted to rt now (the endpoint closed, the region
// revoked by the target), or nil. Caller holds pmu, under which both are set.
func (e *endpoint) refusedLocked(rt target) error {
	switch {
	case e.closed.Load():
		return fmt.Errorf("ucx: endpoint: %w", status.ErrClosed)
	case rt.reg != nil && rt.reg.dead:
		return errRevoked(rt.reg.key)
	}
	return nil
}

// target is where a put or get goes: an rkey and an address in the target, and the peer region
// they belong to (nil: the server's default region).
type target struct {
	rkey C.ucp_rkey_h
	addr uint64
	reg  *peerRegion
}

// at is the target of remoteOff in the server's default region.
func (e *endpoint) at(remoteOff uint64) target {
	return target{rkey: e.rkey, addr: e.remoteAddr + remoteOff}
}

// newOp returns an Op of parts parts whose waiter progresses the worker.
func (e *endpoint) newOp(parts int) *transport.Op {
	op := transport.NewOp(parts)
	op.SetPoll(time.Duration(e.t.cfg.SpinTime)*time.Microsecond, e.w)
	return op
}

// handle passes C memory to C as an integer (see hmc_post_put).
func handle(p unsafe.Pointer) C.uintptr_t { return C.uintptr_t(uintptr(p)) }

func cbool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// Close stops new operations (they fail with ErrClosed), lets every request of the endpoint
// already given to UCX complete — land, or fail if the target is gone — then closes the UCX
// endpoint, unmaps the local region and releases the worker. Idempotent.
//
// The UCX endpoint is closed only once none of its requests is in flight: closing it by force
// with requests still queued makes UCX 1.13 purge them, and its purge of a queued zero-copy RMA
// request crashes the process (SIGSEGV in ucp_mem_rereg_mds, from ucp_request_memory_dereg <-
// ucp_request_send_state_ff <- uct_tcp_ep_pending_purge <- ucp_ep_close_nbx; reproduced with a
// core dump, about 1 close in 10 with 256 MiB in flight over tcp once the flush before the
// close was cut short). A target that is alive completes them; a dead one makes UCX fail them
// (peer error handling, or the kernel refusing cross-memory attach to a gone process). A target
// that neither answers nor dies for Config.CloseTimeout leaves the endpoint abandoned: Close
// returns ErrTimeout, and the endpoint's UCX resources (and its worker) are never freed rather
// than freed under UCX's feet.
func (e *endpoint) Close() error {
	var err error
	e.closeOnce.Do(func() {
		e.stagingMu.Lock()
		e.closed.Store(true)
		e.stagingMu.Unlock()
		drained := e.drain()
		close(e.quit)
		_ = e.link.Close()
		<-e.linkDone
		e.staging.Wait() // staged transfers end: their pieces completed in drain, new ones fail
		if !drained {
			e.w.abandon.Add(1)
			err = fmt.Errorf("ucx: close: requests still in flight after %v, the target neither completes nor fails them; endpoint abandoned: %w",
				e.t.closeTimeout(), status.ErrTimeout)
			e.t.release()
			return
		}
		e.w.call(func() {
			// Nothing of this endpoint is queued in UCX any more: the forced close purges nothing.
			e.w.wait(C.hmc_ep_close(e.ep, 1))
			C.ucp_rkey_destroy(e.rkey)
			e.peer.destroyAll()
		})
		e.stageMu.Lock()
		e.unmapLocal()
		e.stageMu.Unlock()
		e.t.release()
		// errflag stays allocated: UCX may not call the error callback after close, but a late
		// check must not read freed memory (4 bytes per endpoint ever closed).
	})
	return err
}

// drain flushes the endpoint and progresses the worker until none of its requests is in flight
// (Config.CloseTimeout at most); puts waiting for a flush go with the drain's flush. It reports
// whether the endpoint drained. Called once closed is set, so nothing new is posted.
func (e *endpoint) drain() bool {
	w := e.w
	deadline := time.Now().Add(e.t.closeTimeout())
	spinUntil := time.Now().Add(time.Duration(e.t.cfg.SpinTime) * time.Microsecond)
	flushed := false
	for {
		var done bool
		w.call(func() {
			if !flushed {
				flushed = true
				ops := e.batch
				e.batch = nil
				var st C.ucs_status_t
				req := C.hmc_flush(e.ep, &st)
				e.flushed(req, st, nil, ops)
			}
			w.progress()
			if err := e.broken(); err != nil {
				e.failAMLocked(err) // their answers will not come
			}
			done = e.inflight == 0
		})
		if done {
			return true
		}
		now := time.Now()
		if now.After(deadline) {
			return false
		}
		if now.After(spinUntil) {
			time.Sleep(50 * time.Microsecond) // a slow target: leave the cores to it
		} else {
			runtime.Gosched()
		}
	}
}
