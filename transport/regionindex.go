package transport

import (
	"fmt"
	"slices"
	"sort"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/status"
)

// RegionIndex is an initiator's cache of the peer regions it resolved (what the peer
// described: key, address range), found by key or by address with a binary search, as the
// owner's buffer.Table finds them. R is the transport's own record of a region (its mapping,
// its rkey). Not safe for concurrent use: the transport locks around it.
type RegionIndex[R any] struct {
	byKey  map[buffer.Key]*indexed[R]
	sorted []*indexed[R] // by address, disjoint
}

type indexed[R any] struct {
	key        buffer.Key
	addr, size uint64
	r          R
}

// Lookup returns the region holding n bytes at dst (by key, or by address when dst.Key is 0)
// and dst's offset in it.
func (x *RegionIndex[R]) Lookup(dst Remote, n uint64) (r R, off uint64, ok bool) {
	var e *indexed[R]
	off = dst.Addr
	if dst.Key != 0 {
		e = x.byKey[dst.Key]
	} else if i := x.search(dst.Addr); i > 0 {
		if c := x.sorted[i-1]; dst.Addr < c.addr+c.size {
			e, off = c, dst.Addr-c.addr
		}
	}
	if e == nil || buffer.CheckRange(e.size, off, n) != nil {
		return r, 0, false
	}
	return e.r, off, true
}

// Get returns the region with key k.
func (x *RegionIndex[R]) Get(k buffer.Key) (R, bool) {
	if e := x.byKey[k]; e != nil {
		return e.r, true
	}
	var zero R
	return zero, false
}

// Add caches region r, described by its owner as key k at [addr, addr+size). A range that
// overlaps one described before is the peer contradicting itself: ErrProtocol.
func (x *RegionIndex[R]) Add(k buffer.Key, addr, size uint64, r R) error {
	i := x.search(addr)
	if (i > 0 && x.sorted[i-1].addr+x.sorted[i-1].size > addr) || (i < len(x.sorted) && x.sorted[i].addr < addr+size) {
		return fmt.Errorf("the peer's region %d [%#x, +%d) overlaps one it described before: %w", k, addr, size, status.ErrProtocol)
	}
	if x.byKey == nil {
		x.byKey = make(map[buffer.Key]*indexed[R])
	}
	e := &indexed[R]{key: k, addr: addr, size: size, r: r}
	x.byKey[k] = e
	x.sorted = slices.Insert(x.sorted, i, e)
	return nil
}

// Overlapping returns the regions that overlap [addr, addr+size).
func (x *RegionIndex[R]) Overlapping(addr, size uint64) []R {
	var out []R
	for i := max(x.search(addr)-1, 0); i < len(x.sorted); i++ { // the one starting at or before addr, then on
		e := x.sorted[i]
		if e.addr >= addr+size {
			break
		}
		if e.addr+e.size > addr {
			out = append(out, e.r)
		}
	}
	return out
}

// Len returns how many regions are cached.
func (x *RegionIndex[R]) Len() int { return len(x.sorted) }

// All returns every cached region, by address.
func (x *RegionIndex[R]) All() []R {
	out := make([]R, 0, len(x.sorted))
	for _, e := range x.sorted {
		out = append(out, e.r)
	}
	return out
}

// Remove forgets the region with key k and returns it.
func (x *RegionIndex[R]) Remove(k buffer.Key) (R, bool) {
	e := x.byKey[k]
	if e == nil {
		var zero R
		return zero, false
	}
	delete(x.byKey, k)
	if i := slices.Index(x.sorted, e); i >= 0 {
		x.sorted = slices.Delete(x.sorted, i, i+1)
	}
	return e.r, true
}

// Reset forgets every region and returns them.
func (x *RegionIndex[R]) Reset() []R {
	out := x.All()
	x.byKey, x.sorted = nil, nil
	return out
}

// search returns the index of the first region starting after addr.
func (x *RegionIndex[R]) search(addr uint64) int {
	return sort.Search(len(x.sorted), func(i int) bool { return x.sorted[i].addr > addr })
}
