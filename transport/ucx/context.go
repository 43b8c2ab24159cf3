//go:build ucx && cgo

package ucx

/*
#cgo pkg-config: ucx
#include <stdlib.h>
#include <string.h>
#include <ucp/api/ucp.h>

static ucs_status_t hmc_ucp_init(const char *tls, ucp_context_h *ctx) {
	ucp_config_t *cfg;
	ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
	if (st != UCS_OK) return st;
	if (tls != NULL && tls[0] != 0) {
		st = ucp_config_modify(cfg, "TLS", tls);
		if (st != UCS_OK) { ucp_config_release(cfg); return st; }
	}
	ucp_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
	p.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
	p.mt_workers_shared = 1; // workers of several Transports, and NewHostBuffer, share it
	st = ucp_init(&p, cfg, ctx);
	ucp_config_release(cfg);
	return st;
}

// UCX allocates len bytes and maps them: *addr is where.
static ucs_status_t hmc_mem_alloc(ucp_context_h ctx, size_t len, ucp_mem_h *memh, void **addr) {
	ucp_mem_map_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
	p.length = len;
	p.flags = UCP_MEM_MAP_ALLOCATE;
	ucs_status_t st = ucp_mem_map(ctx, &p, memh);
	if (st != UCS_OK) return st;
	ucp_mem_attr_t a;
	memset(&a, 0, sizeof a);
	a.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
	st = ucp_mem_query(*memh, &a);
	if (st == UCS_OK && (a.address == NULL || a.length < len)) st = UCS_ERR_NO_MEMORY;
	if (st != UCS_OK) { ucp_mem_unmap(ctx, *memh); return st; }
	*addr = a.address;
	return UCS_OK;
}
*/
import "C"

import (
	"fmt"
	"os"
	"sync"
	"unsafe"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/status"
)

// ucpContext is a ucp context shared by every worker of this process that asks for the same
// transports (UCX's advice: one context per process, a worker per thread of progress). Sharing
// it lets memory UCX allocated for a ConnBuffer (NewHostBuffer) be served by any Transport with
// those transports without registering it again.
type ucpContext struct {
	key    string
	ctx    C.ucp_context_h
	refs   int                    // workers and buffers using it; guarded by ctxMu
	allocs map[uintptr]*hostAlloc // NewHostBuffer's memory by base address; guarded by ctxMu
}

// hostAlloc is memory UCX allocated in a context.
type hostAlloc struct {
	memh C.ucp_mem_h
	size uintptr
}

var (
	ctxMu    sync.Mutex
	contexts = map[string]*ucpContext{} // guarded by ctxMu
)

// contextKey names the context cfg's transports use: Config.TLS, else UCX_TLS as it is now
// (UCX reads it when the context is made).
func contextKey(cfg Config) string {
	if cfg.TLS != "" {
		return "tls=" + cfg.TLS
	}
	return "env=" + os.Getenv("UCX_TLS")
}

// openContext returns the shared context for cfg, made on first use; release undoes it.
func openContext(cfg Config) (*ucpContext, error) {
	key := contextKey(cfg)
	ctxMu.Lock()
	defer ctxMu.Unlock()
	if c := contexts[key]; c != nil {
		c.refs++
		return c, nil
	}
	var tls *C.char
	if cfg.TLS != "" {
		tls = C.CString(cfg.TLS)
		defer C.free(unsafe.Pointer(tls))
	}
	c := &ucpContext{key: key, refs: 1, allocs: make(map[uintptr]*hostAlloc)}
	if st := C.hmc_ucp_init(tls, &c.ctx); st != C.UCS_OK {
		return nil, ucsErr("init (UCX_TLS="+cfg.TLS+")", st)
	}
	contexts[key] = c
	return c, nil
}

// release drops one use of c; the last one cleans the context up.
func (c *ucpContext) release() {
	ctxMu.Lock()
	defer ctxMu.Unlock()
	if c.refs--; c.refs == 0 {
		delete(contexts, c.key)
		C.ucp_cleanup(c.ctx)
	}
}

// allocated returns the handle of the memory UCX allocated in c that holds all of b, if any.
func (c *ucpContext) allocated(b []byte) (C.ucp_mem_h, bool) {
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	ctxMu.Lock()
	defer ctxMu.Unlock()
	for base, a := range c.allocs {
		if p >= base && p-base+uintptr(len(b)) <= a.size {
			return a.memh, true
		}
	}
	return nil, false
}

// NewHostBuffer returns a zeroed ConnBuffer of size bytes of host memory that UCX allocated
// (ucp_mem_map with UCP_MEM_MAP_ALLOCATE), in the context shared by the Transports made with
// cfg's transports (same Config.TLS, or the same UCX_TLS when it is empty). Served by such a
// Transport, the memory is what UCX's shared-memory transports (posix, sysv) can map into an
// initiator on the same host: its puts and gets become plain copies, as in ucx_perftest, where
// memory UCX did not allocate takes cma or messages the target must answer. Other transports
// register it like any memory. It has no memfd, so HMC's SHM transport cannot serve it. Close
// the Communicators that use it before the buffer.
func NewHostBuffer(size uint64, cfg Config) (*buffer.ConnBuffer, error) {
	if size == 0 || size > 1<<62 {
		return nil, fmt.Errorf("ucx: host buffer of %d bytes: %w", size, status.ErrInvalidConfig)
	}
	c, err := openContext(cfg)
	if err != nil {
		return nil, err
	}
	var memh C.ucp_mem_h
	var p unsafe.Pointer
	if st := C.hmc_mem_alloc(c.ctx, C.size_t(size), &memh, &p); st != C.UCS_OK {
		c.release()
		return nil, ucsErr(fmt.Sprintf("allocating %d bytes", size), st)
	}
	b := unsafe.Slice((*byte)(p), size)
	clear(b) // UCX may hand out reused heap memory
	base := uintptr(p)
	ctxMu.Lock()
	c.allocs[base] = &hostAlloc{memh: memh, size: uintptr(size)}
	ctxMu.Unlock()
	release := func() error {
		ctxMu.Lock()
		delete(c.allocs, base)
		ctxMu.Unlock()
		C.ucp_mem_unmap(c.ctx, memh)
		c.release()
		return nil
	}
	buf, err := buffer.Adopt(b, release)
	if err != nil {
		_ = release()
		return nil, err
	}
	return buf, nil
}
