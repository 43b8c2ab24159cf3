package memory

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/hmc-go/hmc/status"
)

// EmulateGPUEnv is the environment variable (HMC_EMULATE_GPU=1) with which cmd/hmc, the C
// library and test processes turn SetEmulateGPU on; this package does not read it.
const EmulateGPUEnv = "HMC_EMULATE_GPU"

var emulate atomic.Bool

// SetEmulateGPU turns on (or off) the emulation of NVIDIA_GPU memory in host memory where no
// CUDA device is present. It exists so that the device paths (classification, staging rings,
// IPC between processes, stream ordering) run on machines without a GPU; it is never chosen
// unless asked for. It returns the previous setting.
//
// The emulation is strict where it matters: an emulated device address is a range the host
// cannot touch (mapped PROT_NONE, so dereferencing it faults as a real device address would),
// and its bytes live in a memfd mapped elsewhere, reached only through this package's copies
// (Copy, Memory's copy methods). Another process opens it through an IPC handle carrying the
// memfd (ExportIPC, OpenIPC), as CUDA's IPC handles carry an allocation.
func SetEmulateGPU(on bool) (was bool) { return emulate.Swap(on) }

func emulating() bool { return emulate.Load() }

// emuAlloc is one emulated device allocation: addresses [base, base+size) (a PROT_NONE
// reservation) whose bytes are backing (a shared mapping of fd).
type emuAlloc struct {
	base    Ptr
	size    uint64
	shadow  []byte // the PROT_NONE reservation at base, page-rounded
	backing []byte // the bytes, page-rounded
	fd      int
	opened  bool // mapped from another process's handle (OpenIPC)
}

// emulatedRanges are the emulation's allocations, so that Locate knows them as device memory,
// as the driver knows real ones, and copies find their bytes.
type emulatedRanges struct {
	mu sync.Mutex
	m  map[Ptr]*emuAlloc // base -> allocation
}

var emulated = emulatedRanges{m: map[Ptr]*emuAlloc{}}

func (e *emulatedRanges) add(a *emuAlloc) {
	e.mu.Lock()
	e.m[a.base] = a
	e.mu.Unlock()
}

func (e *emulatedRanges) remove(p Ptr) *emuAlloc {
	e.mu.Lock()
	defer e.mu.Unlock()
	a := e.m[p]
	delete(e.m, p)
	return a
}

// find returns the allocation holding p, or nil.
func (e *emulatedRanges) find(p Ptr) *emuAlloc {
	e.mu.Lock()
	defer e.mu.Unlock()
	for s, a := range e.m {
		if p >= s && uint64(p-s) < a.size {
			return a
		}
	}
	return nil
}

func (e *emulatedRanges) contains(p Ptr) bool { return e.find(p) != nil }

// view returns the host bytes behind n emulated device bytes at p.
func (e *emulatedRanges) view(p Ptr, n uint64) ([]byte, error) {
	a := e.find(p)
	if a == nil {
		return nil, fmt.Errorf("memory: %#x is not emulated device memory: %w", uintptr(p), status.ErrInvalidConfig)
	}
	off := uint64(p - a.base)
	if n > a.size-off {
		return nil, fmt.Errorf("memory: [%#x, +%d) runs past its emulated allocation [%#x, +%d): %w",
			uintptr(p), n, uintptr(a.base), a.size, status.ErrOutOfRange)
	}
	return a.backing[off : off+n : off+n], nil
}

// mapEmulated maps size bytes of memfd fd as an emulated allocation.
func mapEmulated(fd int, size uint64, opened bool) (*emuAlloc, error) {
	page := uint64(os.Getpagesize())
	mapped := int((size + page - 1) &^ (page - 1))
	backing, err := unix.Mmap(fd, 0, mapped, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("memory: emulated device mapping of %d bytes: %w: %w", size, status.ErrFailed, err)
	}
	shadow, err := unix.Mmap(-1, 0, mapped, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		_ = unix.Munmap(backing)
		return nil, fmt.Errorf("memory: emulated device address range of %d bytes: %w: %w", size, status.ErrFailed, err)
	}
	a := &emuAlloc{base: Ptr(unsafe.Pointer(unsafe.SliceData(shadow))), size: size, shadow: shadow, backing: backing, fd: -1, opened: opened}
	emulated.add(a)
	return a, nil
}

func (a *emuAlloc) unmap() error {
	err := unix.Munmap(a.backing)
	if serr := unix.Munmap(a.shadow); err == nil {
		err = serr
	}
	if a.fd >= 0 {
		if cerr := unix.Close(a.fd); err == nil {
			err = cerr
		}
	}
	return err
}

// emulatedBackend is "device" memory that is really a memfd the host reaches only through the
// copies, which the CPU does.
type emulatedBackend struct{}

func (emulatedBackend) alloc(size uint64) (*Buffer, error) {
	fd, err := unix.MemfdCreate("hmc-emulated-gpu", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memory: emulated device alloc: %w: %w", status.ErrFailed, err)
	}
	page := uint64(os.Getpagesize())
	if err := unix.Ftruncate(fd, int64((size+page-1)&^(page-1))); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("memory: emulated device alloc of %d bytes: %w: %w", size, status.ErrFailed, err)
	}
	a, err := mapEmulated(fd, size, false)
	if err != nil {
		_ = unix.Close(fd)
		return nil, err
	}
	a.fd = fd
	return &Buffer{ptr: a.base, size: size, fd: -1}, nil
}

func (emulatedBackend) free(b *Buffer) error {
	a := emulated.remove(b.ptr)
	if a == nil {
		return fmt.Errorf("memory: emulated free of %#x: not allocated: %w", uintptr(b.ptr), status.ErrInvalidConfig)
	}
	return a.unmap()
}

func (emulatedBackend) copyHostToDevice(dst Ptr, src []byte) error {
	v, err := emulated.view(dst, uint64(len(src)))
	if err != nil {
		return err
	}
	copy(v, src)
	return nil
}

func (emulatedBackend) copyDeviceToHost(dst []byte, src Ptr) error {
	v, err := emulated.view(src, uint64(len(dst)))
	if err != nil {
		return err
	}
	copy(dst, v)
	return nil
}

func (emulatedBackend) copyDeviceToDevice(dst, src Ptr, n uint64) error {
	d, err := emulated.view(dst, n)
	if err != nil {
		return err
	}
	s, err := emulated.view(src, n)
	if err != nil {
		return err
	}
	copy(d, s)
	return nil
}

// pinHost has nothing to lock: the emulated device copies with the CPU. It succeeds, so that the
// callers' pinned paths (and their unpinning) run in tests.
func (emulatedBackend) pinHost([]byte) (func() error, error) { return func() error { return nil }, nil }

func (emulatedBackend) close() error { return nil }

// emuStream is an emulated device stream: work queued on it runs in order on its own
// goroutine, late (emuStreamDelay), so that a transfer that does not wait for the stream reads
// the bytes from before the work, as it would on a busy GPU.
type emuStream struct {
	work chan func()
	idle sync.WaitGroup
}

// emuStreamDelay is how long emulated stream work waits before it runs.
const emuStreamDelay = 20 * time.Millisecond

var emuStreams = struct {
	sync.Mutex
	m    map[uintptr]*emuStream
	next uintptr
}{m: map[uintptr]*emuStream{}, next: 0xe5000}

func newEmuStream() uintptr {
	s := &emuStream{work: make(chan func(), 64)}
	go func() { // owned by the stream: ends when destroyEmuStream closes work
		for f := range s.work {
			time.Sleep(emuStreamDelay)
			f()
			s.idle.Done()
		}
	}()
	emuStreams.Lock()
	defer emuStreams.Unlock()
	emuStreams.next += 0x10
	emuStreams.m[emuStreams.next] = s
	return emuStreams.next
}

func emuStreamOf(h uintptr) *emuStream {
	emuStreams.Lock()
	defer emuStreams.Unlock()
	return emuStreams.m[h]
}

func (s *emuStream) enqueue(f func()) {
	s.idle.Add(1)
	s.work <- f
}

func (s *emuStream) sync() { s.idle.Wait() }

func destroyEmuStream(h uintptr) bool {
	emuStreams.Lock()
	s := emuStreams.m[h]
	delete(emuStreams.m, h)
	emuStreams.Unlock()
	if s == nil {
		return false
	}
	s.sync()
	close(s.work)
	return true
}
