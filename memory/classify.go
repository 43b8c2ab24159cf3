package memory

import (
	"fmt"
	"sync/atomic"
	"time"

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
	cuPointerAttributeRangeStart    = 11
	cuPointerAttributeRangeSize     = 12
	cuMemoryTypeHost                = 1
	cuMemoryTypeDevice              = 2
	cuMemoryTypeUnified             = 4
)

// Classify says what the address p points to, as Locate does: device is the device ordinal
// for device and managed memory. An address no driver knows is Host.
func Classify(p Ptr) (k Kind, device int, err error) {
	pl, err := Locate(p)
	return pl.Kind, pl.Device, err
}

// MayHoldDevice says whether this process can hold device memory at all (it has loaded the
// CUDA driver, or emulates a GPU): when it cannot, every address is host memory and a caller
// checking many (a batch's sources) need not Classify each.
func MayHoldDevice() bool { return emulating() || cudaLoaded() || hipLoaded() }

// cudaLoaded says whether the process has loaded the CUDA driver, hipLoaded the HIP runtime.
func cudaLoaded() bool { return cudaLib.loaded() }
func hipLoaded() bool  { return hipLib.loaded() }

var (
	cudaLib = libWatch{names: []string{"libcuda.so.1", "libcuda.so"}}
	hipLib  = libWatch{names: []string{"libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"}}
)

// libWatch says whether the process has loaded a library. Asking the dynamic loader costs tens
// of microseconds (it searches the library path), too much per transfer: a "loaded" answer is
// kept for good (a driver is never unloaded), a "not loaded" one for 50 ms, far less than a
// driver takes to initialise and hand out its first allocation.
type libWatch struct {
	names    []string
	seen     atomic.Bool
	nextLook atomic.Int64 // unix ns before which "not loaded" stands
}

func (w *libWatch) loaded() bool {
	if w.seen.Load() {
		return true
	}
	now := time.Now().UnixNano()
	if now < w.nextLook.Load() {
		return false
	}
	if loadedAlready(w.names...) {
		w.seen.Store(true)
		return true
	}
	w.nextLook.Store(now + int64(50*time.Millisecond))
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
			return nil, fmt.Errorf("memory: [%#x, +%d) is %v memory of device %d, not host memory: %w", uintptr(p), n, k, dev, status.ErrUnsupported)
		}
	}
	return HostSlice(p, n), nil
}
