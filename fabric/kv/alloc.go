package kv

import "sort"

// allocAlign is the alignment of every object buffer in a segment (a cache line: transfers of
// neighbouring objects never share one).
const allocAlign = 64

// allocator hands out ranges of a segment: first fit over a sorted free list, neighbours
// coalesced on free.
type allocator struct {
	size uint64
	free []span // sorted by off, disjoint, never adjacent
	used uint64
}

type span struct{ off, n uint64 }

func newAllocator(size uint64) *allocator {
	return &allocator{size: size, free: []span{{0, size}}}
}

func roundUp(n uint64) uint64 { return (n + allocAlign - 1) &^ (allocAlign - 1) }

// alloc returns the offset of n bytes (rounded up to allocAlign), or false when no free range
// is large enough.
func (a *allocator) alloc(n uint64) (uint64, bool) {
	n = roundUp(n)
	for i, f := range a.free {
		if f.n < n {
			continue
		}
		off := f.off
		if f.n == n {
			a.free = append(a.free[:i], a.free[i+1:]...)
		} else {
			a.free[i] = span{f.off + n, f.n - n}
		}
		a.used += n
		return off, true
	}
	return 0, false
}

// release gives back n bytes at off (as alloc returned them).
func (a *allocator) release(off, n uint64) {
	n = roundUp(n)
	a.used -= n
	i := sort.Search(len(a.free), func(i int) bool { return a.free[i].off > off })
	a.free = append(a.free, span{})
	copy(a.free[i+1:], a.free[i:])
	a.free[i] = span{off, n}
	if i+1 < len(a.free) && a.free[i].off+a.free[i].n == a.free[i+1].off { // join the next
		a.free[i].n += a.free[i+1].n
		a.free = append(a.free[:i+1], a.free[i+2:]...)
	}
	if i > 0 && a.free[i-1].off+a.free[i-1].n == a.free[i].off { // join the previous
		a.free[i-1].n += a.free[i].n
		a.free = append(a.free[:i], a.free[i+1:]...)
	}
}

// largest is the largest free range.
func (a *allocator) largest() uint64 {
	var m uint64
	for _, f := range a.free {
		m = max(m, f.n)
	}
	return m
}

// reserve takes n bytes (rounded up to allocAlign) at off, as alloc once returned them (a
// standby master replaying its leader's placements); false when that range is not free.
func (a *allocator) reserve(off, n uint64) bool {
	n = roundUp(n)
	if off%allocAlign != 0 || off+n < off || off+n > a.size {
		return false
	}
	i := sort.Search(len(a.free), func(i int) bool { return a.free[i].off+a.free[i].n > off })
	if i == len(a.free) || a.free[i].off > off || a.free[i].off+a.free[i].n < off+n {
		return false
	}
	f := a.free[i]
	var parts []span
	if f.off < off {
		parts = append(parts, span{f.off, off - f.off})
	}
	if end := off + n; end < f.off+f.n {
		parts = append(parts, span{end, f.off + f.n - end})
	}
	a.free = append(a.free[:i], append(parts, a.free[i+1:]...)...)
	a.used += n
	return true
}
