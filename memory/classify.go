package memory

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/hmc-go/hmc/status"
)

// Kind is what an address points to, as the device driver classifies it.
type Kind int

// The kinds. Host is pageable host memory (the driver does not know the address); PinnedHost is
// host memory the driver has page-locked (cuMemHostAlloc, cuMemHostRegister); Device is device
// memory (Classify gives its ordinal); Managed is unified memory, addressable from the host.
const (
	Host Kind = iota
	PinnedHost
	Device
	Managed
)

// String names the kind.
func (k Kind) String() string {
	switch k {
	case Host:
		return "host"
	case PinnedHost:
		return "pinned host"
	case Device:
		return "device"
	case Managed:
		return "managed"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// HostAddressable says whether the host may read and write memory of kind k.
func (k Kind) HostAddressable() bool { return k != Device }

// CUDA's pointer attributes (CUpointer_attribute) and memory types (CUmemorytype).
const (
	cuPointerAttributeMemoryType    = 2
	cuPointerAttributeIsManaged     = 8
	cuPointerAttributeDeviceOrdinal = 9
	cuMemoryTypeHost                = 1
	cuMemoryTypeDevice              = 2
	cuMemoryTypeUnified             = 4
)

// Classify says what the address p points to, asking the CUDA driver (cuPointerGetAttribute)
// when this process has loaded it — only then can CUDA memory exist here, and a process that
// never used CUDA does not initialise it (which would break CUDA in children it forks) — and the
// GPU emulation for its own allocations; device is the device ordinal for Device and Managed
// memory. An address no driver knows is Host. HIP addresses are
// not classified yet (ROCm's attribute layout differs between releases, and no AMD device has
// been lent to test one): with HIP, register host memory only.
func Classify(p Ptr) (k Kind, device int, err error) {
	if emulating() {
		if emulated.contains(p) {
			return Device, 0, nil
		}
	}
	if !cudaLoaded() {
		return Host, 0, nil // the process has not used CUDA: nothing can be CUDA memory
	}
	a, lerr := loadCUDA()
	if lerr != nil || a.cuPointerGetAttribute == nil {
		return Host, 0, nil // a driver without the entry point: nothing to ask
	}
	var mt uint32
	switch r := a.cuPointerGetAttribute(unsafe.Pointer(&mt), cuPointerAttributeMemoryType, uint64(p)); r {
	case 0:
	case 1: // CUDA_ERROR_INVALID_VALUE: an address CUDA does not know
		return Host, 0, nil
	default:
		return Host, 0, fmt.Errorf("memory: classifying %#x: %w", uintptr(p), a.check("cuPointerGetAttribute", r))
	}
	var managed uint32
	_ = a.cuPointerGetAttribute(unsafe.Pointer(&managed), cuPointerAttributeIsManaged, uint64(p))
	var ord int32
	_ = a.cuPointerGetAttribute(unsafe.Pointer(&ord), cuPointerAttributeDeviceOrdinal, uint64(p))
	switch {
	case managed != 0 || mt == cuMemoryTypeUnified:
		return Managed, int(ord), nil
	case mt == cuMemoryTypeDevice:
		return Device, int(ord), nil
	case mt == cuMemoryTypeHost:
		return PinnedHost, int(ord), nil
	}
	return Host, 0, fmt.Errorf("memory: %#x is CUDA memory of type %d: %w", uintptr(p), mt, status.ErrUnsupported)
}

// MayHoldDevice says whether this process can hold device memory at all (it has loaded the
// CUDA driver, or emulates a GPU): when it cannot, every address is host memory and a caller
// checking many (a batch's sources) need not Classify each.
func MayHoldDevice() bool { return emulating() || cudaLoaded() }

// cudaLoaded says whether the process has loaded the CUDA driver. Asking the dynamic loader
// costs tens of microseconds (it searches the library path), too much per transfer: a "loaded"
// answer is kept for good (a driver is never unloaded), a "not loaded" one for 50 ms, far less
// than the driver takes to initialise and hand out its first allocation.
func cudaLoaded() bool {
	if cudaSeen.Load() {
		return true
	}
	now := time.Now().UnixNano()
	if now < cudaNextLook.Load() {
		return false
	}
	if loadedAlready("libcuda.so.1", "libcuda.so") {
		cudaSeen.Store(true)
		return true
	}
	cudaNextLook.Store(now + int64(50*time.Millisecond))
	return false
}

var (
	cudaSeen     atomic.Bool
	cudaNextLook atomic.Int64 // unix ns before which "not loaded" stands
)

// emulatedRanges are the GPU emulation's allocations, so that Classify knows them as device
// memory, as the driver knows real ones.
type emulatedRanges struct {
	mu sync.Mutex
	m  map[Ptr]uint64 // start -> size
}

var emulated = emulatedRanges{m: map[Ptr]uint64{}}

func (e *emulatedRanges) add(p Ptr, n uint64) {
	e.mu.Lock()
	e.m[p] = n
	e.mu.Unlock()
}

func (e *emulatedRanges) remove(p Ptr) {
	e.mu.Lock()
	delete(e.m, p)
	e.mu.Unlock()
}

func (e *emulatedRanges) contains(p Ptr) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for s, n := range e.m {
		if p >= s && uint64(p-s) < n {
			return true
		}
	}
	return false
}

// HostRange returns the n bytes at p as a slice after checking, with Classify, that the host may
// address them: device memory is refused (ErrUnsupported, naming the device), where using it as
// host memory would crash the process or read garbage.
func HostRange(p Ptr, n uint64) ([]byte, error) {
	for _, q := range []Ptr{p, p + Ptr(max(n, 1)-1)} {
		k, dev, err := Classify(q)
		if err != nil {
			return nil, err
		}
		if !k.HostAddressable() {
			return nil, fmt.Errorf("memory: [%#x, +%d) is %v memory of device %d, not host memory: registering device memory "+
				"for transfers is not supported yet: %w", uintptr(p), n, k, dev, status.ErrUnsupported)
		}
	}
	return HostSlice(p, n), nil
}
