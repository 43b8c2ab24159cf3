//go:build ucx && cgo

package ucx

/*
#include "hmc_ucx.h"
*/
import "C"

import (
	"fmt"
	"os"
	"strings"
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

// Malloc thresholds set for UCX's sake (tuneMalloc).
const (
	mallocMmapThreshold = 32 << 20  // glibc's largest dynamic mmap threshold
	mallocTrimThreshold = 128 << 20 // freed heap kept up to this much above the last use
)

var mallocOnce sync.Once

// tuneMalloc sets glibc's mmap and trim thresholds once per process, before the first UCX
// context. UCX assembles each multi-fragment active message (a PUTV of up to 2 MiB, a GETV's
// answer of up to 512 KiB) in a buffer it mallocs and frees per message; with glibc's defaults
// every such buffer came from fresh pages, mapped or trimmed away again on free, and was
// faulted in 4 KiB at a time (perf: 160,000-310,000 page faults in one 6 s run of `hmc trans
// bench --protocol ucx` over tcp, about 43,000 with these thresholds, most of those the
// bench's own buffers' first touch; 64 KiB write batches 1.37-1.63 -> 1.72-1.91 GB/s, 4 KiB
// reads 1.03-2.12 -> 2.09-2.22, three interleaved rounds). Both thresholds are needed: setting
// either turns off glibc's adjustment of the other. A process whose environment already sets
// malloc tunables (GLIBC_TUNABLES with glibc.malloc., MALLOC_MMAP_THRESHOLD_,
// MALLOC_TRIM_THRESHOLD_) keeps its own, and HMC_UCX_MALLOC=default leaves glibc's defaults.
func tuneMalloc() {
	mallocOnce.Do(func() {
		if tuneMallocHere(os.Getenv) {
			C.hmc_tune_malloc(mallocMmapThreshold, mallocTrimThreshold)
		}
	})
}

// tuneMallocHere says whether tuneMalloc sets the thresholds in an environment read by getenv.
func tuneMallocHere(getenv func(string) string) bool {
	return getenv("HMC_UCX_MALLOC") != "default" && !strings.Contains(getenv("GLIBC_TUNABLES"), "glibc.malloc.") &&
		getenv("MALLOC_MMAP_THRESHOLD_") == "" && getenv("MALLOC_TRIM_THRESHOLD_") == ""
}

// mallocMapped says whether a malloc of n bytes is served by its own mapping (glibc's count
// of mapped chunks grows), for the tests.
func mallocMapped(n int) bool { return C.hmc_malloc_mapped(C.size_t(n)) == 1 }

// openContext returns the shared context for cfg, made on first use; release undoes it.
func openContext(cfg Config) (*ucpContext, error) {
	tuneMalloc()
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
