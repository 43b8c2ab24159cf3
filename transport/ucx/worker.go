//go:build ucx && cgo

package ucx

/*
#include "hmc_ucx.h"
*/
import "C"

import (
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/transport"
)

// worker owns a ucp context and worker. Every UCX call is made with pmu held (the worker runs in
// UCS_THREAD_MODE_SERIALIZED): by callers posting operations, by callers waiting for them
// (they drive progress themselves, so a completion costs no thread wake-up), and by the
// background loop, which progresses when nobody waits (target side, operations left in flight)
// and sleeps on the worker's event fd when idle.
type worker struct {
	cfg  Config
	uctx *ucpContext // shared; ctx is its context
	ctx  C.ucp_context_h
	w    C.ucp_worker_h
	efd  int
	addr []byte // this worker's address

	pmu      sync.Mutex
	pending  []*pend          // requests in flight; guarded by pmu
	reqs     []C.uintptr_t    // their requests, for hmc_poll; guarded by pmu
	statuses []C.ucs_status_t // hmc_poll's answers; guarded by pmu
	posted   *C.hmc_posted    // hmc_post_put's answers (C memory); guarded by pmu
	gone     bool             // the worker is destroyed: a late Poll must not touch it; guarded by pmu
	abandon  atomic.Int32     // endpoints closed with requests still in flight (never freed)
	sleeping atomic.Bool
	stopping atomic.Bool
	drivers  atomic.Int32  // waiters polling (driving progress) now
	users    atomic.Uint64 // bumped by every post and every Transport.Progress
	kick     chan struct{} // makes the loop progress now: a waiter about to block, or stop (capacity 1)
	done     chan struct{}

	// Vector puts and gets as active messages (am.go); guarded by pmu but amLinks.
	amq        *C.hmc_amq              // the handlers' queues (C memory)
	amWaits    map[uint64]*amChunkWait // PUTVs and GETVs sent, by seq, until their answer
	amSeq      uint64                  // the last PUTV's or GETV's seq
	amLinks    sync.Map                // token -> *amGrants: the links of this worker's servers
	amDsts     [][]byte                // scratch of amPieces
	amKeys     []buffer.Key            // scratch of amPieces: amDsts' regions
	rxRegions  map[buffer.Key]int      // rendezvous PUTVs being received into each region
	lastAnswer time.Time               // when this worker last answered a PUTV or GETV (answerSpin)
	putvs      atomic.Uint64           // PUTVs applied (tests)
	putvsRndv  atomic.Uint64           // of them, received as rendezvous (tests)
	getvs      atomic.Uint64           // GETVs answered with their bytes (tests)
}

// pend is a UCX request an Op waits for.
type pend struct {
	req   unsafe.Pointer
	ep    *endpoint               // whose request it is (its inflight count); nil for none
	reg   *peerRegion             // the peer region it reaches (its inflight count); nil for none
	after func(st C.ucs_status_t) // run when req completes, before op finishes (an atomic's reply)
	op    *transport.Op           // the Op a part of which completes with req (for a flush: the put it followed)
	what  string
	flush *endpoint       // a flush of this endpoint: on completion, ops finish and the next batch flushes
	ops   []*transport.Op // a flush's batch: earlier puts it also makes visible
}

func startWorker(cfg Config) (*worker, error) {
	w := &worker{cfg: cfg, kick: make(chan struct{}, 1), done: make(chan struct{})}
	if err := w.init(); err != nil {
		return nil, err
	}
	go w.loop() // owned by w: stop ends it and waits
	return w, nil
}

func (w *worker) init() error {
	uctx, err := openContext(w.cfg)
	if err != nil {
		return err
	}
	w.uctx, w.ctx = uctx, uctx.ctx
	if st := C.hmc_worker_create(w.ctx, &w.w); st != C.UCS_OK {
		uctx.release()
		return ucsErr("worker create", st)
	}
	var fd C.int
	if st := C.ucp_worker_get_efd(w.w, &fd); st != C.UCS_OK {
		C.ucp_worker_destroy(w.w)
		uctx.release()
		return ucsErr("worker event fd", st)
	}
	w.efd = int(fd)
	var a *C.ucp_address_t
	var alen C.size_t
	if st := C.ucp_worker_get_address(w.w, &a, &alen); st != C.UCS_OK {
		C.ucp_worker_destroy(w.w)
		uctx.release()
		return ucsErr("worker address", st)
	}
	w.addr = C.GoBytes(unsafe.Pointer(a), C.int(alen))
	C.ucp_worker_release_address(w.w, a)
	w.posted = (*C.hmc_posted)(C.calloc(1, C.size_t(unsafe.Sizeof(C.hmc_posted{}))))
	w.amq = (*C.hmc_amq)(C.calloc(1, C.size_t(unsafe.Sizeof(C.hmc_amq{}))))
	w.amWaits = make(map[uint64]*amChunkWait)
	w.rxRegions = make(map[buffer.Key]int)
	if st := C.hmc_am_init(w.w, w.amq); st != C.UCS_OK {
		C.free(unsafe.Pointer(w.posted))
		C.free(unsafe.Pointer(w.amq))
		C.ucp_worker_destroy(w.w)
		uctx.release()
		return ucsErr("active message handlers", st)
	}
	return nil
}

// loop progresses the worker when no waiter does.
func (w *worker) loop() {
	defer close(w.done)
	spin := time.Duration(w.cfg.SpinTime) * time.Microsecond
	lastActive := time.Now()
	var users, turns uint64
	aside := userActive // how long the next stand-aside lasts (see userActiveMax)
	idleTimer := time.NewTimer(userActive)
	defer idleTimer.Stop()
	for idle := 0; ; {
		if w.stopping.Load() {
			w.pmu.Lock()
			n := len(w.pending)
			w.pmu.Unlock()
			if n == 0 || w.abandon.Load() > 0 {
				break
			}
		}
		if w.drivers.Load() > 0 {
			// Waiters drive progress: stay off the lock they take for every poll and off the
			// cores they and the peer need until the last one leaves (End kicks us if it
			// leaves without its operation done; else look again a little later).
			if w.standAside(idleTimer, &aside) {
				users = w.users.Load() // kicked: a waiter is about to block, progress now
			}
			continue
		}
		if u := w.users.Load(); u != users {
			// Posters and Transport.Progress callers progress too: the same, but they do not
			// say when they stop, so look again a little later (at once if a waiter gives up).
			users = u
			if w.standAside(idleTimer, &aside) {
				users = w.users.Load()
			}
			lastActive, idle = time.Now(), 0
			continue
		}
		// A poster holding the lock is progressing (hmc_post_put): try again rather than queue
		// behind it, then make it queue behind us.
		if !w.pmu.TryLock() {
			runtime.Gosched()
			continue
		}
		aside = userActive // users went quiet: look often again when they come back
		active := w.progress() || len(w.pending) > 0
		awaiting, answered := len(w.amWaits) > 0, w.lastAnswer
		w.pmu.Unlock()
		if turns++; turns&63 == 0 { // a loop busy for long never blocks: see SpinYield
			transport.SpinYield(time.Now())
		}
		if active {
			idle = 0
			continue
		}
		if idle++; idle%64 != 0 { // the clock every 64 idle turns: a clock read costs a progress round
			continue
		}
		now := time.Now()
		if idle == 64 {
			lastActive = now // the first idle turns since activity: spin from here
			continue
		}
		talking := awaiting || now.Sub(answered) < answerSpin // a vector's messages in conversation
		if d := now.Sub(lastActive); d < spin || (talking && d < answerSpin) {
			continue
		}
		// Idle: sleep on the event fd until UCX or a poster wakes us. A poster adds its request
		// under pmu and then signals if sleeping is set, so setting it before the check under
		// pmu loses no wake-up.
		w.sleeping.Store(true)
		w.pmu.Lock()
		armed := len(w.pending) == 0 && !w.stopping.Load() && C.ucp_worker_arm(w.w) == C.UCS_OK
		w.pmu.Unlock()
		if armed {
			fds := []unix.PollFd{{Fd: int32(w.efd), Events: unix.POLLIN}}
			_, _ = unix.Poll(fds, 100) // 100 ms at most: stop is noticed
		}
		w.sleeping.Store(false)
		lastActive, idle = time.Now(), 0
	}
	w.pmu.Lock()
	w.gone = true
	leak := w.abandon.Load() > 0
	if !leak {
		C.hmc_drain(w.w)
		C.hmc_am_drop(w.w, w.amq)
		C.ucp_worker_destroy(w.w)
		C.free(unsafe.Pointer(w.posted))
		C.free(unsafe.Pointer(w.amq))
	}
	w.pmu.Unlock()
	if !leak { // an abandoned endpoint's requests may still be queued: destroying would purge them
		w.uctx.release()
	}
}

// answerSpin is how long the loop polls on, instead of sleeping on the event fd after
// SpinTime, while a vector put's or get's messages (am.go) are in conversation: while those
// it sent await their answers, and after it last answered one. On two cores each side's
// polling thread then keeps a core; a thread that slept and was woken for the next message
// waited 0.5-6 ms for one (the peer's poller held the other, perf sched), and a 512 x 16 KiB
// vector get over UCX's tcp stalled 9-14 ms at its 99th percentile instead of 6 (its median
// batch 3.4 -> 2.3 ms).
const answerSpin = 20 * time.Millisecond

// userActive is how long the loop leaves progress to posters and Transport.Progress callers
// once it saw one, before it looks again (Go rounds a sleep this short up to about a
// millisecond in an otherwise idle process): an operation nobody waits for, or a put arriving
// over tcp, progresses that much later at worst if they stop right then. While they go on
// (every look finds new posts or a waiter driving) the loop looks half as often each time,
// down to every userActiveMax: each look is a timer, a thread woken and parked again, and on
// two cores a data thread preempted (a 64 KiB stream over tcp: 1,000 looks a second cost 5 %).
// A kick (a waiter about to block) or the loop's own progress starts again from userActive.
const (
	userActive    = 100 * time.Microsecond
	userActiveMax = 2 * time.Millisecond
)

// progress runs UCX's progress and completes finished requests, in one call into UCX. It
// reports whether anything happened. Caller holds pmu.
func (w *worker) progress() bool {
	n := len(w.pending)
	if cap(w.reqs) < n {
		w.reqs = make([]C.uintptr_t, n, 2*n)
		w.statuses = make([]C.ucs_status_t, n, 2*n)
	}
	reqs, sts := w.reqs[:n], w.statuses[:n]
	for i, p := range w.pending {
		reqs[i] = C.uintptr_t(uintptr(p.req))
	}
	var rp *C.uintptr_t
	var sp *C.ucs_status_t
	if n > 0 {
		rp, sp = &reqs[0], &sts[0]
	}
	active := C.hmc_poll(w.w, rp, sp, C.int(n)) != 0
	if n > 0 {
		active = w.complete(sts) || active
	}
	if w.amq.head != nil { // after complete: answers sent here add requests
		active = w.amDrain() || active
	}
	return active
}

// complete finishes the pending requests whose status (sts, one per pending request, from
// hmc_poll, which freed the requests) is final. It reports whether any was. Caller holds pmu.
func (w *worker) complete(sts []C.ucs_status_t) bool {
	any := false
	var done []*endpoint
	pending := w.pending
	keep := pending[:0]
	for i, p := range pending {
		st := sts[i]
		if st == C.UCS_INPROGRESS {
			keep = append(keep, p)
			continue
		}
		any = true // hmc_poll freed the request
		if p.ep != nil {
			p.ep.inflight--
		}
		if p.reg != nil {
			p.reg.inflight--
		}
		if p.after != nil {
			p.after(st)
		}
		var err error
		if st != C.UCS_OK {
			err = ucsErr(p.what, st)
		}
		if p.op != nil {
			p.op.Finish(err)
		}
		finishAll(p.ops, err)
		if p.flush != nil {
			done = append(done, p.flush)
		}
	}
	clear(pending[len(keep):])
	w.pending = keep
	for _, e := range done { // flushes completed: flush what was put meanwhile
		e.flushing--
		e.flushBatch()
	}
	return any
}

// Begin, Poll and End make the worker the transport.Poller of its Ops: a waiter progresses
// the worker itself while the loop stands aside.
func (w *worker) Begin() { w.drivers.Add(1) }

// Poll is a waiter's poll step: progress unless another waiter is.
func (w *worker) Poll() {
	if w.pmu.TryLock() {
		if !w.gone { // a waiter or Progress caller may come late, after the last Close
			w.progress()
		}
		w.pmu.Unlock()
	}
}

// End hands progress back to the loop when the last waiter leaves: at once if its Op is not
// done (the waiter is about to block); else the loop looks again after userActive, as it does
// for posters: a stream waits or posts again sooner than that, and waking the loop for every
// operation cost a thread wake-up and sleep each (one context switch per operation).
func (w *worker) End(done bool) {
	if w.drivers.Add(-1) == 0 && !done {
		w.wake()
	}
}

// standAside waits for *aside or a kick (wake), and reports whether it was kicked. A kick sets
// *aside back to userActive; a stand-aside that ran its course doubles it, up to userActiveMax
// (the caller stands aside again only if users were still active meanwhile).
func (w *worker) standAside(t *time.Timer, aside *time.Duration) bool {
	t.Reset(*aside)
	select {
	case <-w.kick:
		*aside = userActive
		return true
	case <-t.C:
		*aside = min(2**aside, userActiveMax)
		return false
	}
}

// wake kicks the loop out of standing aside (never blocks; a kick pending is enough).
func (w *worker) wake() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// call runs f with the worker (pmu held), then wakes the loop if it sleeps, so that what f
// started progresses.
func (w *worker) call(f func()) {
	w.pmu.Lock()
	f()
	w.signalLocked()
	w.pmu.Unlock()
}

// signalLocked wakes the loop from its event fd if it sleeps there. Caller holds pmu, so the
// worker cannot be destroyed meanwhile (the loop destroys it under pmu).
func (w *worker) signalLocked() {
	if w.sleeping.Load() && !w.gone {
		C.ucp_worker_signal(w.w) // thread-safe
	}
}

// track makes op wait for req (nil: already complete), a request of e on peer region reg (nil:
// the default region). Caller holds pmu.
func (w *worker) track(e *endpoint, reg *peerRegion, req unsafe.Pointer, op *transport.Op, what string) {
	if req == nil {
		if op != nil {
			op.Finish(nil)
		}
		return
	}
	w.add(&pend{req: req, ep: e, reg: reg, op: op, what: what})
}

// add makes p pending and counts it in flight on its endpoint and peer region. Caller holds
// pmu.
func (w *worker) add(p *pend) {
	if p.ep != nil {
		p.ep.inflight++
	}
	if p.reg != nil {
		p.reg.inflight++
	}
	w.pending = append(w.pending, p)
}

func (w *worker) stop() {
	w.stopping.Store(true)
	w.wake()
	// Wake the loop from its event fd too, unless it already saw stopping and destroyed the
	// worker: signalling a destroyed worker crashed (~1 % of `hmc bench` runs at exit, once the
	// loop spent more of its time waiting for a kick).
	w.pmu.Lock()
	if !w.gone {
		C.ucp_worker_signal(w.w) // thread-safe
	}
	w.pmu.Unlock()
	<-w.done
}

// wait progresses until req completes, for teardown. Caller holds pmu.
func (w *worker) wait(req unsafe.Pointer) { w.waitFor(req, 5*time.Second) }

// waitFor progresses until req completes or d passes, then frees req (UCX releases it when it
// completes, if it has not). Caller holds pmu.
func (w *worker) waitFor(req unsafe.Pointer, d time.Duration) {
	if req == nil {
		return
	}
	for deadline := time.Now().Add(d); C.hmc_req_status(req) == C.UCS_INPROGRESS && time.Now().Before(deadline); {
		C.ucp_worker_progress(w.w)
	}
	C.ucp_request_free(req)
}

// peerFailureTLs says whether the configured transports (Config.TLS, else UCX_TLS, else all)
// include one that supports peer failure handling (tcp and the RDMA ones do; UCX 1.13's
// shared-memory ones do not, and asking for it with them only logs an error and fails).
func (w *worker) peerFailureTLs() bool {
	tls := w.cfg.TLS
	if tls == "" {
		tls = os.Getenv("UCX_TLS")
	}
	if tls == "" {
		return true
	}
	if strings.HasPrefix(tls, "^") { // "all but …": tcp stays among them
		return true
	}
	for _, t := range strings.Split(tls, ",") {
		t = strings.TrimSpace(t)
		if t == "all" || t == "tcp" || t == "ib" || isRDMA(t) {
			return true
		}
	}
	return false
}

// memMap registers region (on the loop).
func (w *worker) memMap(b []byte) (C.ucp_mem_h, error) {
	var memh C.ucp_mem_h
	var st C.ucs_status_t
	w.call(func() { st = C.hmc_mem_map(w.ctx, unsafe.Pointer(unsafe.SliceData(b)), C.size_t(len(b)), &memh) })
	if st != C.UCS_OK {
		return nil, ucsErr("mem map", st)
	}
	return memh, nil
}

func (w *worker) memUnmap(memh C.ucp_mem_h) {
	w.call(func() { C.ucp_mem_unmap(w.ctx, memh) })
}

// packRkey packs the remote key peers need to reach memory registered as memh.
func (w *worker) packRkey(memh C.ucp_mem_h) ([]byte, error) {
	var st C.ucs_status_t
	var rkey []byte
	w.call(func() {
		var buf unsafe.Pointer
		var n C.size_t
		if st = C.ucp_rkey_pack(w.ctx, memh, &buf, &n); st == C.UCS_OK {
			rkey = C.GoBytes(buf, C.int(n))
			C.ucp_rkey_buffer_release(buf)
		}
	})
	if st != C.UCS_OK {
		return nil, ucsErr("rkey pack", st)
	}
	return rkey, nil
}

// register returns a handle for host memory b: that of the UCX allocation holding it
// (NewHostBuffer's, in this worker's context), which stays NewHostBuffer's to unmap, else a
// new registration. unregister undoes what register did.
func (w *worker) register(b []byte) (memh C.ucp_mem_h, unregister func(), err error) {
	if memh, ok := w.uctx.allocated(b); ok {
		return memh, func() {}, nil
	}
	if memh, err = w.memMap(b); err != nil {
		return nil, nil, err
	}
	return memh, func() { w.memUnmap(memh) }, nil
}
