package memory

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"github.com/hmc-go/hmc/status"
)

// cudaAPI is the subset of the CUDA driver API (libcuda.so.1) that HMC uses. The driver API is
// used rather than the runtime (libcudart) because it ships with the driver itself: no toolkit
// needs to be installed.
type cudaAPI struct {
	cuInit                    func(flags uint32) int32
	cuDeviceGetCount          func(count *int32) int32
	cuDeviceGet               func(dev *int32, ordinal int32) int32
	cuDevicePrimaryCtxRetain  func(ctx *uintptr, dev int32) int32
	cuDevicePrimaryCtxRelease func(dev int32) int32
	cuCtxSetCurrent           func(ctx uintptr) int32
	cuMemAlloc                func(dptr *uint64, size uint64) int32
	cuMemFree                 func(dptr uint64) int32
	cuMemcpyHtoD              func(dst uint64, src unsafe.Pointer, n uint64) int32
	cuMemcpyDtoH              func(dst unsafe.Pointer, src uint64, n uint64) int32
	cuMemcpyDtoD              func(dst, src uint64, n uint64) int32
	cuGetErrorString          func(res int32, str *uintptr) int32
	cuMemHostAlloc            func(p *uintptr, size uint64, flags uint32) int32
	cuMemFreeHost             func(p uintptr) int32
	cuMemHostRegister         func(p uintptr, size uint64, flags uint32) int32
	cuMemHostUnregister       func(p uintptr) int32
	cuPointerGetAttribute     func(data unsafe.Pointer, attribute int32, ptr uint64) int32

	// Optional: bound when the driver has them (every driver of the last decade does); the
	// paths that need them say so when one is missing.
	cuMemcpyAsync        func(dst, src uint64, n uint64, stream uintptr) int32
	cuStreamSynchronize  func(stream uintptr) int32
	cuStreamCreate       func(stream *uintptr, flags uint32) int32
	cuStreamDestroy      func(stream uintptr) int32
	cuMemsetD8Async      func(dst uint64, v byte, n uint64, stream uintptr) int32
	cuMemGetAddressRange func(base, size *uint64, p uint64) int32
	cuIpcGetMemHandle    func(h *[64]byte, p uint64) int32
	cuIpcOpenMemHandle   func(p *uint64, h cuIpcMemHandle, flags uint32) int32
	cuIpcCloseMemHandle  func(p uint64) int32
	cuEventCreate        func(ev *uintptr, flags uint32) int32
	cuEventRecord        func(ev, stream uintptr) int32
	cuEventSynchronize   func(ev uintptr) int32
	cuEventDestroy       func(ev uintptr) int32
}

// loadCUDA loads the driver once per process: the library is process-global by nature.
var loadCUDA = sync.OnceValues(func() (*cudaAPI, error) {
	h, err := dlopenFirst("cuda", "libcuda.so.1", "libcuda.so")
	if err != nil {
		return nil, err
	}
	a := &cudaAPI{}
	if err := bindAll("cuda", h, []symbol{
		{"cuInit", &a.cuInit},
		{"cuDeviceGetCount", &a.cuDeviceGetCount},
		{"cuDeviceGet", &a.cuDeviceGet},
		{"cuDevicePrimaryCtxRetain", &a.cuDevicePrimaryCtxRetain},
		{"cuDevicePrimaryCtxRelease_v2", &a.cuDevicePrimaryCtxRelease},
		{"cuCtxSetCurrent", &a.cuCtxSetCurrent},
		{"cuMemAlloc_v2", &a.cuMemAlloc},
		{"cuMemFree_v2", &a.cuMemFree},
		{"cuMemcpyHtoD_v2", &a.cuMemcpyHtoD},
		{"cuMemcpyDtoH_v2", &a.cuMemcpyDtoH},
		{"cuMemcpyDtoD_v2", &a.cuMemcpyDtoD},
		{"cuGetErrorString", &a.cuGetErrorString},
		{"cuMemHostAlloc", &a.cuMemHostAlloc},
		{"cuMemFreeHost", &a.cuMemFreeHost},
		{"cuMemHostRegister_v2", &a.cuMemHostRegister},
		{"cuMemHostUnregister", &a.cuMemHostUnregister},
		{"cuPointerGetAttribute", &a.cuPointerGetAttribute},
	}); err != nil {
		return nil, err
	}
	bindOptional(h, []symbol{
		{"cuMemcpyAsync", &a.cuMemcpyAsync},
		{"cuStreamSynchronize", &a.cuStreamSynchronize},
		{"cuStreamCreate", &a.cuStreamCreate},
		{"cuStreamDestroy_v2", &a.cuStreamDestroy},
		{"cuMemsetD8Async", &a.cuMemsetD8Async},
		{"cuMemGetAddressRange_v2", &a.cuMemGetAddressRange},
		{"cuIpcGetMemHandle", &a.cuIpcGetMemHandle},
		{"cuIpcOpenMemHandle_v2", &a.cuIpcOpenMemHandle},
		{"cuIpcCloseMemHandle", &a.cuIpcCloseMemHandle},
		{"cuEventCreate", &a.cuEventCreate},
		{"cuEventRecord", &a.cuEventRecord},
		{"cuEventSynchronize", &a.cuEventSynchronize},
		{"cuEventDestroy_v2", &a.cuEventDestroy},
	})
	if a.cuIpcOpenMemHandle == nil {
		bindOptional(h, []symbol{{"cuIpcOpenMemHandle", &a.cuIpcOpenMemHandle}})
	}
	if a.cuStreamSynchronize == nil {
		a.cuMemcpyAsync = nil // Copy needs both
	}
	if r := a.cuInit(0); r != 0 {
		return nil, fmt.Errorf("cuda: %w: cuInit: %s", status.ErrUnsupported, a.errString(r))
	}
	return a, nil
})

func (a *cudaAPI) errString(r int32) string {
	var p uintptr
	if a.cuGetErrorString(r, &p) != 0 || p == 0 {
		return fmt.Sprintf("CUresult %d", r)
	}
	return fmt.Sprintf("%s (CUresult %d)", goString(p), r)
}

func (a *cudaAPI) check(op string, r int32) error {
	if r == 0 {
		return nil
	}
	return fmt.Errorf("cuda: %s: %w: %s", op, status.ErrFailed, a.errString(r))
}

func cudaDeviceCount() (int, error) {
	a, err := loadCUDA()
	if err != nil {
		return 0, err
	}
	var n int32
	if r := a.cuDeviceGetCount(&n); r != 0 {
		return 0, fmt.Errorf("cuda: %w: cuDeviceGetCount: %s", status.ErrUnsupported, a.errString(r))
	}
	if n == 0 {
		return 0, fmt.Errorf("cuda: %w: %w: libcuda loaded but reports 0 devices", status.ErrUnsupported, errNoDevice)
	}
	return int(n), nil
}

// cudaBackend is device memory of one CUDA device, used through the device's primary context
// (the one the CUDA runtime and PyTorch also use, so pointers are interchangeable).
type cudaBackend struct {
	api *cudaAPI
	dev int32
	ctx uintptr

	// CopyAsync's stream (made on first use) and the events that mark its copies' ends.
	streamMu sync.Mutex
	stream   uintptr
	events   chan uintptr
}

func newCUDABackend(deviceID int) (backend, error) {
	n, err := cudaDeviceCount()
	if err != nil {
		return nil, err
	}
	if deviceID >= n {
		return nil, fmt.Errorf("cuda: device %d of %d: %w", deviceID, n, status.ErrInvalidConfig)
	}
	a, _ := loadCUDA()
	b := &cudaBackend{api: a}
	if err := a.check("cuDeviceGet", a.cuDeviceGet(&b.dev, int32(deviceID))); err != nil {
		return nil, err
	}
	if err := a.check("cuDevicePrimaryCtxRetain", a.cuDevicePrimaryCtxRetain(&b.ctx, b.dev)); err != nil {
		return nil, err
	}
	return b, nil
}

// do runs f with this device's context current on the calling OS thread. CUDA contexts are
// per thread and goroutines migrate, so the thread is locked for the duration of the call.
func (c *cudaBackend) do(op string, f func() int32) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := c.api.check("cuCtxSetCurrent", c.api.cuCtxSetCurrent(c.ctx)); err != nil {
		return err
	}
	return c.api.check(op, f())
}

func (c *cudaBackend) alloc(size uint64) (*Buffer, error) {
	var p uint64
	if err := c.do("cuMemAlloc", func() int32 { return c.api.cuMemAlloc(&p, size) }); err != nil {
		return nil, err
	}
	return &Buffer{ptr: Ptr(p), size: size, fd: -1}, nil
}

func (c *cudaBackend) free(b *Buffer) error {
	return c.do("cuMemFree", func() int32 { return c.api.cuMemFree(uint64(b.ptr)) })
}

func (c *cudaBackend) copyHostToDevice(dst Ptr, src []byte) error {
	return c.do("cuMemcpyHtoD", func() int32 {
		r := c.api.cuMemcpyHtoD(uint64(dst), hostPtr(src), uint64(len(src)))
		runtime.KeepAlive(src)
		return r
	})
}

func (c *cudaBackend) copyDeviceToHost(dst []byte, src Ptr) error {
	return c.do("cuMemcpyDtoH", func() int32 {
		r := c.api.cuMemcpyDtoH(hostPtr(dst), uint64(src), uint64(len(dst)))
		runtime.KeepAlive(dst)
		return r
	})
}

func (c *cudaBackend) copyDeviceToDevice(dst, src Ptr, n uint64) error {
	return c.do("cuMemcpyDtoD", func() int32 { return c.api.cuMemcpyDtoD(uint64(dst), uint64(src), n) })
}

// allocStaging allocates page-locked host memory (portable across contexts), for staging rings.
func (c *cudaBackend) allocStaging(size uint64) ([]byte, func() error, error) {
	var p uintptr
	const portable = 0x01 // CU_MEMHOSTALLOC_PORTABLE
	if err := c.do("cuMemHostAlloc", func() int32 { return c.api.cuMemHostAlloc(&p, size, portable) }); err != nil {
		return nil, nil, err
	}
	free := func() error { return c.do("cuMemFreeHost", func() int32 { return c.api.cuMemFreeHost(p) }) }
	return HostSlice(Ptr(p), size), free, nil
}

// pinHost page-locks existing host memory (cuMemHostRegister, portable across contexts).
func (c *cudaBackend) pinHost(b []byte) (func() error, error) {
	p := uintptr(hostPtr(b))
	const portable = 0x01 // CU_MEMHOSTREGISTER_PORTABLE
	if err := c.do("cuMemHostRegister", func() int32 { return c.api.cuMemHostRegister(p, uint64(len(b)), portable) }); err != nil {
		return nil, err
	}
	return func() error { return c.do("cuMemHostUnregister", func() int32 { return c.api.cuMemHostUnregister(p) }) }, nil
}

func (c *cudaBackend) close() error {
	// Memory.Close holds every copy off: the copy stream is idle and its events unused.
	c.streamMu.Lock()
	if c.stream != 0 {
		_ = c.do("cuStreamDestroy", func() int32 {
			for len(c.events) > 0 {
				if ev := <-c.events; c.api.cuEventDestroy != nil {
					_ = c.api.cuEventDestroy(ev)
				}
			}
			if c.api.cuStreamDestroy != nil {
				return c.api.cuStreamDestroy(c.stream)
			}
			return 0
		})
		c.stream = 0
	}
	c.streamMu.Unlock()
	return c.api.check("cuDevicePrimaryCtxRelease", c.api.cuDevicePrimaryCtxRelease(c.dev))
}

// cuEventDisableTiming is CU_EVENT_DISABLE_TIMING: an event that only marks completion.
const cuEventDisableTiming = 2

// copyAsync starts a copy on the device's copy stream and returns the wait for its end, or
// ok false when the driver lacks streams or events (the caller copies synchronously).
func (c *cudaBackend) copyAsync(dst, src Ptr, n uint64) (wait func() error, ok bool, err error) {
	a := c.api
	if a.cuStreamCreate == nil || a.cuEventCreate == nil || a.cuEventRecord == nil || a.cuEventSynchronize == nil || a.cuMemcpyAsync == nil {
		return nil, false, nil
	}
	var ev uintptr
	err = c.do("cuMemcpyAsync", func() int32 {
		c.streamMu.Lock()
		if c.stream == 0 {
			// A blocking stream (flags 0): ordered with the legacy default stream, as Copy is.
			if r := a.cuStreamCreate(&c.stream, 0); r != 0 {
				c.streamMu.Unlock()
				return r
			}
			c.events = make(chan uintptr, 256)
		}
		stream := c.stream
		c.streamMu.Unlock()
		select {
		case ev = <-c.events:
		default:
			if r := a.cuEventCreate(&ev, cuEventDisableTiming); r != 0 {
				return r
			}
		}
		if r := a.cuMemcpyAsync(uint64(dst), uint64(src), n, stream); r != 0 {
			c.putEvent(ev)
			return r
		}
		if r := a.cuEventRecord(ev, stream); r != 0 {
			// The copy is queued but unmarked: wait for the whole stream instead.
			c.putEvent(ev)
			ev = 0
			return a.cuStreamSynchronize(stream)
		}
		return 0
	})
	if err != nil {
		return nil, true, err
	}
	if ev == 0 {
		return func() error { return nil }, true, nil
	}
	return func() error {
		err := c.do("cuEventSynchronize", func() int32 { return a.cuEventSynchronize(ev) })
		c.putEvent(ev)
		return err
	}, true, nil
}

// putEvent keeps ev for the next copy, or destroys it when enough are kept.
func (c *cudaBackend) putEvent(ev uintptr) {
	select {
	case c.events <- ev:
	default:
		if c.api.cuEventDestroy != nil {
			_ = c.do("cuEventDestroy", func() int32 { return c.api.cuEventDestroy(ev) })
		}
	}
}
