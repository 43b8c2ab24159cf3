package memory

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/hmc-go/hmc/status"
)

// ErrAddressInUse is returned by Reserve when part of the range is mapped already.
var ErrAddressInUse = fmt.Errorf("%w: address range in use", status.ErrFailed)

// Reservation is a range of this process's address space held with no access (PROT_NONE,
// nothing committed) at a fixed address, so that nothing else is mapped there; parts of it are
// then backed by shared memory (MapShared) and given back to no access (Unmap). The global
// address spaces of the fabric layer live in reservations made at the same address in every
// process.
type Reservation struct {
	base, size uint64

	mu     sync.Mutex
	mapped map[uint64]uint64 // offset -> length of the parts MapShared backed; guarded by mu
	freed  bool              // guarded by mu
}

// Reserve holds [base, base+size) of the address space with no access. base and size must be
// page multiples. A range of which any page is mapped already is ErrAddressInUse (nothing is
// replaced: MAP_FIXED_NOREPLACE, checked on kernels that predate it).
func Reserve(base, size uint64) (*Reservation, error) {
	page := uint64(os.Getpagesize())
	if size == 0 || base == 0 || base%page != 0 || size%page != 0 || base+size < base || size > 1<<47 {
		return nil, fmt.Errorf("memory: reserve [%#x, +%#x): not page-aligned or empty: %w", base, size, status.ErrInvalidConfig)
	}
	flags := unix.MAP_PRIVATE | unix.MAP_ANONYMOUS | unix.MAP_NORESERVE | unix.MAP_FIXED_NOREPLACE
	got, err := mmapAt(base, size, unix.PROT_NONE, flags, -1, 0)
	if errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("memory: reserve [%#x, +%#x): %w", base, size, ErrAddressInUse)
	}
	if err != nil {
		return nil, fmt.Errorf("memory: reserve [%#x, +%#x): %w: %w", base, size, status.ErrFailed, err)
	}
	if got != base { // a kernel older than 4.17 treats the unknown flag as a hint
		_ = munmapAt(got, size) // not ours to keep; the error below is the one that matters
		return nil, fmt.Errorf("memory: reserve [%#x, +%#x): the kernel placed it at %#x: %w", base, size, got, ErrAddressInUse)
	}
	return &Reservation{base: base, size: size, mapped: make(map[uint64]uint64)}, nil
}

// Base returns the reservation's first address.
func (r *Reservation) Base() uint64 { return r.base }

// Size returns the reservation's length in bytes.
func (r *Reservation) Size() uint64 { return r.size }

// Contains says whether [addr, addr+n) lies in the reservation.
func (r *Reservation) Contains(addr, n uint64) bool {
	return addr >= r.base && addr-r.base <= r.size && n <= r.size-(addr-r.base)
}

// MapShared backs [off, off+n) of the reservation with n bytes of fd from fdOff, shared and
// readable and writable, and returns them. The part must be page-aligned, inside the
// reservation and not backed already. The mapping holds the memory: fd may be closed after.
func (r *Reservation) MapShared(off, n uint64, fd int, fdOff uint64) ([]byte, error) {
	page := uint64(os.Getpagesize())
	if n == 0 || off%page != 0 || n%page != 0 || fdOff%page != 0 || !r.Contains(r.base+off, n) {
		return nil, fmt.Errorf("memory: map [%#x, +%#x) of a reservation of %#x bytes: %w", off, n, r.size, status.ErrOutOfRange)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.freed {
		return nil, fmt.Errorf("memory: map into a released reservation: %w", status.ErrClosed)
	}
	for o, l := range r.mapped {
		if off < o+l && o < off+n {
			return nil, fmt.Errorf("memory: map [%#x, +%#x): overlaps a mapped part at %#x: %w", off, n, o, status.ErrInvalidConfig)
		}
	}
	addr := r.base + off
	got, err := mmapAt(addr, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_FIXED, fd, fdOff)
	if err != nil {
		return nil, fmt.Errorf("memory: map %#x bytes of fd %d at %#x: %w: %w", n, fd, addr, status.ErrFailed, err)
	}
	if got != addr {
		_ = munmapAt(got, n)
		return nil, fmt.Errorf("memory: map at %#x landed at %#x: %w", addr, got, status.ErrFailed)
	}
	r.mapped[off] = n
	return HostSlice(Ptr(addr), n), nil
}

// Unmap gives the part that MapShared backed at off back to no access. Every slice of it must
// be out of use: a later access faults.
func (r *Reservation) Unmap(off uint64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.mapped[off]
	if !ok || r.freed {
		return fmt.Errorf("memory: unmap at %#x: nothing mapped there: %w", off, status.ErrNotFound)
	}
	flags := unix.MAP_PRIVATE | unix.MAP_ANONYMOUS | unix.MAP_NORESERVE | unix.MAP_FIXED
	if _, err := mmapAt(r.base+off, n, unix.PROT_NONE, flags, -1, 0); err != nil {
		return fmt.Errorf("memory: unmap at %#x: %w: %w", r.base+off, status.ErrFailed, err)
	}
	delete(r.mapped, off)
	return nil
}

// Release unmaps the whole reservation, backed parts included. Idempotent.
func (r *Reservation) Release() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.freed {
		return nil
	}
	r.freed = true
	r.mapped = nil
	if err := munmapAt(r.base, r.size); err != nil {
		return fmt.Errorf("memory: release [%#x, +%#x): %w: %w", r.base, r.size, status.ErrFailed, err)
	}
	return nil
}

// mmapAt is mmap(2) at a fixed address, returning the address as a number: the range lies
// outside the Go heap, so no unsafe.Pointer to it is kept.
func mmapAt(addr, n uint64, prot, flags, fd int, off uint64) (uint64, error) {
	p, err := unix.MmapPtr(fd, int64(off), addrPtr(addr), uintptr(n), prot, flags)
	if err != nil {
		return 0, err
	}
	return uint64(uintptr(p)), nil
}

func munmapAt(addr, n uint64) error { return unix.MunmapPtr(addrPtr(addr), uintptr(n)) }

// addrPtr turns an address outside the Go heap into a pointer without the conversion vet flags
// (see HostSlice).
func addrPtr(addr uint64) unsafe.Pointer {
	p := uintptr(addr)
	return *(*unsafe.Pointer)(unsafe.Pointer(&p))
}
