package memory

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/hmc-go/hmc/status"
)

// Ptr is an address in some memory: a host virtual address for CPU memory, a device address
// for accelerator memory. It is never dereferenced by code that does not know its type.
type Ptr uintptr

// backend is one kind of memory. Implementations check nothing that Memory already checked
// (sizes non-zero, buffers owned by this Memory).
type backend interface {
	alloc(size uint64) (*Buffer, error)
	free(b *Buffer) error
	copyHostToDevice(dst Ptr, src []byte) error
	copyDeviceToHost(dst []byte, src Ptr) error
	copyDeviceToDevice(dst, src Ptr, n uint64) error
	close() error
}

// Memory allocates and copies memory of one Type on one device. Its methods are safe for
// concurrent use. Upstream's Memory exits the process when a device library is missing; New
// returns an error instead.
type Memory struct {
	typ Type
	dev int
	be  backend

	mu   sync.Mutex
	live map[*Buffer]struct{} // buffers allocated and not yet freed; guarded by mu

	// use is held shared by allocations, copies and page-lock calls and taken by Close, so that
	// Close waits for the device calls in flight and later ones fail with ErrClosed instead of
	// reaching a released device context.
	use    sync.RWMutex
	closed bool // guarded by use
	// queued counts the copies CopyHostToDeviceAsync and CopyDeviceToHostAsync queued whose
	// waits have not returned; Close waits for them.
	queued sync.WaitGroup
}

// using runs f unless the Memory is closed, keeping Close out until it returns.
func (m *Memory) using(op string, f func() error) error {
	m.use.RLock()
	defer m.use.RUnlock()
	if m.closed {
		return fmt.Errorf("memory: %s: %w", op, status.ErrClosed)
	}
	return f()
}

// lease runs acquire unless the Memory is closed, as using does, and returns its release,
// itself refused once the Memory is closed (the device took everything with it).
func (m *Memory) lease(op, releaseOp string, acquire func() (func() error, error)) (func() error, error) {
	var release func() error
	err := m.using(op, func() (err error) {
		release, err = acquire()
		return err
	})
	if err != nil {
		return nil, err
	}
	return func() error { return m.using(releaseOp, release) }, nil
}

// New opens memory of type t on device deviceID. Default resolves to the first available
// accelerator (NVIDIA, then AMD), else CPU. A type whose library or device is missing returns
// an error wrapping status.ErrUnsupported that names what was looked for.
func New(deviceID int, t Type) (*Memory, error) {
	if deviceID < 0 {
		return nil, fmt.Errorf("memory: device id %d: %w", deviceID, status.ErrInvalidConfig)
	}
	if t == Default {
		t = resolveDefault()
	}
	var (
		be  backend
		err error
	)
	switch t {
	case CPU:
		be = hostBackend{}
	case NvidiaGPU:
		be, err = newCUDABackend(deviceID)
		if err != nil && emulating() {
			be, err = emulatedBackend{}, nil
		}
	case AMDGPU:
		be, err = newHIPBackend(deviceID)
	case CambriconMLU, MooreGPU, HuaweiAscendNPU:
		err = fmt.Errorf("memory: %v: %w: no %v back end is implemented in HMC-Go", t, status.ErrUnsupported, t)
	default:
		err = fmt.Errorf("memory: type %d: %w", int(t), status.ErrInvalidConfig)
	}
	if err != nil {
		return nil, err
	}
	return &Memory{typ: t, dev: deviceID, be: be, live: make(map[*Buffer]struct{})}, nil
}

// resolveDefault picks the first accelerator type with a usable device 0, else CPU.
func resolveDefault() Type {
	for _, t := range []Type{NvidiaGPU, AMDGPU} {
		if Probe(t) == nil {
			return t
		}
	}
	return CPU
}

// Probe reports whether memory of type t can be used here: nil if so, else an error wrapping
// status.ErrUnsupported that says why (library not found, no device, not implemented).
func Probe(t Type) error {
	switch t {
	case Default, CPU:
		return nil
	case NvidiaGPU:
		_, err := cudaDeviceCount()
		if err != nil && emulating() {
			return nil
		}
		return err
	case AMDGPU:
		_, err := hipDeviceCount()
		return err
	case CambriconMLU, MooreGPU, HuaweiAscendNPU:
		return fmt.Errorf("%v: %w: not implemented in HMC-Go", t, status.ErrUnsupported)
	}
	return fmt.Errorf("type %d: %w", int(t), status.ErrInvalidConfig)
}

// Type returns the resolved memory type (never Default).
func (m *Memory) Type() Type { return m.typ }

// DeviceID returns the device this Memory allocates on.
func (m *Memory) DeviceID() int { return m.dev }

// Alloc allocates size bytes. Host memory is page-aligned, zeroed and memfd-backed; device
// memory is whatever the driver returns (at least 256-byte aligned on CUDA and HIP).
func (m *Memory) Alloc(size uint64) (*Buffer, error) {
	if size == 0 {
		return nil, fmt.Errorf("memory: alloc of 0 bytes: %w", status.ErrInvalidConfig)
	}
	return m.add("alloc", func() (*Buffer, error) { return m.be.alloc(size) })
}

// add makes the Buffer that get returns one of m's live buffers, unless m is closed.
func (m *Memory) add(op string, get func() (*Buffer, error)) (*Buffer, error) {
	var b *Buffer
	err := m.using(op, func() (err error) {
		m.mu.Lock()
		defer m.mu.Unlock()
		if b, err = get(); err != nil {
			return err
		}
		b.typ, b.dev, b.owner = m.typ, m.dev, m
		m.live[b] = struct{}{}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return b, nil
}

// Adopt makes host memory that another library allocated (UCX, say: see ucx.NewHostBuffer) a
// Buffer of this Memory, which must be CPU memory. The Buffer has no memfd (FD -1). Free, or
// Close, calls release once, which gives the memory back to its allocator; b must stay valid
// until then.
func (m *Memory) Adopt(b []byte, release func() error) (*Buffer, error) {
	if len(b) == 0 || release == nil {
		return nil, fmt.Errorf("memory: adopt of %d bytes (release set: %t): %w", len(b), release != nil, status.ErrInvalidConfig)
	}
	if m.typ != CPU {
		return nil, fmt.Errorf("memory: adopting host memory as %v memory: %w", m.typ, status.ErrInvalidConfig)
	}
	return m.add("adopt", func() (*Buffer, error) {
		return &Buffer{ptr: Ptr(unsafe.Pointer(unsafe.SliceData(b))), size: uint64(len(b)), host: b[:len(b):len(b)], fd: -1,
			release: release}, nil
	})
}

// free gives b back to its allocator: its release for adopted memory, else the backend.
// Caller holds mu.
func (m *Memory) free(b *Buffer) error {
	if b.release != nil {
		err := b.release()
		b.host, b.release = nil, nil
		return err
	}
	return m.be.free(b)
}

// Free releases a buffer allocated by this Memory. Freeing a buffer twice, or one that another
// Memory allocated, returns an error wrapping status.ErrInvalidConfig and changes nothing.
func (m *Memory) Free(b *Buffer) error {
	if b == nil {
		return fmt.Errorf("memory: free of nil buffer: %w", status.ErrInvalidConfig)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.live[b]; !ok {
		return fmt.Errorf("memory: free of a buffer not live in this %v memory: %w", m.typ, status.ErrInvalidConfig)
	}
	delete(m.live, b)
	return m.free(b)
}

// AllocStaging returns size bytes of host memory for staging copies to and from this Memory's
// device: page-locked (cuMemHostAlloc) on CUDA, so device copies run at full speed, ordinary
// memory elsewhere. free releases it.
func (m *Memory) AllocStaging(size uint64) (b []byte, free func() error, err error) {
	if size == 0 {
		return nil, nil, fmt.Errorf("memory: staging of 0 bytes: %w", status.ErrInvalidConfig)
	}
	if s, ok := m.be.(interface {
		allocStaging(uint64) ([]byte, func() error, error)
	}); ok {
		free, err = m.lease("staging alloc", "staging free", func() (f func() error, err error) {
			b, f, err = s.allocStaging(size)
			return f, err
		})
		if err != nil {
			return nil, nil, err
		}
		return b, free, nil
	}
	return make([]byte, size), func() error { return nil }, nil
}

// PinHost page-locks host memory that this package did not allocate (a peer's shared-memory
// mapping, say) for copies to and from this Memory's device, as cuMemHostRegister does: copies
// then run at the rate of page-locked memory, several times that of pageable memory on a PCIe
// GPU. Every page of b becomes resident. unpin releases the lock and must be called before b is
// unmapped. Backends that cannot lock memory (CPU, HIP for now) return ErrUnsupported; callers
// keep working without the lock, only slower.
func (m *Memory) PinHost(b []byte) (unpin func() error, err error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("memory: pin of 0 bytes: %w", status.ErrInvalidConfig)
	}
	if p, ok := m.be.(interface {
		pinHost([]byte) (func() error, error)
	}); ok {
		return m.lease("pin", "unpin", func() (func() error, error) { return p.pinHost(b) })
	}
	return nil, fmt.Errorf("memory: page-locking host memory for %v: %w", m.typ, status.ErrUnsupported)
}

// CopyHostToDevice copies len(src) bytes from host memory to dst in this Memory.
func (m *Memory) CopyHostToDevice(dst Ptr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	if dst == 0 {
		return fmt.Errorf("memory: copy to null: %w", status.ErrInvalidConfig)
	}
	return m.using("copy to device", func() error { return m.be.copyHostToDevice(dst, src) })
}

// CopyDeviceToHost copies len(dst) bytes from src in this Memory to host memory.
func (m *Memory) CopyDeviceToHost(dst []byte, src Ptr) error {
	if len(dst) == 0 {
		return nil
	}
	if src == 0 {
		return fmt.Errorf("memory: copy from null: %w", status.ErrInvalidConfig)
	}
	return m.using("copy from device", func() error { return m.be.copyDeviceToHost(dst, src) })
}

// CopyHostToDeviceAsync starts copying src to dst in this Memory and returns the wait for its
// end, which must be called once (a CUDA device queues the copy, as CopyAsync does; others copy
// before it returns). Close waits for the copies not yet waited for; src stays valid until then.
func (m *Memory) CopyHostToDeviceAsync(dst Ptr, src []byte) (wait func() error, err error) {
	return m.copyAsync("copy to device", len(src) == 0 || dst == 0, func(c *cudaBackend) (func() error, bool, error) {
		return c.copyAsync(dst, Ptr(AddrOf(src)), uint64(len(src)))
	}, func() error { return m.CopyHostToDevice(dst, src) })
}

// CopyDeviceToHostAsync starts copying len(dst) bytes from src in this Memory to dst, as
// CopyHostToDeviceAsync.
func (m *Memory) CopyDeviceToHostAsync(dst []byte, src Ptr) (wait func() error, err error) {
	return m.copyAsync("copy from device", len(dst) == 0 || src == 0, func(c *cudaBackend) (func() error, bool, error) {
		return c.copyAsync(Ptr(AddrOf(dst)), src, uint64(len(dst)))
	}, func() error { return m.CopyDeviceToHost(dst, src) })
}

// copyAsync runs start on a CUDA backend, or else (another backend, an empty or null copy, a
// driver without events) sync. A queued copy is counted in queued until its wait returns, and
// Close waits for the count after taking use: holding use's read lock until the wait instead
// would deadlock a caller that queues a second copy (a second read lock) while Close waits for
// the lock and before it waits for the first.
func (m *Memory) copyAsync(op string, trivial bool, start func(*cudaBackend) (func() error, bool, error), sync func() error) (func() error, error) {
	c, ok := m.be.(*cudaBackend)
	if !ok || trivial {
		if err := sync(); err != nil {
			return nil, err
		}
		return done, nil
	}
	m.use.RLock()
	if m.closed {
		m.use.RUnlock()
		return nil, fmt.Errorf("memory: %s: %w", op, status.ErrClosed)
	}
	wait, ok, err := start(c)
	if !ok || err != nil {
		m.use.RUnlock()
		if err != nil {
			return nil, err
		}
		if err := sync(); err != nil {
			return nil, err
		}
		return done, nil
	}
	m.queued.Add(1) // under the read lock: before Close can wait for the count
	m.use.RUnlock()
	return func() error {
		defer m.queued.Done()
		return wait()
	}, nil
}

// CopyDeviceToDevice copies n bytes between two addresses of this Memory. Overlapping ranges
// are handled as memmove for CPU memory; for devices they follow the driver's memcpy.
func (m *Memory) CopyDeviceToDevice(dst, src Ptr, n uint64) error {
	if n == 0 {
		return nil
	}
	if dst == 0 || src == 0 {
		return fmt.Errorf("memory: copy with null address: %w", status.ErrInvalidConfig)
	}
	return m.using("device copy", func() error { return m.be.copyDeviceToDevice(dst, src, n) })
}

// Close frees every buffer still live and releases the device. It waits for copies in flight;
// later copies return ErrClosed. It is idempotent.
func (m *Memory) Close() error {
	m.use.Lock()
	defer m.use.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	m.queued.Wait() // copies queued before: their waits need no lock
	m.mu.Lock()
	defer m.mu.Unlock()
	var first error
	for b := range m.live {
		if err := m.free(b); err != nil && first == nil {
			first = err
		}
		delete(m.live, b)
	}
	if err := m.be.close(); err != nil && first == nil {
		first = err
	}
	return first
}

// Buffer is one allocation. Its fields are fixed at allocation; it is invalid after Free.
type Buffer struct {
	ptr   Ptr
	size  uint64
	host  []byte // the bytes, for host-addressable memory; nil for device memory
	whole []byte // the whole page-rounded mapping behind host, for munmap
	fd    int    // the memfd behind host memory, -1 if none
	// release gives adopted memory back to its allocator (see Adopt); nil for memory this
	// package allocated.
	release func() error
	typ     Type
	dev     int
	owner   *Memory
}

// Ptr returns the buffer's address (host or device).
func (b *Buffer) Ptr() Ptr { return b.ptr }

// Size returns the size requested at allocation.
func (b *Buffer) Size() uint64 { return b.size }

// Bytes returns the buffer's bytes if it is host memory, else nil. The slice is valid until
// Free; writes through it are visible to every process that maps the same memfd.
func (b *Buffer) Bytes() []byte { return b.host }

// FD returns the memfd backing a host buffer, or -1. Its size is sealed (F_SEAL_SHRINK,
// F_SEAL_GROW, F_SEAL_SEAL), so a process it is passed to can map it safely. The descriptor is
// owned by the buffer: duplicate it before passing it on; it is closed by Free.
func (b *Buffer) FD() int { return b.fd }

// Type returns the buffer's memory type.
func (b *Buffer) Type() Type { return b.typ }

// DeviceID returns the device the buffer lives on.
func (b *Buffer) DeviceID() int { return b.dev }

// Memory returns the Memory that allocated the buffer.
func (b *Buffer) Memory() *Memory { return b.owner }
