// Package gva is the global virtual address space of the fabric faces: symmetric layouts
// (base + rank × stride + offset, identical in every process) and the process-wide allocator
// that places them in one window of the address space, reserved with no access until a part is
// backed by memory.
package gva

import (
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
)

// The window global address spaces are placed in: upstream's host window starts at 40 TiB;
// it ends at 120 TiB here, below the 128 TiB of user space that 4-level page tables give.
const (
	WindowStart uint64 = 40 << 40
	WindowEnd   uint64 = 120 << 40
	// Align is the alignment of every space's base (1 GiB), so a layout's numbers stay round.
	Align uint64 = 1 << 30
)

// Layout is a symmetric space: rank r's slice is [Base + r×Stride, +Stride).
type Layout struct {
	Base, Stride uint64
	Ranks        int
}

// Size returns the space's length.
func (l Layout) Size() uint64 { return l.Stride * uint64(l.Ranks) }

// Contains says whether [addr, addr+n) lies in the space.
func (l Layout) Contains(addr, n uint64) bool {
	return l.Stride != 0 && addr >= l.Base && addr-l.Base <= l.Size() && n <= l.Size()-(addr-l.Base)
}

// RankOf returns the rank owning addr and addr's offset in that rank's slice (-1 outside).
// It divides by the stride (upstream divides by the local size, wrong when they differ).
func (l Layout) RankOf(addr uint64) (rank int, off uint64) {
	if !l.Contains(addr, 1) {
		return -1, 0
	}
	d := addr - l.Base
	return int(d / l.Stride), d % l.Stride
}

// Slice returns rank r's first address.
func (l Layout) Slice(r int) uint64 { return l.Base + uint64(r)*l.Stride }

// Space is a Layout reserved in this process.
type Space struct {
	Layout
	res *memory.Reservation
}

// MapShared backs [off, off+n) of the space with fd's pages from fdOff (memory.Reservation).
func (s *Space) MapShared(off, n uint64, fd int, fdOff uint64) ([]byte, error) {
	return s.res.MapShared(off, n, fd, fdOff)
}

// Unmap gives the part backed at off back to no access.
func (s *Space) Unmap(off uint64) error { return s.res.Unmap(off) }

var (
	mu     sync.Mutex
	spaces []*Space // reserved by this process, by base; guarded by mu
)

// ErrLayout reports a space that cannot be placed where the other processes placed it.
var ErrLayout = fmt.Errorf("%w: global address space", status.ErrInvalidConfig)

// Reserve reserves a space of ranks × stride bytes. base 0 places it first-fit in the window
// (every process that makes the same sequence of reservations gets the same bases, as
// upstream's VA manager); a non-zero base (another process's choice) is taken as it is.
func Reserve(base, stride uint64, ranks int) (*Space, error) {
	if stride == 0 || ranks <= 0 || stride%(2<<20) != 0 {
		return nil, fmt.Errorf("gva: %d ranks × %#x bytes: %w", ranks, stride, status.ErrInvalidConfig)
	}
	size := stride * uint64(ranks)
	if size/uint64(ranks) != stride || size > WindowEnd-WindowStart {
		return nil, fmt.Errorf("gva: %d ranks × %#x bytes do not fit in the %d TiB window: %w", ranks, stride, (WindowEnd-WindowStart)>>40, ErrLayout)
	}
	mu.Lock()
	defer mu.Unlock()
	if base != 0 {
		if base%Align != 0 || base < WindowStart || base > WindowEnd-size {
			return nil, fmt.Errorf("gva: base %#x: outside the window or not aligned: %w", base, ErrLayout)
		}
		return reserveLocked(base, stride, ranks)
	}
	var errs []error
	for b := WindowStart; b <= WindowEnd-size; {
		next := b
		for _, s := range spaces { // skip what this process holds
			if b < s.Base+s.Size() && s.Base < b+size {
				next = max(next, roundUp(s.Base+s.Size()))
			}
		}
		if next != b {
			b = next
			continue
		}
		s, err := reserveLocked(b, stride, ranks)
		if err == nil {
			return s, nil
		}
		if !errors.Is(err, memory.ErrAddressInUse) {
			return nil, err
		}
		errs = append(errs, err)
		b += roundUp(size) // something else lives there: try past it
		if len(errs) > 64 {
			break
		}
	}
	return nil, fmt.Errorf("gva: no room for %#x bytes in the window: %w: %w", size, ErrLayout, errors.Join(errs...))
}

func roundUp(n uint64) uint64 { return (n + Align - 1) &^ (Align - 1) }

func reserveLocked(base, stride uint64, ranks int) (*Space, error) {
	r, err := memory.Reserve(base, roundUp(stride*uint64(ranks)))
	if err != nil {
		return nil, fmt.Errorf("gva: %w", err)
	}
	s := &Space{Layout: Layout{Base: base, Stride: stride, Ranks: ranks}, res: r}
	spaces = append(spaces, s)
	sort.Slice(spaces, func(i, j int) bool { return spaces[i].Base < spaces[j].Base })
	return s, nil
}

// Release gives the space back (its backed parts included).
func (s *Space) Release() error {
	mu.Lock()
	for i, x := range spaces {
		if x == s {
			spaces = append(spaces[:i], spaces[i+1:]...)
			break
		}
	}
	mu.Unlock()
	return s.res.Release()
}
