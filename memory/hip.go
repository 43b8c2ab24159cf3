package memory

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"github.com/hmc-go/hmc/status"
)

// HIP memcpy kinds (hipMemcpyKind). Upstream HMC passes these swapped for H2D and D2H.
const (
	hipMemcpyHostToDevice   = 1
	hipMemcpyDeviceToHost   = 2
	hipMemcpyDeviceToDevice = 3
	hipMemcpyDefault        = 4 // direction from the addresses (unified addressing)
)

// hipAPI is the subset of the HIP runtime (libamdhip64.so) that HMC uses.
type hipAPI struct {
	hipInit           func(flags uint32) int32
	hipGetDeviceCount func(count *int32) int32
	hipSetDevice      func(dev int32) int32
	hipMalloc         func(p *uintptr, size uint64) int32
	hipFree           func(p uintptr) int32
	hipMemcpy         func(dst, src unsafe.Pointer, n uint64, kind int32) int32
	hipGetErrorString func(err int32) uintptr

	// Optional (bound when the runtime has them).
	hipRuntimeGetVersion    func(v *int32) int32
	hipPointerGetAttributes func(attr *[64]byte, p uintptr) int32
	hipMemGetAddressRange   func(base *uintptr, size *uint64, p unsafe.Pointer) int32
	hipIpcGetMemHandle      func(h *[64]byte, p uintptr) int32
	hipIpcOpenMemHandle     func(p *uintptr, h hipIpcMemHandle, flags uint32) int32
	hipIpcCloseMemHandle    func(p uintptr) int32
	hipStreamSynchronize    func(s uintptr) int32
}

var loadHIP = sync.OnceValues(func() (*hipAPI, error) {
	h, err := dlopenFirst("hip", "libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5")
	if err != nil {
		return nil, err
	}
	a := &hipAPI{}
	if err := bindAll("hip", h, []symbol{
		{"hipInit", &a.hipInit},
		{"hipGetDeviceCount", &a.hipGetDeviceCount},
		{"hipSetDevice", &a.hipSetDevice},
		{"hipMalloc", &a.hipMalloc},
		{"hipFree", &a.hipFree},
		{"hipMemcpy", &a.hipMemcpy},
		{"hipGetErrorString", &a.hipGetErrorString},
	}); err != nil {
		return nil, err
	}
	bindOptional(h, []symbol{
		{"hipRuntimeGetVersion", &a.hipRuntimeGetVersion},
		{"hipPointerGetAttributes", &a.hipPointerGetAttributes},
		{"hipMemGetAddressRange", &a.hipMemGetAddressRange},
		{"hipIpcGetMemHandle", &a.hipIpcGetMemHandle},
		{"hipIpcOpenMemHandle", &a.hipIpcOpenMemHandle},
		{"hipIpcCloseMemHandle", &a.hipIpcCloseMemHandle},
		{"hipStreamSynchronize", &a.hipStreamSynchronize},
	})
	if r := a.hipInit(0); r != 0 {
		return nil, fmt.Errorf("hip: %w: hipInit: %s", status.ErrUnsupported, a.errString(r))
	}
	return a, nil
})

func (a *hipAPI) errString(r int32) string {
	return fmt.Sprintf("%s (hipError %d)", goString(a.hipGetErrorString(r)), r)
}

func (a *hipAPI) check(op string, r int32) error {
	if r == 0 {
		return nil
	}
	return fmt.Errorf("hip: %s: %w: %s", op, status.ErrFailed, a.errString(r))
}

func hipDeviceCount() (int, error) {
	a, err := loadHIP()
	if err != nil {
		return 0, err
	}
	var n int32
	if r := a.hipGetDeviceCount(&n); r != 0 {
		return 0, fmt.Errorf("hip: %w: hipGetDeviceCount: %s", status.ErrUnsupported, a.errString(r))
	}
	if n == 0 {
		return 0, fmt.Errorf("hip: %w: %w: libamdhip64 loaded but reports 0 devices", status.ErrUnsupported, errNoDevice)
	}
	return int(n), nil
}

// hipBackend is device memory of one HIP device. The device is made current on the calling
// OS thread for every call (upstream ignores device_id).
type hipBackend struct {
	api *hipAPI
	dev int32
}

func newHIPBackend(deviceID int) (backend, error) {
	n, err := hipDeviceCount()
	if err != nil {
		return nil, err
	}
	if deviceID >= n {
		return nil, fmt.Errorf("hip: device %d of %d: %w", deviceID, n, status.ErrInvalidConfig)
	}
	a, _ := loadHIP()
	return &hipBackend{api: a, dev: int32(deviceID)}, nil
}

func (h *hipBackend) do(op string, f func() int32) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := h.api.check("hipSetDevice", h.api.hipSetDevice(h.dev)); err != nil {
		return err
	}
	return h.api.check(op, f())
}

func (h *hipBackend) alloc(size uint64) (*Buffer, error) {
	var p uintptr
	if err := h.do("hipMalloc", func() int32 { return h.api.hipMalloc(&p, size) }); err != nil {
		return nil, err
	}
	return &Buffer{ptr: Ptr(p), size: size, fd: -1}, nil
}

func (h *hipBackend) free(b *Buffer) error {
	return h.do("hipFree", func() int32 { return h.api.hipFree(uintptr(b.ptr)) })
}

func devPtr(p Ptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&p)) }

func (h *hipBackend) copyHostToDevice(dst Ptr, src []byte) error {
	return h.do("hipMemcpy(H2D)", func() int32 {
		r := h.api.hipMemcpy(devPtr(dst), hostPtr(src), uint64(len(src)), hipMemcpyHostToDevice)
		runtime.KeepAlive(src)
		return r
	})
}

func (h *hipBackend) copyDeviceToHost(dst []byte, src Ptr) error {
	return h.do("hipMemcpy(D2H)", func() int32 {
		r := h.api.hipMemcpy(hostPtr(dst), devPtr(src), uint64(len(dst)), hipMemcpyDeviceToHost)
		runtime.KeepAlive(dst)
		return r
	})
}

func (h *hipBackend) copyDeviceToDevice(dst, src Ptr, n uint64) error {
	return h.do("hipMemcpy(D2D)", func() int32 {
		return h.api.hipMemcpy(devPtr(dst), devPtr(src), n, hipMemcpyDeviceToDevice)
	})
}

func (h *hipBackend) close() error { return nil }

// locateHIP asks hipPointerGetAttributes where p lives. The attribute struct starts with the
// memory type and the device ordinal in every ROCm release (isManaged at byte 24), but the type's
// numbering changed in ROCm 6 (to CUDA's): the runtime's version picks it.
func locateHIP(p Ptr) (Place, bool, error) {
	a, err := loadHIP()
	if err != nil || a.hipPointerGetAttributes == nil {
		return Place{}, false, nil
	}
	var attr [64]byte
	switch r := a.hipPointerGetAttributes(&attr, uintptr(p)); r {
	case 0:
	case 1: // hipErrorInvalidValue: memory HIP does not know (ROCm 5)
		return Place{}, false, nil
	default:
		return Place{}, false, fmt.Errorf("memory: classifying %#x: %w", uintptr(p), a.check("hipPointerGetAttributes", r))
	}
	typ := *(*int32)(unsafe.Pointer(&attr[0]))
	dev := int(*(*int32)(unsafe.Pointer(&attr[4])))
	managed := *(*int32)(unsafe.Pointer(&attr[24])) != 0
	var ver int32
	if a.hipRuntimeGetVersion != nil {
		_ = a.hipRuntimeGetVersion(&ver)
	}
	host, device, unified := int32(0), int32(1), []int32{3, 4} // ROCm 5: Host, Device, Array, Unified, Managed
	if ver >= 60000000 {
		if typ == 0 { // hipMemoryTypeUnregistered
			return Place{}, false, nil
		}
		host, device, unified = 1, 2, []int32{3, 11} // ROCm 6: Unregistered, Host, Device, Managed, ..., Unified
	}
	switch {
	case managed || typ == unified[0] || typ == unified[1]:
		return Place{Kind: Managed, Device: dev, Vendor: AMDGPU}, true, nil
	case typ == device:
		return Place{Kind: Device, Device: dev, Vendor: AMDGPU}, true, nil
	case typ == host:
		return Place{Kind: PinnedHost, Device: dev, Vendor: AMDGPU}, true, nil
	}
	return Place{}, false, fmt.Errorf("memory: %#x is HIP memory of type %d: %w", uintptr(p), typ, status.ErrUnsupported)
}
