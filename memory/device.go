package memory

import (
	"fmt"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/hmc-go/hmc/status"
)

// Place is where an address lives, as the driver that owns it says: its Kind, the device
// ordinal for device and managed memory, and the Vendor whose driver moves it (CPU for memory
// no driver knows; NvidiaGPU also for the GPU emulation's memory).
type Place struct {
	Kind   Kind
	Device int
	Vendor Type
	emu    bool // the GPU emulation's memory
}

// HostPlace is the Place of memory no device driver knows.
var HostPlace = Place{Kind: Host, Vendor: CPU}

// OnDevice says whether the host cannot address memory at p directly (device memory).
func (p Place) OnDevice() bool { return !p.Kind.HostAddressable() }

// String describes the place ("host", "device 1 (NVIDIA_GPU)").
func (p Place) String() string {
	switch p.Kind {
	case Host:
		return "host"
	case PinnedHost:
		return fmt.Sprintf("pinned host (%v)", p.Vendor)
	}
	s := fmt.Sprintf("%v %d (%v)", p.Kind, p.Device, p.Vendor)
	if p.emu {
		s += ", emulated"
	}
	return s
}

// Locate says where the address p lives, asking the drivers this process has loaded (CUDA's
// cuPointerGetAttribute, HIP's hipPointerGetAttributes) and the GPU emulation. A process that
// never loaded a driver gets HostPlace without one being loaded (which would break it in children
// it forks).
func Locate(p Ptr) (Place, error) {
	if emulating() {
		if emulated.contains(p) {
			return Place{Kind: Device, Vendor: NvidiaGPU, emu: true}, nil
		}
	}
	if cudaLoaded() {
		if pl, ok, err := locateCUDA(p); ok || err != nil {
			return pl, err
		}
	}
	if hipLoaded() {
		if pl, ok, err := locateHIP(p); ok || err != nil {
			return pl, err
		}
	}
	return HostPlace, nil
}

// LocateRange is Locate for the n bytes at p: both ends must lie in the same place (a range
// that starts in host memory and ends in a device allocation is refused).
func LocateRange(p Ptr, n uint64) (Place, error) {
	first, err := Locate(p)
	if err != nil || n <= 1 {
		return first, err
	}
	if first.Vendor == NvidiaGPU && !first.emu {
		// The driver knows the allocation's bounds: a range running past its end may end in the
		// next allocation of the same device, which looks alike but is another buffer.
		if base, size, ok := cudaRange(p); ok {
			if uint64(p-base) > size || n > size-uint64(p-base) {
				return first, fmt.Errorf("memory: [%#x, +%d) starts in %v memory and ends in memory past that allocation [%#x, +%d): %w",
					uintptr(p), n, first, uintptr(base), size, status.ErrInvalidConfig)
			}
			return first, nil
		}
	}
	last, err := Locate(p + Ptr(n-1))
	if err != nil {
		return first, err
	}
	if last != first {
		return first, fmt.Errorf("memory: [%#x, +%d) starts in %v memory and ends in %v memory: %w", uintptr(p), n, first, last, status.ErrInvalidConfig)
	}
	return first, nil
}

// cudaRange returns the base and size of the CUDA allocation holding p, or ok false when the
// driver does not say.
func cudaRange(p Ptr) (base Ptr, size uint64, ok bool) {
	a, err := loadCUDA()
	if err != nil || a.cuPointerGetAttribute == nil {
		return 0, 0, false
	}
	var b, n uint64
	if a.cuPointerGetAttribute(unsafe.Pointer(&b), cuPointerAttributeRangeStart, uint64(p)) != 0 ||
		a.cuPointerGetAttribute(unsafe.Pointer(&n), cuPointerAttributeRangeSize, uint64(p)) != 0 || n == 0 {
		return 0, 0, false
	}
	return Ptr(b), n, true
}

func locateCUDA(p Ptr) (Place, bool, error) {
	a, lerr := loadCUDA()
	if lerr != nil || a.cuPointerGetAttribute == nil {
		return Place{}, false, nil
	}
	var mt uint32
	switch r := a.cuPointerGetAttribute(unsafe.Pointer(&mt), cuPointerAttributeMemoryType, uint64(p)); r {
	case 0:
	case 1: // CUDA_ERROR_INVALID_VALUE: an address CUDA does not know
		return Place{}, false, nil
	default:
		return Place{}, false, fmt.Errorf("memory: classifying %#x: %w", uintptr(p), a.check("cuPointerGetAttribute", r))
	}
	var managed uint32
	_ = a.cuPointerGetAttribute(unsafe.Pointer(&managed), cuPointerAttributeIsManaged, uint64(p))
	var ord int32
	_ = a.cuPointerGetAttribute(unsafe.Pointer(&ord), cuPointerAttributeDeviceOrdinal, uint64(p))
	switch {
	case managed != 0 || mt == cuMemoryTypeUnified:
		return Place{Kind: Managed, Device: int(ord), Vendor: NvidiaGPU}, true, nil
	case mt == cuMemoryTypeDevice:
		return Place{Kind: Device, Device: int(ord), Vendor: NvidiaGPU}, true, nil
	case mt == cuMemoryTypeHost:
		return Place{Kind: PinnedHost, Device: int(ord), Vendor: NvidiaGPU}, true, nil
	}
	return Place{}, false, fmt.Errorf("memory: %#x is CUDA memory of type %d: %w", uintptr(p), mt, status.ErrUnsupported)
}

// Copy copies n bytes from src to dst, each of which may be host memory or device memory of
// any device (the drivers' unified addressing), and returns when the bytes are at dst.
// Device copies run on the device's legacy default stream: work the caller queued before on
// that stream or on any blocking stream of the device is finished first; work on
// non-blocking streams is not (synchronise those, or hand the stream to SyncStream, before).
func Copy(dst, src Ptr, n uint64) error {
	dp, err := LocateRange(dst, n)
	if err != nil {
		return err
	}
	sp, err := LocateRange(src, n)
	if err != nil {
		return err
	}
	return CopyPlaced(dst, dp, src, sp, n)
}

// CopyPlaced is Copy for addresses whose places the caller already knows.
func CopyPlaced(dst Ptr, dp Place, src Ptr, sp Place, n uint64) error {
	if n == 0 {
		return nil
	}
	if dst == 0 || src == 0 {
		return fmt.Errorf("memory: copy of %d bytes with a null address: %w", n, status.ErrInvalidConfig)
	}
	if dp.emu || sp.emu || (!dp.OnDevice() && !sp.OnDevice() && dp.Kind != Managed && sp.Kind != Managed) {
		d, err := hostView(dst, dp, n)
		if err != nil {
			return err
		}
		s, err := hostView(src, sp, n)
		if err != nil {
			return err
		}
		copy(d, s)
		return nil
	}
	dev, vendor := sp.Device, sp.Vendor
	if dp.OnDevice() || sp.Vendor == CPU {
		dev, vendor = dp.Device, dp.Vendor
	}
	switch vendor {
	case NvidiaGPU:
		c, err := cudaDevice(dev)
		if err != nil {
			return err
		}
		if (dp.Kind == Device) != (sp.Kind == Device) && dp.Kind != Managed && sp.Kind != Managed {
			// Between host and device memory: on the copy stream, waiting for this copy's own
			// event. A synchronization of the legacy stream would also wait for every copy that
			// other goroutines (the lanes of a transfer) queued meanwhile.
			if wait, ok, err := c.copyAsync(dst, src, n); ok {
				if err != nil {
					return err
				}
				return wait()
			}
		}
		return c.do("cuMemcpyAsync", func() int32 {
			if r := c.api.cuMemcpyAsync(uint64(dst), uint64(src), n, 0); r != 0 {
				return r
			}
			return c.api.cuStreamSynchronize(0)
		})
	case AMDGPU:
		h, err := hipDevice(dev)
		if err != nil {
			return err
		}
		return h.do("hipMemcpy", func() int32 { return h.api.hipMemcpy(devPtr(dst), devPtr(src), n, hipMemcpyDefault) })
	}
	return fmt.Errorf("memory: copy between %v and %v memory: %w", sp, dp, status.ErrUnsupported)
}

// CopyAsync starts the copy of n bytes from src (at sp) to dst (at dp) and returns wait, which
// blocks until the bytes have landed or the copy failed; it must be called once. A copy between
// host and device memory of a CUDA device runs on a stream of that device (ordered with the
// legacy default stream, as Copy is) and is marked by an event: a caller may start several and
// wait for each in turn, so that the driver's fixed cost of a copy (about 14 µs on an H100)
// overlaps the copies before it. Host memory must stay valid until wait returns, and be
// page-locked (AllocStagingFor) for the copy to run while CopyAsync returns. Every other copy
// (host to host, HIP, the GPU emulation) is done when CopyAsync returns.
func CopyAsync(dst Ptr, dp Place, src Ptr, sp Place, n uint64) (wait func() error, err error) {
	dev := dp.Device
	if sp.Kind == Device {
		dev = sp.Device
	}
	cuda := !dp.emu && !sp.emu && n > 0 && dst != 0 && src != 0 &&
		((dp.Kind == Device && dp.Vendor == NvidiaGPU && !sp.OnDevice()) ||
			(sp.Kind == Device && sp.Vendor == NvidiaGPU && !dp.OnDevice()))
	if cuda {
		c, err := cudaDevice(dev)
		if err != nil {
			return nil, err
		}
		if wait, ok, err := c.copyAsync(dst, src, n); ok {
			return wait, err
		}
	}
	if err := CopyPlaced(dst, dp, src, sp, n); err != nil {
		return nil, err
	}
	return done, nil
}

func done() error { return nil }

// hostView returns the host bytes of n bytes at p: the memory itself, or an emulated
// allocation's bytes.
func hostView(p Ptr, pl Place, n uint64) ([]byte, error) {
	if pl.emu {
		return emulated.view(p, n)
	}
	return HostSlice(p, n), nil
}

// cudaDevice returns the backend of CUDA device dev (its primary context, retained once for
// the life of the process).
func cudaDevice(dev int) (*cudaBackend, error) {
	cudaDevs.Lock()
	defer cudaDevs.Unlock()
	if c := cudaDevs.m[dev]; c != nil {
		return c, nil
	}
	be, err := newCUDABackend(dev)
	if err != nil {
		return nil, err
	}
	c := be.(*cudaBackend)
	if c.api.cuMemcpyAsync == nil {
		return nil, fmt.Errorf("cuda: %w: the driver lacks cuMemcpyAsync/cuStreamSynchronize", status.ErrUnsupported)
	}
	cudaDevs.m[dev] = c
	return c, nil
}

var cudaDevs = struct {
	sync.Mutex
	m map[int]*cudaBackend
}{m: map[int]*cudaBackend{}}

// hipDevice returns the backend of HIP device dev.
func hipDevice(dev int) (*hipBackend, error) {
	be, err := newHIPBackend(dev)
	if err != nil {
		return nil, err
	}
	return be.(*hipBackend), nil
}

// IPCHandle names a device allocation for another process on the same host: CUDA's or HIP's
// 64-byte IPC handle, or the GPU emulation's memfd. Offset is where the exported address lies
// in the allocation.
type IPCHandle struct {
	Vendor Type
	Device int      // the exporter's device ordinal
	Raw    [64]byte // the driver's handle (CUDA, HIP)
	FD     int      // the emulation's memfd (a duplicate the holder closes), else -1
	Size   uint64   // the allocation's size
	Offset uint64
	// Base is the allocation's address in the exporting process, PID that process's id (as the
	// kernel vouches for it: SO_PEERCRED). A handle opened in its own process is the memory
	// itself: CUDA refuses to open it there.
	Base uint64
	PID  int
}

// Emulated says whether h is the GPU emulation's (its memory travels as FD).
func (h IPCHandle) Emulated() bool { return h.FD >= 0 }

// ExportIPC returns the handle of the device allocation holding p (at pl, from Locate), for
// OpenIPC in another process of this host. An emulated handle's FD is a duplicate the caller
// closes once it is sent.
func ExportIPC(p Ptr, pl Place) (IPCHandle, error) {
	h := IPCHandle{Vendor: pl.Vendor, Device: pl.Device, FD: -1}
	switch {
	case pl.emu:
		a := emulated.find(p)
		if a == nil || a.fd < 0 {
			return h, fmt.Errorf("memory: exporting %#x: not an emulated allocation of this process: %w", uintptr(p), status.ErrInvalidConfig)
		}
		fd, err := unix.FcntlInt(uintptr(a.fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return h, fmt.Errorf("memory: exporting %#x: %w: %w", uintptr(p), status.ErrFailed, err)
		}
		h.FD, h.Size, h.Offset, h.Base, h.PID = fd, a.size, uint64(p-a.base), uint64(a.base), os.Getpid()
		return h, nil
	case pl.Kind != Device:
		return h, fmt.Errorf("memory: exporting %#x: %v memory has no IPC handle: %w", uintptr(p), pl, status.ErrUnsupported)
	case pl.Vendor == NvidiaGPU:
		c, err := cudaDevice(pl.Device)
		if err != nil {
			return h, err
		}
		if c.api.cuIpcGetMemHandle == nil {
			return h, fmt.Errorf("cuda: %w: the driver lacks CUDA IPC", status.ErrUnsupported)
		}
		var base, size uint64
		err = c.do("cuMemGetAddressRange", func() int32 { return c.api.cuMemGetAddressRange(&base, &size, uint64(p)) })
		if err == nil {
			err = c.do("cuIpcGetMemHandle", func() int32 { return c.api.cuIpcGetMemHandle(&h.Raw, base) })
		}
		if err != nil {
			return h, fmt.Errorf("memory: exporting %#x (allocations made with cuMemCreate or PyTorch's expandable segments have no legacy IPC handle): %w", uintptr(p), err)
		}
		h.Size, h.Offset, h.Base, h.PID = size, uint64(p)-base, base, os.Getpid()
		return h, nil
	case pl.Vendor == AMDGPU:
		d, err := hipDevice(pl.Device)
		if err != nil {
			return h, err
		}
		if d.api.hipIpcGetMemHandle == nil {
			return h, fmt.Errorf("hip: %w: the runtime lacks HIP IPC", status.ErrUnsupported)
		}
		var base uintptr
		var size uint64
		err = d.do("hipMemGetAddressRange", func() int32 { return d.api.hipMemGetAddressRange(&base, &size, devPtr(p)) })
		if err == nil {
			err = d.do("hipIpcGetMemHandle", func() int32 { return d.api.hipIpcGetMemHandle(&h.Raw, base) })
		}
		if err != nil {
			return h, fmt.Errorf("memory: exporting %#x: %w", uintptr(p), err)
		}
		h.Size, h.Offset, h.Base, h.PID = size, uint64(p)-uint64(base), uint64(base), os.Getpid()
		return h, nil
	}
	return h, fmt.Errorf("memory: exporting %v memory: %w", pl, status.ErrUnsupported)
}

// OpenIPC maps the allocation h names (exported by another process of this host) here and
// returns the address of its exported byte, its Place here, and close, which unmaps it. A
// handle opened twice is mapped once, and unmapped by the last close.
func OpenIPC(h IPCHandle) (p Ptr, pl Place, closeFn func() error, err error) {
	if h.PID == os.Getpid() && h.Base != 0 { // our own memory: it is here already
		p = Ptr(h.Base + h.Offset)
		if pl, err = Locate(p); err != nil {
			return 0, Place{}, nil, err
		}
		if !pl.OnDevice() {
			return 0, Place{}, nil, fmt.Errorf("memory: IPC handle of this process names %#x, which is %v memory, not device memory: %w", uintptr(p), pl, status.ErrProtocol)
		}
		return p, pl, func() error { return nil }, nil
	}
	if h.Emulated() {
		if !emulating() {
			return 0, Place{}, nil, fmt.Errorf("memory: an emulated GPU's IPC handle in a process that does not emulate one (set %s=1): %w", EmulateGPUEnv, status.ErrUnsupported)
		}
		if h.Offset >= h.Size {
			return 0, Place{}, nil, fmt.Errorf("memory: IPC handle offset %d in a %d-byte allocation: %w", h.Offset, h.Size, status.ErrProtocol)
		}
		a, err := mapEmulated(h.FD, h.Size, true)
		if err != nil {
			return 0, Place{}, nil, err
		}
		closeFn = sync.OnceValue(func() error {
			emulated.remove(a.base)
			return a.unmap()
		})
		return a.base + Ptr(h.Offset), Place{Kind: Device, Vendor: NvidiaGPU, emu: true}, closeFn, nil
	}
	key := ipcKey{h.Vendor, h.Raw}
	ipcOpen.Lock()
	defer ipcOpen.Unlock()
	if o := ipcOpen.m[key]; o != nil {
		o.refs++
		return o.base + Ptr(h.Offset), o.place, o.closer(key), nil
	}
	o := &ipcMapping{}
	switch h.Vendor {
	case NvidiaGPU:
		dev := h.Device
		if n, _ := cudaDeviceCount(); dev >= n {
			dev = 0 // another numbering (CUDA_VISIBLE_DEVICES): the first device maps it, with peer access
		}
		c, err := cudaDevice(dev)
		if err != nil {
			return 0, Place{}, nil, err
		}
		if c.api.cuIpcOpenMemHandle == nil {
			return 0, Place{}, nil, fmt.Errorf("cuda: %w: the driver lacks CUDA IPC", status.ErrUnsupported)
		}
		var d uint64
		const lazyPeerAccess = 1 // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
		if err := c.do("cuIpcOpenMemHandle", func() int32 { return c.api.cuIpcOpenMemHandle(&d, cuIpcMemHandle{h.Raw}, lazyPeerAccess) }); err != nil {
			return 0, Place{}, nil, err
		}
		o.base, o.place = Ptr(d), Place{Kind: Device, Device: dev, Vendor: NvidiaGPU}
		o.release = func() error { return c.do("cuIpcCloseMemHandle", func() int32 { return c.api.cuIpcCloseMemHandle(d) }) }
	case AMDGPU:
		d, err := hipDevice(h.Device)
		if err != nil {
			return 0, Place{}, nil, err
		}
		if d.api.hipIpcOpenMemHandle == nil {
			return 0, Place{}, nil, fmt.Errorf("hip: %w: the runtime lacks HIP IPC", status.ErrUnsupported)
		}
		var base uintptr
		if err := d.do("hipIpcOpenMemHandle", func() int32 { return d.api.hipIpcOpenMemHandle(&base, hipIpcMemHandle{h.Raw}, 1) }); err != nil {
			return 0, Place{}, nil, err
		}
		o.base, o.place = Ptr(base), Place{Kind: Device, Device: h.Device, Vendor: AMDGPU}
		o.release = func() error {
			return d.do("hipIpcCloseMemHandle", func() int32 { return d.api.hipIpcCloseMemHandle(base) })
		}
	default:
		return 0, Place{}, nil, fmt.Errorf("memory: IPC handle of %v memory: %w", h.Vendor, status.ErrUnsupported)
	}
	o.refs = 1
	ipcOpen.m[key] = o
	return o.base + Ptr(h.Offset), o.place, o.closer(key), nil
}

type ipcKey struct {
	vendor Type
	raw    [64]byte
}

// ipcMapping is a driver IPC handle opened in this process, shared by its openers.
type ipcMapping struct {
	base    Ptr
	place   Place
	refs    int
	release func() error
}

var ipcOpen = struct {
	sync.Mutex
	m map[ipcKey]*ipcMapping
}{m: map[ipcKey]*ipcMapping{}}

func (o *ipcMapping) closer(key ipcKey) func() error {
	return sync.OnceValue(func() error {
		ipcOpen.Lock()
		o.refs--
		last := o.refs == 0
		if last {
			delete(ipcOpen.m, key)
		}
		ipcOpen.Unlock()
		if last {
			return o.release()
		}
		return nil
	})
}

// cuIpcMemHandle is CUDA's CUipcMemHandle, passed by value.
type cuIpcMemHandle struct{ Reserved [64]byte }

// hipIpcMemHandle is HIP's hipIpcMemHandle_t, passed by value.
type hipIpcMemHandle struct{ Reserved [64]byte }

// SyncStream waits until the work queued on stream (a CUstream or hipStream_t of the device
// at pl; an emulated stream from NewStream) has finished. Stream 0 is the legacy default
// stream. pl may be host memory: the stream is then taken as CUDA's when this process has
// loaded CUDA (HIP's when it has loaded HIP), on the first device.
func SyncStream(stream uintptr, pl Place) error {
	if s := emuStreamOf(stream); s != nil {
		s.sync()
		return nil
	}
	if pl.emu {
		return nil // the emulation's copies are synchronous; stream 0 has nothing queued
	}
	if pl.Vendor == CPU {
		switch {
		case cudaLoaded():
			pl = Place{Kind: Device, Vendor: NvidiaGPU}
		case hipLoaded():
			pl = Place{Kind: Device, Vendor: AMDGPU}
		case stream != 0:
			return fmt.Errorf("memory: stream %#x: no device driver is loaded in this process, so it is no stream: %w", stream, status.ErrInvalidConfig)
		}
	}
	switch pl.Vendor {
	case NvidiaGPU:
		c, err := cudaDevice(pl.Device)
		if err != nil {
			return err
		}
		return c.do("cuStreamSynchronize", func() int32 { return c.api.cuStreamSynchronize(stream) })
	case AMDGPU:
		d, err := hipDevice(pl.Device)
		if err != nil {
			return err
		}
		if d.api.hipStreamSynchronize == nil {
			return fmt.Errorf("hip: %w: the runtime lacks hipStreamSynchronize", status.ErrUnsupported)
		}
		return d.do("hipStreamSynchronize", func() int32 { return d.api.hipStreamSynchronize(stream) })
	}
	return nil // host memory: no device work orders it
}

// NewStream creates a non-blocking stream on device dev of type t (an emulated one under the
// GPU emulation), for callers without a framework of their own (the C library's tests, the
// GPU check). Destroy it with DestroyStream.
func NewStream(t Type, dev int) (uintptr, error) {
	if t == NvidiaGPU && emulating() {
		if _, err := cudaDeviceCount(); err != nil {
			return newEmuStream(), nil
		}
	}
	if t != NvidiaGPU {
		return 0, fmt.Errorf("memory: streams of %v: %w", t, status.ErrUnsupported)
	}
	c, err := cudaDevice(dev)
	if err != nil {
		return 0, err
	}
	var s uintptr
	const nonBlocking = 1 // CU_STREAM_NON_BLOCKING
	if err := c.do("cuStreamCreate", func() int32 { return c.api.cuStreamCreate(&s, nonBlocking) }); err != nil {
		return 0, err
	}
	return s, nil
}

// DestroyStream destroys a stream of NewStream, after its work.
func DestroyStream(stream uintptr, pl Place) error {
	if destroyEmuStream(stream) {
		return nil
	}
	c, err := cudaDevice(pl.Device)
	if err != nil {
		return err
	}
	return c.do("cuStreamDestroy", func() int32 { return c.api.cuStreamDestroy(stream) })
}

// MemsetAsync queues setting n bytes at the device address p (at pl) to v on stream, and
// returns at once: the bytes change when the stream reaches the work.
func MemsetAsync(p Ptr, pl Place, v byte, n uint64, stream uintptr) error {
	if s := emuStreamOf(stream); s != nil {
		b, err := emulated.view(p, n)
		if err != nil {
			return err
		}
		s.enqueue(func() {
			for i := range b {
				b[i] = v
			}
		})
		return nil
	}
	if pl.Vendor != NvidiaGPU || pl.emu {
		return fmt.Errorf("memory: memset on %v memory with stream %#x: %w", pl, stream, status.ErrUnsupported)
	}
	c, err := cudaDevice(pl.Device)
	if err != nil {
		return err
	}
	return c.do("cuMemsetD8Async", func() int32 { return c.api.cuMemsetD8Async(uint64(p), v, n, stream) })
}

// AllocStagingFor returns size bytes of host memory for staging copies to and from memory at
// pl: page-locked for a CUDA device (cuMemHostAlloc, portable), ordinary memory elsewhere.
// free releases it.
func AllocStagingFor(pl Place, size uint64) (b []byte, free func() error, err error) {
	if size == 0 {
		return nil, nil, fmt.Errorf("memory: staging of 0 bytes: %w", status.ErrInvalidConfig)
	}
	if pl.Vendor == NvidiaGPU && !pl.emu {
		c, err := cudaDevice(pl.Device)
		if err != nil {
			return nil, nil, err
		}
		return c.allocStaging(size)
	}
	return make([]byte, size), func() error { return nil }, nil
}

// PinHostFor page-locks host memory b for copies with the device at pl (cuMemHostRegister,
// portable), as Memory.PinHost does for a Memory's device: copies between b and the device then
// run at the rate of page-locked memory. unpin must be called before b is unmapped. Memory of
// other vendors, and the emulation's, is not locked (ErrUnsupported; the copies still work).
func PinHostFor(pl Place, b []byte) (unpin func() error, err error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("memory: pin of 0 bytes: %w", status.ErrInvalidConfig)
	}
	if pl.Vendor != NvidiaGPU || pl.emu {
		return nil, fmt.Errorf("memory: page-locking host memory for %v memory: %w", pl, status.ErrUnsupported)
	}
	c, err := cudaDevice(pl.Device)
	if err != nil {
		return nil, err
	}
	return c.pinHost(b)
}
