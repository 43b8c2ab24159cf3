package buffer

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
)

// Key names a registered region in its owner's Table. Keys start at 1 and are never reused
// within a Table, so a stale key (its region deregistered) is refused instead of reaching
// another region.
type Key uint32

// Region is a range of memory registered in a Table: a ConnBuffer, memory the caller owns (a
// Go slice, or C memory the caller keeps alive), or device memory (RegisterDevice), never
// copied. Transports serve its bytes to peers between Acquire and Release: host memory
// directly, device memory through ReadAt and WriteAt (or the device's own IPC, on one host).
type Region struct {
	table *Table
	key   Key
	addr  uint64
	size  uint64
	mem   []byte       // the bytes of host memory; nil for device memory
	place memory.Place // where the memory lives
	fd    int          // memfd behind mem, or -1
	fdOff uint64       // mem's offset in fd
	refs  int          // registrations of this range (nested ones return the region); guarded by table.mu

	peers atomic.Pointer[map[uint32]struct{}] // ranks it is published to; nil: every peer

	mu       sync.Mutex
	inflight int           // operations between Acquire and Release; guarded by mu
	dead     bool          // deregistered: Acquire fails; guarded by mu
	drained  chan struct{} // closed when dead and inflight reaches 0; guarded by mu
}

// Key returns the region's key.
func (r *Region) Key() Key { return r.key }

// Addr returns the region's start address in this process (the address peers name it by).
func (r *Region) Addr() uint64 { return r.addr }

// Size returns the region's length in bytes.
func (r *Region) Size() uint64 { return r.size }

// Bytes returns the region's memory, or nil for device memory (reach it with ReadAt and
// WriteAt). It stays valid while the region is registered; use it between Acquire and Release
// where a deregistration may race.
func (r *Region) Bytes() []byte { return r.mem }

// Place says where the region's memory lives (host, or a device).
func (r *Region) Place() memory.Place { return r.place }

// OnDevice says whether the region is device memory, which the host does not address.
func (r *Region) OnDevice() bool { return r.mem == nil }

// Check validates n bytes at off against the region.
func (r *Region) Check(off, n uint64) error { return CheckRange(r.size, off, n) }

// WriteFromCPU copies host bytes src into the region at off (a device copy for device memory).
func (r *Region) WriteFromCPU(src []byte, off uint64) error {
	if err := r.Check(off, uint64(len(src))); err != nil {
		return fmt.Errorf("region %d: %w", r.key, err)
	}
	if r.mem != nil {
		copy(r.mem[off:], src)
		return nil
	}
	return memory.CopyPlaced(memory.Ptr(r.addr+off), r.place, memory.Ptr(memory.AddrOf(src)), memory.HostPlace, uint64(len(src)))
}

// ReadToCPU copies len(dst) bytes of the region at off into host memory dst.
func (r *Region) ReadToCPU(dst []byte, off uint64) error {
	if err := r.Check(off, uint64(len(dst))); err != nil {
		return fmt.Errorf("region %d: %w", r.key, err)
	}
	if r.mem != nil {
		copy(dst, r.mem[off:])
		return nil
	}
	return memory.CopyPlaced(memory.Ptr(memory.AddrOf(dst)), memory.HostPlace, memory.Ptr(r.addr+off), r.place, uint64(len(dst)))
}

// ReadToCPUAsync starts copying len(dst) bytes of the region at off into host memory dst and
// returns the wait for its end (memory.CopyAsync): a staging ring queues the copies of its
// chunks ahead. Host memory regions are copied before it returns.
func (r *Region) ReadToCPUAsync(dst []byte, off uint64) (wait func() error, err error) {
	if r.mem != nil { // a slice copy: the bytes may be Go memory, not to be re-derived from an address
		return copied(r.ReadToCPU(dst, off))
	}
	if err := r.Check(off, uint64(len(dst))); err != nil {
		return nil, fmt.Errorf("region %d: %w", r.key, err)
	}
	return memory.CopyAsync(memory.Ptr(memory.AddrOf(dst)), memory.HostPlace, memory.Ptr(r.addr+off), r.place, uint64(len(dst)))
}

// WriteFromCPUAsync starts copying host memory src to the region at off, as ReadToCPUAsync.
func (r *Region) WriteFromCPUAsync(src []byte, off uint64) (wait func() error, err error) {
	if r.mem != nil {
		return copied(r.WriteFromCPU(src, off))
	}
	if err := r.Check(off, uint64(len(src))); err != nil {
		return nil, fmt.Errorf("region %d: %w", r.key, err)
	}
	return memory.CopyAsync(memory.Ptr(r.addr+off), r.place, memory.Ptr(memory.AddrOf(src)), memory.HostPlace, uint64(len(src)))
}

// copied is the result of an asynchronous copy done at once.
func copied(err error) (wait func() error, _ error) {
	if err != nil {
		return nil, err
	}
	return func() error { return nil }, nil
}

// FD returns the memfd behind the region and the region's offset in it, or -1 when the memory
// has none (a Go slice, C memory): same-host peers then reach it with cross-memory attach.
func (r *Region) FD() (int, uint64) { return r.fd, r.fdOff }

// PublishTo limits the peers that may reach r through a transport to the given ranks (as each
// peer's handshake names it); called with none, r is published to every peer again, the
// default. A peer it is not published to is told the region does not exist (ErrNotFound), for
// every lookup from then on; operations already under way finish. Ranks are what admitted
// peers say they are: with a shared secret, every member of the group could claim any rank, so
// this keeps a region from peers it was not meant for, not from a member lying about its rank.
func (r *Region) PublishTo(ranks ...uint32) {
	if len(ranks) == 0 {
		r.peers.Store(nil)
		return
	}
	m := make(map[uint32]struct{}, len(ranks))
	for _, k := range ranks {
		m[k] = struct{}{}
	}
	r.peers.Store(&m)
}

// PublishedTo reports whether the peer of the given rank may reach r.
func (r *Region) PublishedTo(rank uint32) bool {
	m := r.peers.Load()
	if m == nil {
		return true
	}
	_, ok := (*m)[rank]
	return ok
}

// Deregistered reports whether the last Deregister of the region has begun.
func (r *Region) Deregistered() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.dead
}

// Acquire marks an operation on the region in flight: a Deregister waits for it. It fails with
// an error wrapping status.ErrNotFound once the region is deregistered.
func (r *Region) Acquire() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dead {
		return fmt.Errorf("region %d: deregistered: %w", r.key, status.ErrNotFound)
	}
	r.inflight++
	return nil
}

// Release ends an operation begun with Acquire.
func (r *Region) Release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.inflight--; r.inflight == 0 && r.dead {
		close(r.drained)
	}
}

// Table is a process's registered memory: any number of regions, found by key, or by address
// with an O(log n) interval search. Regions never overlap partially: registering a range
// inside a registered region returns that region (counted; each registration is undone by one
// Deregister), and a range that straddles a region's edge is refused. Its methods are safe for
// concurrent use.
type Table struct {
	mu     sync.RWMutex
	byKey  map[Key]*Region // guarded by mu
	sorted []*Region       // by address, disjoint; guarded by mu
	next   Key             // the last key handed out; guarded by mu
	fences map[int]Fence   // guarded by mu
	fenceN int             // guarded by mu
}

// Fence is called by the last Deregister of a region, once the region has left the table and
// is marked deregistered (Acquire fails, Deregistered is true), before Deregister waits for the
// owner's own operations on it. A transport whose peers reach
// memory without the owner's CPU (a shared mapping, cross-memory attach) waits there until those
// peers' operations on r have ended and no new one can start, within ctx.
type Fence func(ctx context.Context, r *Region) error

// AddFence makes Deregister call f; remove undoes it.
func (t *Table) AddFence(f Fence) (remove func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.fences == nil {
		t.fences = make(map[int]Fence)
	}
	t.fenceN++
	id := t.fenceN
	t.fences[id] = f
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		delete(t.fences, id)
	}
}

// NewTable returns an empty Table.
func NewTable() *Table { return &Table{byKey: make(map[Key]*Region)} }

// Register registers host memory b, which the caller keeps valid (and, for a Go slice,
// reachable) until the last Deregister of the region returned. b is never copied.
func (t *Table) Register(b []byte) (*Region, error) { return t.register(b, -1, 0) }

// RegisterDevice registers n bytes of device memory at p, which lives at pl (memory.Locate's
// answer, which must be a device); the caller keeps it allocated until the last Deregister.
func (t *Table) RegisterDevice(p memory.Ptr, n uint64, pl memory.Place) (*Region, error) {
	if !pl.OnDevice() {
		return nil, fmt.Errorf("register device memory [%#x, +%d): it is %v memory: %w", uintptr(p), n, pl, status.ErrInvalidConfig)
	}
	if p == 0 || n == 0 || uint64(p)+n < uint64(p) {
		return nil, fmt.Errorf("register device memory [%#x, +%d): %w", uintptr(p), n, status.ErrInvalidConfig)
	}
	return t.add(&Region{addr: uint64(p), size: n, place: pl, fd: -1})
}

// RegisterBuffer registers a host ConnBuffer. Its memfd goes with the region, so same-host
// peers can map it.
func (t *Table) RegisterBuffer(c *ConnBuffer) (*Region, error) {
	b := c.Bytes()
	if b == nil {
		return nil, fmt.Errorf("register: %v memory is not host-addressable: %w", c.Type(), status.ErrUnsupported)
	}
	return t.register(b, c.FD(), 0)
}

// RegisterShared registers host memory b that is mapped from the memfd fd at fdOff (a page
// multiple), so same-host peers can map the same pages. The caller keeps both b and fd valid
// until the last Deregister.
func (t *Table) RegisterShared(b []byte, fd int, fdOff uint64) (*Region, error) {
	if fd < 0 || fdOff%uint64(os.Getpagesize()) != 0 {
		return nil, fmt.Errorf("register: descriptor %d at offset %d: %w", fd, fdOff, status.ErrInvalidConfig)
	}
	return t.register(b, fd, fdOff)
}

func (t *Table) register(b []byte, fd int, fdOff uint64) (*Region, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("register: empty range: %w", status.ErrInvalidConfig)
	}
	return t.add(&Region{addr: memory.AddrOf(b), size: uint64(len(b)), mem: b[:len(b):len(b)], place: memory.HostPlace, fd: fd, fdOff: fdOff})
}

// add puts the new region nr in the table, or returns the region that holds its range.
func (t *Table) add(nr *Region) (*Region, error) {
	start, end := nr.addr, nr.addr+nr.size
	t.mu.Lock()
	defer t.mu.Unlock()
	i := t.search(start)
	// sorted[i-1] is the last region starting at or before start.
	if i > 0 {
		r := t.sorted[i-1]
		rs, re := r.Addr(), r.Addr()+r.Size()
		if start < re {
			if end <= re {
				if r.OnDevice() != nr.OnDevice() {
					return nil, fmt.Errorf("register [%#x, %#x) as %v memory: inside region %d of %v memory: %w",
						start, end, nr.place, r.key, r.place, status.ErrInvalidConfig)
				}
				r.refs++ // inside: the same region, counted
				return r, nil
			}
			return nil, fmt.Errorf("register [%#x, %#x): straddles region %d [%#x, %#x): %w",
				start, end, r.key, rs, re, status.ErrInvalidConfig)
		}
	}
	if i < len(t.sorted) && t.sorted[i].Addr() < end {
		r := t.sorted[i]
		return nil, fmt.Errorf("register [%#x, %#x): overlaps region %d at %#x: %w", start, end, r.key, r.Addr(), status.ErrInvalidConfig)
	}
	if t.next == maxKey {
		return nil, fmt.Errorf("register: all %d keys used: %w", maxKey, status.ErrInvalidConfig)
	}
	t.next++
	r := nr
	r.table, r.key, r.refs = t, t.next, 1
	t.byKey[r.key] = r
	t.sorted = slices.Insert(t.sorted, i, r)
	return r, nil
}

// maxKey is the largest key a Table hands out; keys above it are reserved (transports use the
// top one for a server's default region).
const maxKey Key = 1<<32 - 2

// search returns the index of the first region starting after addr. Caller holds mu.
func (t *Table) search(addr uint64) int {
	return sort.Search(len(t.sorted), func(i int) bool { return t.sorted[i].Addr() > addr })
}

// Deregister undoes one Register of r. The last one removes it: later lookups and Acquires
// fail with ErrNotFound at once, and Deregister waits (bounded by ctx) for the operations in
// flight on it. If ctx ends first the region is gone from the table all the same, and the error
// says operations were still running.
func (t *Table) Deregister(ctx context.Context, r *Region) error {
	if r == nil || r.table != t {
		return fmt.Errorf("deregister: not a region of this table: %w", status.ErrInvalidConfig)
	}
	t.mu.Lock()
	if t.byKey[r.key] != r {
		t.mu.Unlock()
		return fmt.Errorf("deregister region %d: not registered: %w", r.key, status.ErrNotFound)
	}
	if r.refs--; r.refs > 0 {
		t.mu.Unlock()
		return nil
	}
	delete(t.byKey, r.key)
	if i := t.search(r.Addr()); i > 0 && t.sorted[i-1] == r {
		t.sorted = slices.Delete(t.sorted, i-1, i)
	}
	fences := make([]Fence, 0, len(t.fences))
	for _, f := range t.fences {
		fences = append(fences, f)
	}
	t.mu.Unlock()
	r.mu.Lock()
	r.dead = true // before the fences: a transport that checks Deregistered under its own lock sees it
	r.drained = make(chan struct{})
	if r.inflight == 0 {
		close(r.drained)
	}
	drained := r.drained
	r.mu.Unlock()
	var ferr error
	for _, f := range fences {
		if err := f(ctx, r); err != nil && ferr == nil {
			ferr = fmt.Errorf("deregister region %d: %w", r.key, err)
		}
	}
	select {
	case <-drained:
		return ferr
	case <-ctx.Done():
		return fmt.Errorf("deregister region %d: operations still in flight: %w", r.key, status.FromContext(ctx))
	}
}

// Lookup returns the region with key k, acquired (Release it when done), if [off, off+n) lies
// in it. An unknown or deregistered key is ErrNotFound, a range outside it ErrOutOfRange.
func (t *Table) Lookup(k Key, off, n uint64) (*Region, error) {
	t.mu.RLock()
	r := t.byKey[k]
	t.mu.RUnlock()
	if r == nil {
		return nil, fmt.Errorf("region %d: not registered: %w", k, status.ErrNotFound)
	}
	if err := CheckRange(r.Size(), off, n); err != nil {
		return nil, fmt.Errorf("region %d: %w", k, err)
	}
	if err := r.Acquire(); err != nil {
		return nil, err
	}
	return r, nil
}

// Find returns the region holding the n bytes at address addr, acquired (Release it when done),
// and addr's offset in it. No region there is ErrNotFound; a range that runs past the region's
// end is ErrOutOfRange.
func (t *Table) Find(addr, n uint64) (*Region, uint64, error) {
	t.mu.RLock()
	var r *Region
	if i := t.search(addr); i > 0 {
		if c := t.sorted[i-1]; addr < c.Addr()+c.Size() {
			r = c
		}
	}
	t.mu.RUnlock()
	if r == nil {
		return nil, 0, fmt.Errorf("address %#x: no registered region: %w", addr, status.ErrNotFound)
	}
	off := addr - r.Addr()
	if err := CheckRange(r.Size(), off, n); err != nil {
		return nil, 0, fmt.Errorf("address %#x in region %d: %w", addr, r.key, err)
	}
	if err := r.Acquire(); err != nil {
		return nil, 0, err
	}
	return r, off, nil
}

// LookupFor is Lookup on behalf of the peer of rank peer: a region not published to it is
// ErrNotFound, as an unknown key.
func (t *Table) LookupFor(peer uint32, k Key, off, n uint64) (*Region, error) {
	r, err := t.Lookup(k, off, n)
	if err == nil && !r.PublishedTo(peer) {
		r.Release()
		return nil, fmt.Errorf("region %d: not published to rank %d: %w", k, peer, status.ErrNotFound)
	}
	return r, err
}

// FindFor is Find on behalf of the peer of rank peer: a region not published to it is
// ErrNotFound, as no region.
func (t *Table) FindFor(peer uint32, addr, n uint64) (*Region, uint64, error) {
	r, off, err := t.Find(addr, n)
	if err == nil && !r.PublishedTo(peer) {
		r.Release()
		return nil, 0, fmt.Errorf("address %#x: region %d not published to rank %d: %w", addr, r.key, peer, status.ErrNotFound)
	}
	return r, off, err
}

// Len returns the number of regions registered.
func (t *Table) Len() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.sorted)
}

// Regions returns the regions registered now, by address.
func (t *Table) Regions() []*Region {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return slices.Clone(t.sorted)
}
