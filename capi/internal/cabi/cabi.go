//go:build cgo

// Package cabi is what every part of libhmc.so shares at the C edge: the thread-local
// last-error string, turning a Go error into a status code (and a panic into ERROR, never
// unwinding into C), timeouts as contexts, C memory as slices, and the table of opaque handles.
// It also exports the library-wide functions (hmc_last_error, hmc_status_string,
// hmc_debug_stacks). The exports of each face live in their own package beside it
// (capi/internal/hmcapi, capi/internal/storeapi); capi links them into one c-shared library,
// one Go runtime per process.
package cabi

/*
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// Per-thread error strings live in memory a pthread key owns, not in __thread arrays: Go's
// runtime makes the library need static TLS, and a library that is dlopen()ed (MemCache does
// so with libmf_smem.so) gets only glibc's small static surplus: 2 KiB of arrays did not fit.
#include <pthread.h>

typedef struct { char err[1024]; char taken[1024]; } hmc_tls;

static pthread_key_t hmc_key;
static pthread_once_t hmc_once = PTHREAD_ONCE_INIT;

static void hmc_key_init(void) { pthread_key_create(&hmc_key, free); }

static hmc_tls *hmc_slot(void) {
	pthread_once(&hmc_once, hmc_key_init);
	hmc_tls *t = pthread_getspecific(hmc_key);
	if (t == NULL) {
		t = calloc(1, sizeof *t);
		if (t == NULL) {
			static hmc_tls oom; // shared, but only when memory is out
			return &oom;
		}
		pthread_setspecific(hmc_key, t);
	}
	return t;
}

static void hmc_set_error(const char *msg) {
	hmc_tls *t = hmc_slot();
	strncpy(t->err, msg, sizeof t->err - 1);
	t->err[sizeof t->err - 1] = 0;
}

static const char *hmc_get_error(void) { return hmc_slot()->err; }

static const char *hmc_take_error(void) {
	hmc_tls *t = hmc_slot();
	memcpy(t->taken, t->err, sizeof t->err);
	t->err[0] = 0;
	return t->taken;
}
*/
import "C"

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
)

// Call runs f, records its error in the calling thread's last-error string and returns its
// status code. A panic becomes ERROR: it must never unwind into C.
func Call(f func() error) (rc int) {
	defer func() {
		if r := recover(); r != nil {
			SetError(fmt.Sprintf("hmc: internal error: %v", r))
			rc = int(status.Error)
		}
	}()
	if err := f(); err != nil {
		SetError(err.Error())
		return int(status.CodeOf(err))
	}
	return int(status.Success)
}

// LastError returns the calling thread's last-error string (a C string that stays valid until
// the thread's next error), without clearing it.
func LastError() unsafe.Pointer { return unsafe.Pointer(C.hmc_get_error()) }

// TakeError returns the calling thread's last-error string and clears it (the returned C
// string stays valid until the thread's next TakeError).
func TakeError() unsafe.Pointer { return unsafe.Pointer(C.hmc_take_error()) }

// SetError sets the calling thread's last-error string.
func SetError(msg string) {
	cs := C.CString(msg)
	C.hmc_set_error(cs)
	C.free(unsafe.Pointer(cs))
}

// Deadline turns a C timeout in milliseconds into a context: > 0 bounds the call (its timer
// started only if the call waits: lazyDeadline), <= 0 waits without a deadline.
func Deadline(ms int) (context.Context, context.CancelFunc) {
	if ms > 0 {
		l := &lazyDeadline{d: time.Now().Add(time.Duration(ms) * time.Millisecond)}
		return l, l.cancel
	}
	return context.WithCancel(context.Background())
}

// HostBytes views n bytes of the caller's memory at p (nil for n == 0; a null p with n > 0 is
// ErrInvalidConfig).
func HostBytes(p unsafe.Pointer, n uint64) ([]byte, error) {
	if n == 0 {
		return nil, nil
	}
	if p == nil {
		return nil, fmt.Errorf("hmc: null pointer for %d bytes: %w", n, status.ErrInvalidConfig)
	}
	return memory.HostSlice(memory.Ptr(uintptr(p)), n), nil
}

// GoString copies a C string (a *C.char of any package, as an unsafe.Pointer); NULL is "".
func GoString(p unsafe.Pointer) string {
	if p == nil {
		return ""
	}
	return C.GoString((*C.char)(p))
}

// handles maps opaque C handles to Go objects. Handles are never reused within a process, so a
// stale handle is an error, not another object; a handle of the wrong kind is one too.
type handles struct {
	mu   sync.Mutex
	next uint64
	objs map[uint64]any
}

var table = handles{next: 1, objs: make(map[uint64]any)}

// Add gives v a new handle.
func Add(v any) uint64 {
	table.mu.Lock()
	defer table.mu.Unlock()
	id := table.next
	table.next++
	table.objs[id] = v
	return id
}

// Remove forgets handle id.
func Remove(id uint64) {
	table.mu.Lock()
	defer table.mu.Unlock()
	delete(table.objs, id)
}

// Get returns the object behind handle id if it is a T, else ErrInvalidConfig.
func Get[T any](id uint64) (T, error) {
	table.mu.Lock()
	v, ok := table.objs[id]
	table.mu.Unlock()
	t, isT := v.(T)
	if !ok || !isT {
		var zero T
		return zero, fmt.Errorf("hmc: handle %d is not a live %T: %w", id, zero, status.ErrInvalidConfig)
	}
	return t, nil
}

//export hmc_last_error
func hmc_last_error() *C.char { return C.hmc_get_error() }

var statusNames = func() map[status.Code]*C.char {
	m := map[status.Code]*C.char{}
	for c := status.Success; c <= status.NotFound; c++ {
		m[c] = C.CString(c.String()) // kept for the life of the process
	}
	return m
}()

var unknownStatus = C.CString("UNKNOWN")

//export hmc_status_string
func hmc_status_string(code C.int) *C.char {
	if s, ok := statusNames[status.Code(code)]; ok {
		return s
	}
	return unknownStatus
}

// stacksMax bounds the goroutine dump of hmc_debug_stacks.
const stacksMax = 8 << 20

//export hmc_debug_stacks
func hmc_debug_stacks(buf *C.char, n C.uint64_t) C.uint64_t {
	b := make([]byte, stacksMax)
	b = b[:runtime.Stack(b, true)]
	if buf != nil && n > 0 {
		m := min(uint64(n)-1, uint64(len(b)))
		dst := unsafe.Slice((*byte)(unsafe.Pointer(buf)), m+1)
		copy(dst, b[:m])
		dst[m] = 0
	}
	return C.uint64_t(len(b))
}
