//go:build ucx && cgo

package ucx

/*
#cgo pkg-config: ucx
#include <stdlib.h>
#include <string.h>
#include <ucp/api/ucp.h>
#include <uct/api/uct.h>

static ucs_status_t hmc_worker_create(ucp_context_h ctx, ucp_worker_h *w) {
	ucp_worker_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
	p.thread_mode = UCS_THREAD_MODE_SERIALIZED;
	return ucp_worker_create(ctx, &p, w);
}

static ucs_status_t hmc_mem_map(ucp_context_h ctx, void *addr, size_t len, ucp_mem_h *memh) {
	ucp_mem_map_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
	p.address = addr;
	p.length = len;
	return ucp_mem_map(ctx, &p, memh);
}

static void hmc_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status) {
	*(volatile int *)arg = (int)status;
}

static ucs_status_t hmc_ep_create(ucp_worker_h w, const void *addr, int *errflag, int peer_mode, ucp_ep_h *ep) {
	ucp_ep_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
	               UCP_EP_PARAM_FIELD_ERR_HANDLER;
	p.address = (const ucp_address_t *)addr;
	p.err_mode = peer_mode ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
	p.err_handler.cb = hmc_err_cb;
	p.err_handler.arg = errflag;
	return ucp_ep_create(w, &p, ep);
}

// Requests: NULL = done at once; an error pointer becomes *st; else the request to poll.
// The local buffer's registration (memh) goes with each operation, so that UCX can use it
// instead of looking one up or registering on demand. (It did not stop UCX 1.13 from crashing
// when a forced close purges queued zero-copy puts: Close flushes first for that.)
static void *hmc_put(ucp_ep_h ep, void *buf, size_t n, uint64_t raddr, ucp_rkey_h rkey, ucp_mem_h memh, ucs_status_t *st) {
	ucp_request_param_t p;
	memset(&p, 0, sizeof p);
	p.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
	p.memh = memh;
	ucs_status_ptr_t r = ucp_put_nbx(ep, buf, n, raddr, rkey, &p);
	if (UCS_PTR_IS_ERR(r)) { *st = UCS_PTR_STATUS(r); return NULL; }
	*st = UCS_OK;
	return r;
}

static void *hmc_get(ucp_ep_h ep, void *buf, size_t n, uint64_t raddr, ucp_rkey_h rkey, ucp_mem_h memh, ucs_status_t *st) {
	ucp_request_param_t p;
	memset(&p, 0, sizeof p);
	p.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
	p.memh = memh;
	ucs_status_ptr_t r = ucp_get_nbx(ep, buf, n, raddr, rkey, &p);
	if (UCS_PTR_IS_ERR(r)) { *st = UCS_PTR_STATUS(r); return NULL; }
	*st = UCS_OK;
	return r;
}

static void *hmc_flush(ucp_ep_h ep, ucs_status_t *st) {
	ucp_request_param_t p;
	memset(&p, 0, sizeof p);
	ucs_status_ptr_t r = ucp_ep_flush_nbx(ep, &p);
	if (UCS_PTR_IS_ERR(r)) { *st = UCS_PTR_STATUS(r); return NULL; }
	*st = UCS_OK;
	return r;
}

static void *hmc_ep_close(ucp_ep_h ep, int force) {
	ucp_request_param_t p;
	memset(&p, 0, sizeof p);
	p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
	p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
	ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
	if (UCS_PTR_IS_ERR(r)) return NULL;
	return r;
}

static ucs_status_t hmc_req_status(void *r) { return ucp_request_check_status(r); }

// Progresses w until it has been idle for 100 rounds in a row (100000 rounds at most), so that
// what UCX releases from its progress (requests of force-closed endpoints) is released before
// the worker is destroyed.
static void hmc_drain(ucp_worker_h w) {
	for (int i = 0, idle = 0; i < 100000 && idle < 100; i++) idle = ucp_worker_progress(w) ? 0 : idle + 1;
}

// What hmc_post_put started: requests and statuses as hmc_put's.
typedef struct { void *preq, *freq; ucs_status_t pst, fst; } hmc_posted;

// A put and, if flush, a flush of its endpoint, then one round of progress: one call per put
// on the data path. r is the worker's. Every handle is C memory, passed as an integer so that
// the call skips cgo's pointer checks (five per call otherwise).
static void hmc_post_put(uintptr_t w, uintptr_t ep, uintptr_t buf, size_t n, uint64_t raddr, uintptr_t rkey,
                         uintptr_t memh, int flush, uintptr_t posted) {
	hmc_posted *r = (hmc_posted *)posted;
	r->preq = hmc_put((ucp_ep_h)ep, (void *)buf, n, raddr, (ucp_rkey_h)rkey, (ucp_mem_h)memh, &r->pst);
	r->freq = NULL;
	r->fst = UCS_OK;
	if (flush && r->pst == UCS_OK) r->freq = hmc_flush((ucp_ep_h)ep, &r->fst);
	ucp_worker_progress((ucp_worker_h)w);
}

// Progresses w until it has nothing more to do (64 rounds at most), then writes the status of
// each of the n requests reqs[i] into st[i] and frees those that completed. Returns whether
// anything progressed.
static int hmc_poll(ucp_worker_h w, const uintptr_t *reqs, ucs_status_t *st, int n) {
	int active = 0;
	for (int i = 0; i < 64 && ucp_worker_progress(w) != 0; i++) active = 1;
	for (int i = 0; i < n; i++) {
		st[i] = ucp_request_check_status((void *)reqs[i]);
		if (st[i] != UCS_INPROGRESS) ucp_request_free((void *)reqs[i]);
	}
	return active;
}

// Resources: every (component, md, transport, device), as "c\tmd\ttl\tdev\n" lines.
static char *hmc_resources(ucs_status_t *st) {
	uct_component_h *comps;
	unsigned ncomps;
	size_t cap = 4096, len = 0;
	char *out = malloc(cap);
	out[0] = 0;
	*st = uct_query_components(&comps, &ncomps);
	if (*st != UCS_OK) return out;
	for (unsigned i = 0; i < ncomps; i++) {
		uct_component_attr_t ca;
		memset(&ca, 0, sizeof ca);
		ca.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME | UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
		if (uct_component_query(comps[i], &ca) != UCS_OK) continue;
		uct_md_resource_desc_t *mds = calloc(ca.md_resource_count + 1, sizeof *mds);
		ca.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
		ca.md_resources = mds;
		if (uct_component_query(comps[i], &ca) != UCS_OK) { free(mds); continue; }
		for (unsigned m = 0; m < ca.md_resource_count; m++) {
			uct_md_config_t *mc;
			if (uct_md_config_read(comps[i], NULL, NULL, &mc) != UCS_OK) continue;
			uct_md_h md;
			ucs_status_t s = uct_md_open(comps[i], mds[m].md_name, mc, &md);
			uct_config_release(mc);
			if (s != UCS_OK) continue;
			uct_tl_resource_desc_t *tls;
			unsigned ntl;
			if (uct_md_query_tl_resources(md, &tls, &ntl) == UCS_OK) {
				for (unsigned k = 0; k < ntl; k++) {
					size_t need = strlen(ca.name) + strlen(mds[m].md_name) + strlen(tls[k].tl_name) + strlen(tls[k].dev_name) + 8;
					if (len + need >= cap) { cap = 2 * (len + need); out = realloc(out, cap); }
					len += snprintf(out + len, cap - len, "%s\t%s\t%s\t%s\n", ca.name, mds[m].md_name, tls[k].tl_name, tls[k].dev_name);
				}
				uct_release_tl_resource_list(tls);
			}
			uct_md_close(md);
		}
		free(mds);
	}
	uct_release_component_list(comps);
	return out;
}
*/
import "C"

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/internal/acceptor"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// Built says whether this binary has the UCX transport (build tag ucx, cgo).
const Built = true

// Config configures a UCX transport. The zero value lets UCX choose its transports (UCX_TLS and
// the other UCX_* variables of the environment apply).
type Config struct {
	// TLS restricts UCX's transports (UCX's TLS setting, e.g. "tcp" or "posix,cma,self"); it
	// overrides UCX_TLS. Empty: the environment's.
	TLS string
	// SpinTime is how long, in microseconds, the progress loop busy-polls after activity before
	// sleeping on the worker's event fd, and how long a Wait drives progress itself before it
	// blocks. Default: HMC_UCX_SPIN_US from the environment, else 1000 (a target serving
	// software-emulated RMA — UCX's shared-memory transports on memory UCX did not allocate —
	// must answer each fragment; a sleeping target costs a thread wake-up per fragment).
	SpinTime int
	// CloseTimeout bounds how long an endpoint's Close waits for its requests in flight to
	// complete or fail before it abandons the endpoint (see endpoint.Close). Zero: 30 s.
	CloseTimeout time.Duration
	rdma         bool
}

// Resource is one UCX transport on one device, as UCT lists them.
type Resource struct{ Component, MD, Transport, Device string }

// Resources lists UCX's transports and devices (UCT's resource query).
func Resources() ([]Resource, error) {
	var st C.ucs_status_t
	s := C.hmc_resources(&st)
	defer C.free(unsafe.Pointer(s))
	if st != C.UCS_OK {
		return nil, fmt.Errorf("ucx: resource query: %s: %w", statusString(st), status.ErrFailed)
	}
	var out []Resource
	for _, line := range strings.Split(strings.TrimSpace(C.GoString(s)), "\n") {
		f := strings.Split(line, "\t")
		if len(f) == 4 {
			out = append(out, Resource{f[0], f[1], f[2], f[3]})
		}
	}
	return out, nil
}

// rdmaTLs are the UCX transports ConnType RDMA may use.
var rdmaTLs = []string{"rc", "ud", "dc"}

func isRDMA(tl string) bool {
	for _, p := range rdmaTLs {
		if strings.HasPrefix(tl, p) {
			return true
		}
	}
	return false
}

// NewRDMA returns the UCX transport restricted to RDMA transports (rc, ud, dc, on any verbs
// device), or ErrUnsupported naming what UCX has when it has none of them.
func NewRDMA(cfg Config) (transport.Transport, error) {
	rs, err := Resources()
	if err != nil {
		return nil, err
	}
	var have, names []string
	for _, r := range rs {
		names = append(names, r.Transport+"/"+r.Device)
		if isRDMA(r.Transport) {
			have = append(have, r.Transport+"/"+r.Device)
		}
	}
	if len(have) == 0 {
		return nil, fmt.Errorf("ucx: rdma: %w: no RDMA transport (rc, ud or dc on a verbs device) among UCX's resources [%s]",
			status.ErrUnsupported, strings.Join(names, " "))
	}
	cfg.TLS, cfg.rdma = "rc,ud,dc,self", true
	return New(cfg)
}

// New returns a UCX transport.
func New(cfg Config) (transport.Transport, error) {
	if cfg.SpinTime <= 0 {
		cfg.SpinTime = 1000
		if v, err := strconv.Atoi(os.Getenv("HMC_UCX_SPIN_US")); err == nil && v > 0 {
			cfg.SpinTime = v
		}
	}
	return &Transport{cfg: cfg}, nil
}

// Transport is the UCX transport. Its worker is created on first use and destroyed when the
// last server and endpoint close.
type Transport struct {
	cfg Config

	mu   sync.Mutex
	w    *worker                // guarded by mu
	refs int                    // servers and endpoints using w; guarded by mu
	live atomic.Pointer[worker] // w, for Progress without mu
}

// Progress drives the worker once from the calling goroutine (transport.Progresser): a process
// polling its buffer for a peer's put over tcp calls it in its loop, and the background loop
// stands aside meanwhile.
func (t *Transport) Progress() {
	if w := t.live.Load(); w != nil {
		w.users.Add(1)
		w.Poll()
	}
}

// Type returns transport.UCX (or RDMA for NewRDMA's).
func (t *Transport) Type() transport.ConnType {
	if t.cfg.rdma {
		return transport.RDMA
	}
	return transport.UCX
}

// acquire returns the worker, starting it if needed; release undoes one acquire.
func (t *Transport) acquire() (*worker, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.w == nil {
		w, err := startWorker(t.cfg)
		if err != nil {
			return nil, err
		}
		t.w = w
		t.live.Store(w)
	}
	t.refs++
	return t.w, nil
}

func (t *Transport) release() {
	t.mu.Lock()
	t.refs--
	var w *worker
	if t.refs == 0 {
		w, t.w = t.w, nil
		t.live.Store(nil)
	}
	t.mu.Unlock()
	if w != nil {
		w.stop()
	}
}

func statusString(st C.ucs_status_t) string { return C.GoString(C.ucs_status_string(st)) }

// ucsErr maps a UCX status to an error: peer failures and cancellations to ErrPeerClosed,
// the rest to ErrFailed, with UCX's text.
func ucsErr(what string, st C.ucs_status_t) error {
	base := status.ErrFailed
	switch st {
	case C.UCS_ERR_CONNECTION_RESET, C.UCS_ERR_ENDPOINT_TIMEOUT, C.UCS_ERR_UNREACHABLE, C.UCS_ERR_CANCELED,
		C.UCS_ERR_REJECTED, C.UCS_ERR_NOT_CONNECTED:
		base = status.ErrPeerClosed
	case C.UCS_ERR_UNSUPPORTED, C.UCS_ERR_NO_DEVICE, C.UCS_ERR_NO_RESOURCE:
		base = status.ErrUnsupported
	}
	return fmt.Errorf("ucx: %s: %s: %w", what, statusString(st), base)
}

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
}

// pend is a UCX request an Op waits for.
type pend struct {
	req   unsafe.Pointer
	ep    *endpoint     // whose request it is (its inflight count); nil for none
	op    *transport.Op // the Op a part of which completes with req (for a flush: the put it followed)
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
	return nil
}

// loop progresses the worker when no waiter does.
func (w *worker) loop() {
	defer close(w.done)
	spin := time.Duration(w.cfg.SpinTime) * time.Microsecond
	lastActive := time.Now()
	var users uint64
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
			if w.standAside(idleTimer) {
				users = w.users.Load() // kicked: a waiter is about to block, progress now
			}
			continue
		}
		if u := w.users.Load(); u != users {
			// Posters and Transport.Progress callers progress too: the same, but they do not
			// say when they stop, so look again a little later (at once if a waiter gives up).
			users = u
			if w.standAside(idleTimer) {
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
		active := w.progress() || len(w.pending) > 0
		w.pmu.Unlock()
		if active {
			idle = 0
			continue
		}
		if idle++; idle%64 != 0 { // the clock every 64 idle turns: a clock read costs a progress round
			continue
		}
		if now := time.Now(); idle == 64 {
			lastActive = now // the first idle turns since activity: spin from here
			continue
		} else if now.Sub(lastActive) < spin {
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
		C.ucp_worker_destroy(w.w)
		C.free(unsafe.Pointer(w.posted))
	}
	w.pmu.Unlock()
	if !leak { // an abandoned endpoint's requests may still be queued: destroying would purge them
		w.uctx.release()
	}
}

// userActive is how long the loop leaves progress to posters and Transport.Progress callers
// once it saw one, before it looks again (Go rounds a sleep this short up to about a
// millisecond in an otherwise idle process): an operation nobody waits for, or a put arriving
// over tcp, progresses that much later at worst if they stop right then.
const userActive = 100 * time.Microsecond

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
	if n == 0 {
		return active
	}
	return w.complete(sts) || active
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

// standAside waits for userActive or a kick (wake), and reports whether it was kicked.
func (w *worker) standAside(t *time.Timer) bool {
	t.Reset(userActive)
	select {
	case <-w.kick:
		return true
	case <-t.C:
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

// track makes op wait for req (nil: already complete), a request of e. Caller holds pmu.
func (w *worker) track(e *endpoint, req unsafe.Pointer, op *transport.Op, what string) {
	if req == nil {
		if op != nil {
			op.Finish(nil)
		}
		return
	}
	w.add(&pend{req: req, ep: e, op: op, what: what})
}

// add makes p pending and counts it in flight on its endpoint. Caller holds pmu.
func (w *worker) add(p *pend) {
	if p.ep != nil {
		p.ep.inflight++
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

type server struct {
	t          *Transport
	w          *worker
	memh       C.ucp_mem_h
	unregister func() // undoes the registration of region
	region     []byte
	rkey       []byte
	rank       uint32
	accept     func(transport.PeerInfo)
	l          net.Listener
	acc        *acceptor.Server[net.Conn]
	once       sync.Once
}

// Listen maps the region and serves the bootstrap socket on cfg.BindAddr (TCP host:port).
func (t *Transport) Listen(cfg transport.ServerConfig) (transport.Server, error) {
	if cfg.Region == nil {
		return nil, fmt.Errorf("ucx: listen without a region: %w", status.ErrInvalidConfig)
	}
	region := cfg.Region.Bytes()
	if region == nil {
		if !hasCUDA() {
			return nil, fmt.Errorf("ucx: region is %v memory: a one-sided target in device memory needs UCX built with CUDA support (cuda_copy/cuda_ipc/gdr_copy), and this UCX has none (serve it over tcp, which stages it): %w",
				cfg.Region.Type(), status.ErrUnsupported)
		}
		region = memory.HostSlice(cfg.Region.Ptr(), cfg.Region.Size()) // a device range, only ever handed to UCX
	}
	l, err := net.Listen("tcp", cfg.BindAddr)
	if err != nil {
		return nil, fmt.Errorf("ucx: listen %s: %w: %w", cfg.BindAddr, status.ErrInvalidConfig, err)
	}
	w, err := t.acquire()
	if err != nil {
		_ = l.Close()
		return nil, err
	}
	s := &server{t: t, w: w, region: region, rank: cfg.Rank, accept: cfg.OnAccept, l: l}
	if s.memh, s.unregister, err = w.register(region); err != nil {
		_ = l.Close()
		t.release()
		return nil, err
	}
	var st C.ucs_status_t
	w.call(func() {
		var buf unsafe.Pointer
		var n C.size_t
		if st = C.ucp_rkey_pack(w.ctx, s.memh, &buf, &n); st == C.UCS_OK {
			s.rkey = C.GoBytes(buf, C.int(n))
			C.ucp_rkey_buffer_release(buf)
		}
	})
	if st != C.UCS_OK {
		s.unregister()
		_ = l.Close()
		t.release()
		return nil, ucsErr("rkey pack", st)
	}
	s.acc = acceptor.Start[net.Conn](l, l.Accept, s.serve, slog.New(slog.DiscardHandler), "ucx")
	return s, nil
}

func (s *server) Addr() string { return s.l.Addr().String() }

// serve answers one initiator's hello and holds the link open as its liveness signal.
func (s *server) serve(c net.Conn) {
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	h, err := readHello(c)
	if err != nil {
		return
	}
	if s.accept != nil {
		ip, _, _ := net.SplitHostPort(c.RemoteAddr().String())
		s.accept(transport.PeerInfo{Rank: h.rank, IP: ip, ListenPort: int(h.listenPort)})
	}
	wel := welcome{rank: s.rank, regionAddr: uint64(uintptr(unsafe.Pointer(unsafe.SliceData(s.region)))),
		regionSize: uint64(len(s.region)), rkey: s.rkey, workerAddr: s.w.addr}
	if _, err := c.Write(wel.encode()); err != nil {
		return
	}
	_ = c.SetDeadline(time.Time{})
	_, _ = io.Copy(io.Discard, c) // until the initiator or Close ends the link
}

// Close stops serving: bootstrap links close (initiators fail from then on), the region is
// unmapped, and the worker is released.
func (s *server) Close() error {
	var err error
	s.once.Do(func() {
		err = s.acc.Close()
		s.unregister()
		s.t.release()
	})
	return err
}

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
		return nil, fmt.Errorf("ucx: dial %s: %w: %w", cfg.Addr, status.ErrPeerClosed, err)
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
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	} else {
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	}
	if _, err := conn.Write(hello{rank: cfg.Rank, listenPort: uint32(cfg.ListenPort), workerAddr: w.addr}.encode()); err != nil {
		return nil, fmt.Errorf("ucx: hello to %s: %w: %w", cfg.Addr, status.ErrPeerClosed, err)
	}
	wel, err := readWelcome(conn)
	if err != nil {
		if cerr := status.FromContext(ctx); cerr != nil {
			return nil, fmt.Errorf("ucx: welcome from %s: %w", cfg.Addr, cerr)
		}
		return nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	e := &endpoint{t: t, w: w, region: cfg.Local, local: local, remoteAddr: wel.regionAddr, remoteSize: wel.regionSize, link: conn,
		linkDone: make(chan struct{})}
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
	_, _ = io.Copy(io.Discard, e.link)
	err := fmt.Errorf("ucx: target closed its link: %w", status.ErrPeerClosed)
	e.dead.CompareAndSwap(nil, &err)
}

func (e *endpoint) RemoteSize() uint64 { return e.remoteSize }

func (e *endpoint) check(localOff, remoteOff, n uint64) error {
	if e.closed.Load() {
		return fmt.Errorf("ucx: endpoint: %w", status.ErrClosed)
	}
	if p := e.dead.Load(); p != nil {
		return *p
	}
	if *(*int32)(unsafe.Pointer(e.errflag)) != 0 {
		return ucsErr("endpoint", C.ucs_status_t(*e.errflag))
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
	return e.postRaw(put, unsafe.Pointer(&e.local[localOff]), e.localMemh, remoteOff, n), nil
}

// postRaw posts a put (and its flush) or a get between host memory at buf, registered as memh,
// and the target's region at remoteOff; ranges are already checked. A put is one call into UCX
// (put, flush unless coalesced, a round of progress); its Op completes when the flush does. An
// operation complete on return (shared memory UCX allocated) gets transport.Succeeded: nothing
// is allocated for it.
func (e *endpoint) postRaw(put bool, buf unsafe.Pointer, memh C.ucp_mem_h, remoteOff, n uint64) *transport.Op {
	w := e.w
	raddr := C.uint64_t(e.remoteAddr + remoteOff)
	var op *transport.Op
	w.users.Add(1)
	w.pmu.Lock()
	switch {
	case e.closed.Load():
		op = transport.Failed(fmt.Errorf("ucx: endpoint: %w", status.ErrClosed))
	case put:
		flush := e.flushing < maxFlushes // else the next flush to complete issues one for the batch
		r := w.posted
		C.hmc_post_put(handle(unsafe.Pointer(w.w)), handle(unsafe.Pointer(e.ep)), handle(buf), C.size_t(n), raddr,
			handle(unsafe.Pointer(e.rkey)), handle(unsafe.Pointer(memh)), cbool(flush), handle(unsafe.Pointer(r)))
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
			w.track(e, preq, op, "put")
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
		req := C.hmc_get(e.ep, buf, C.size_t(n), raddr, e.rkey, memh, &st)
		switch {
		case st != C.UCS_OK:
			op = transport.Failed(ucsErr("get", st))
		case req == nil:
			op = transport.Succeeded()
		default:
			op = e.newOp(1)
			w.track(e, req, op, "get")
		}
	}
	if len(w.pending) > 0 || len(e.batch) > 0 {
		w.signalLocked() // something is in flight: the loop must progress it
	}
	w.pmu.Unlock()
	return op
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

// closeTimeout is Config.CloseTimeout or its default.
func (t *Transport) closeTimeout() time.Duration {
	if t.cfg.CloseTimeout > 0 {
		return t.cfg.CloseTimeout
	}
	return defaultCloseTimeout
}

// defaultCloseTimeout bounds how long Close waits for requests in flight to complete or fail.
const defaultCloseTimeout = 30 * time.Second

// hasCUDA says whether this UCX can move CUDA memory itself (its resources include a CUDA
// memory domain); then device regions are registered directly instead of staged.
var hasCUDA = sync.OnceValue(func() bool {
	rs, err := Resources()
	if err != nil {
		return false
	}
	for _, r := range rs {
		if strings.Contains(r.MD, "cuda") || strings.Contains(r.Component, "cuda") || strings.HasPrefix(r.MD, "gdr") {
			return true
		}
	}
	return false
})

// makeRing allocates and registers the staging chunks of a device local region.
func (e *endpoint) makeRing() error {
	for range transport.DefaultStageDepth {
		b, free, err := e.region.Memory().AllocStaging(transport.DefaultStageChunk)
		if err != nil {
			e.unmapLocal()
			return fmt.Errorf("ucx: staging ring: %w", err)
		}
		e.ringFree = append(e.ringFree, free)
		memh, err := e.w.memMap(b)
		if err != nil {
			e.unmapLocal()
			return err
		}
		e.ring = append(e.ring, b)
		e.ringMemh = append(e.ringMemh, memh)
	}
	return nil
}

// unmapLocal unregisters the local region or the ring and frees the ring.
func (e *endpoint) unmapLocal() {
	if e.local != nil {
		e.unregisterLocal()
	}
	for _, m := range e.ringMemh {
		e.w.memUnmap(m)
	}
	for _, f := range e.ringFree {
		_ = f()
	}
	e.ring, e.ringMemh, e.ringFree = nil, nil, nil
}

// staged runs a transfer of a device local region through the ring on its own goroutine
// (owned by the endpoint: Close waits for it; the returned Op completes when it returns): a put
// copies chunk i+1 from the device while chunk i is on its way; a get keeps the ring's chunks in
// flight and copies each to the device as it arrives.
func (e *endpoint) staged(put bool, localOff, remoteOff, n uint64) *transport.Op {
	e.stagingMu.Lock()
	defer e.stagingMu.Unlock()
	if e.closed.Load() {
		return transport.Failed(fmt.Errorf("ucx: endpoint: %w", status.ErrClosed))
	}
	op := transport.NewOp(1)
	e.staging.Add(1)
	go func() {
		defer e.staging.Done()
		op.Finish(e.runStaged(put, localOff, remoteOff, n))
	}()
	return op
}

func (e *endpoint) runStaged(put bool, localOff, remoteOff, n uint64) error {
	e.stageMu.Lock()
	defer e.stageMu.Unlock()
	if len(e.ring) == 0 {
		return fmt.Errorf("ucx: endpoint: %w", status.ErrClosed)
	}
	ctx := context.Background() // each piece completes or fails: the endpoint's close fails them
	chunk := uint64(len(e.ring[0]))
	type flight struct {
		op     *transport.Op
		off, k uint64
	}
	slots := make([]flight, len(e.ring))
	finish := func(i int) error {
		f := slots[i]
		slots[i] = flight{}
		if f.op == nil {
			return nil
		}
		if err := f.op.Wait(ctx); err != nil {
			return err
		}
		if !put {
			return e.region.WriteFromCPU(e.ring[i][:f.k], localOff+f.off)
		}
		return nil
	}
	var err error
	for i, done := 0, uint64(0); done < n && err == nil; i++ {
		slot := i % len(e.ring)
		if err = finish(slot); err != nil {
			break
		}
		k := min(chunk, n-done)
		if put {
			if err = e.region.ReadToCPU(e.ring[slot][:k], localOff+done); err != nil {
				break
			}
		}
		if e.closed.Load() {
			err = fmt.Errorf("ucx: endpoint: %w", status.ErrClosed)
			break
		}
		slots[slot] = flight{op: e.postRaw(put, unsafe.Pointer(&e.ring[slot][0]), e.ringMemh[slot], remoteOff+done, k), off: done, k: k}
		done += k
	}
	for i := range slots { // drain: every piece posted completes before the ring is reused
		if ferr := finish(i); err == nil {
			err = ferr
		}
	}
	return err
}
