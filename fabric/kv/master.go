package kv

import (
	"container/list"
	"regexp"
	"sort"
	"sync"
	"time"
)

// Segment is memory a client mounted into the pool: Size bytes at Base in the client's address
// space (registered with its transfer engine, which peers reach by the client's Engine id).
type Segment struct {
	Name   string // unique in the pool
	Client string // the client that mounted it (its transfer engine's unique id)
	Base   uint64
	Size   uint64
}

// Buffer is one replica of an object: Size bytes at Addr in segment Segment of client Client.
type Buffer struct {
	Client  string
	Segment string
	Addr    uint64
	Size    uint64
}

// MasterConfig configures a Master.
type MasterConfig struct {
	// LeaseTTL is how long a get pins an object against eviction and removal (default 5 s,
	// Mooncake's default_kv_lease_ttl).
	LeaseTTL time.Duration
	// HighWatermark is the fraction of the pool's space above which puts evict (default 0.95);
	// EvictRatio is how much of the pool's space an eviction frees at least (default 0.05).
	HighWatermark, EvictRatio float64
	// PutTimeout is how long a put may stay unfinished (PutStart without PutEnd) before its
	// space is reclaimed (default 30 s: a client that died mid-put).
	PutTimeout time.Duration
	// DiscardDelay is how long the space of a put that did not finish (revoked, timed out, its
	// client gone) stays out of use before another object may take it (default 30 s, above a
	// client's transfer timeout): its writer may still have bytes on the way, which must not land
	// in someone else's object. Mooncake's master keeps such replicas in discarded_replicas_.
	DiscardDelay time.Duration
	// Now is the clock (tests); nil: time.Now.
	Now func() time.Time
}

func (c *MasterConfig) setDefaults() {
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = 5 * time.Second
	}
	if c.HighWatermark <= 0 || c.HighWatermark > 1 {
		c.HighWatermark = 0.95
	}
	if c.EvictRatio <= 0 || c.EvictRatio > 1 {
		c.EvictRatio = 0.05
	}
	if c.PutTimeout <= 0 {
		c.PutTimeout = 30 * time.Second
	}
	if c.DiscardDelay <= 0 {
		c.DiscardDelay = 30 * time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Master keeps the pool's state: segments, objects, replicas, leases. Its methods are safe for
// concurrent use. It never touches an object's bytes.
type Master struct {
	cfg MasterConfig

	mu       sync.Mutex
	segments map[string]*mounted // by name
	objects  map[string]*object  // by key
	pending  map[*object]bool    // objects being written (PutStart without PutEnd)
	lru      *list.List          // complete objects, least recently used first
	total    uint64              // bytes of every mounted segment
	used     uint64              // bytes allocated

	journal bool     // a leader logging its changes: removed collects removed keys
	removed []string // keys removed since the last drain (journal only)

	discarded []discard // space of puts that did not finish, out of use until its time
}

// discard is the space of a put that did not finish, held until until.
type discard struct {
	bufs  []Buffer
	size  uint64
	until time.Time
}

type mounted struct {
	seg   Segment
	alloc *allocator
}

type object struct {
	writer   string // the client whose put completed it (a retried PutEnd of it succeeds)
	key      string
	size     uint64
	replicas []Buffer
	complete bool
	owner    string    // the client writing it, while not complete
	started  time.Time // PutStart
	lease    time.Time // gets pin it until then
	elem     *list.Element
}

// NewMaster returns an empty pool.
func NewMaster(cfg MasterConfig) *Master {
	cfg.setDefaults()
	return &Master{cfg: cfg, segments: map[string]*mounted{}, objects: map[string]*object{}, pending: map[*object]bool{}, lru: list.New()}
}

// maxSegment bounds one segment (1 PiB: the pool's byte counts never overflow).
const maxSegment = 1 << 50

// MountSegment adds a client's segment to the pool.
func (m *Master) MountSegment(s Segment) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mountLocked(s)
}

func (m *Master) mountLocked(s Segment) error {
	if s.Name == "" || s.Client == "" || s.Size == 0 || s.Size > maxSegment || s.Base == 0 || s.Base+s.Size < s.Base {
		return fail(InvalidParams, "segment %q of client %q: %d bytes at %#x", s.Name, s.Client, s.Size, s.Base)
	}
	if _, ok := m.segments[s.Name]; ok {
		return fail(SegmentExists, "segment %q is mounted already", s.Name)
	}
	m.segments[s.Name] = &mounted{seg: s, alloc: newAllocator(s.Size)}
	m.total += s.Size
	return nil
}

// UnmountSegment removes a segment of client from the pool: every replica in it is gone, and
// an object left without a complete replica is removed (a put writing into it fails at PutEnd).
func (m *Master) UnmountSegment(client, name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.segments[name]
	if !ok {
		return fail(SegmentNotFound, "segment %q is not mounted", name)
	}
	if s.seg.Client != client {
		return fail(IllegalClient, "segment %q belongs to client %q, not %q", name, s.seg.Client, client)
	}
	m.dropSegmentLocked(name)
	return nil
}

// ClientDown removes every segment of a client that is gone (a rank-down event), as
// UnmountSegment does, and revokes the puts it had not finished. It returns the segments
// removed.
func (m *Master) ClientDown(client string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.clientDownLocked(client)
}

func (m *Master) clientDownLocked(client string) []string {
	var gone []string
	for name, s := range m.segments {
		if s.seg.Client == client {
			gone = append(gone, name)
		}
	}
	sort.Strings(gone)
	for _, name := range gone {
		m.dropSegmentLocked(name)
	}
	for o := range m.pending {
		if o.owner == client {
			m.removeLocked(o)
		}
	}
	return gone
}

func (m *Master) dropSegmentLocked(name string) {
	s := m.segments[name]
	for _, o := range m.objects {
		kept := o.replicas[:0]
		for _, r := range o.replicas {
			if r.Segment == name {
				m.used -= roundUp(r.Size)
				continue // the segment's memory is gone with it: nothing to release
			}
			kept = append(kept, r)
		}
		o.replicas = kept
		if len(o.replicas) == 0 {
			m.removeLocked(o)
		}
	}
	for i := range m.discarded { // held space in the segment goes with it
		d := &m.discarded[i]
		kept := d.bufs[:0]
		for _, r := range d.bufs {
			if r.Segment == name {
				m.used -= roundUp(d.size)
				continue
			}
			kept = append(kept, r)
		}
		d.bufs = kept
	}
	m.total -= s.seg.Size
	delete(m.segments, name)
}

// PutStart places replicas of a new object of size bytes (at most one per segment, the first in
// preferred when it has room) and returns where client writes them; the object is not visible
// until PutEnd. Puts evict least recently used objects when the pool is above its high-water
// mark or has no room. A key that exists is refused (ObjectAlreadyExists).
func (m *Master) PutStart(client, key string, size uint64, replicas int, preferred string) ([]Buffer, error) {
	return m.start(client, key, size, replicas, preferred, false)
}

// UpsertStart is PutStart for a key that may exist: an existing object of the same size and
// replica count is rewritten in place, another is replaced. The key is unreadable
// (ReplicaIsNotReady) until PutEnd, as in Mooncake's UpsertStart. An object a get's lease holds
// is refused (ObjectReplicaBusy: a reader may still be reading its bytes), one another client is
// writing too (ReplicaIsNotReady).
func (m *Master) UpsertStart(client, key string, size uint64, replicas int, preferred string) ([]Buffer, error) {
	return m.start(client, key, size, replicas, preferred, true)
}

func (m *Master) start(client, key string, size uint64, replicas int, preferred string, upsert bool) ([]Buffer, error) {
	if key == "" {
		return nil, fail(InvalidKey, "an empty key")
	}
	if size == 0 || replicas < 1 {
		return nil, fail(InvalidParams, "put of %q: %d bytes, %d replicas", key, size, replicas)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.cfg.Now()
	m.reapLocked(now)
	if o, ok := m.objects[key]; ok {
		switch {
		case !o.complete && o.owner == client && o.size == size && len(o.replicas) == replicas:
			return append([]Buffer(nil), o.replicas...), nil // a retry of this client's start
		case !o.complete:
			return nil, fail(ReplicaIsNotReady, "%q is being written", key)
		case !upsert:
			return nil, fail(ObjectAlreadyExists, "%q exists", key)
		case now.Before(o.lease):
			return nil, fail(ObjectReplicaBusy, "%q is leased to readers for %v more", key, o.lease.Sub(now).Round(time.Millisecond))
		case o.size == size && len(o.replicas) == replicas:
			m.lru.Remove(o.elem)
			o.elem, o.complete, o.owner, o.started = nil, false, client, now
			m.pending[o] = true
			return append([]Buffer(nil), o.replicas...), nil
		}
		m.removeLocked(o)
	}
	if len(m.segments) < replicas {
		return nil, fail(NoAvailableHandle, "%d replicas of %q, %d segments mounted", replicas, key, len(m.segments))
	}
	if float64(m.used+uint64(replicas)*roundUp(size)) > m.cfg.HighWatermark*float64(m.total) {
		m.evictLocked(now, uint64(replicas)*roundUp(size))
	}
	bufs, ok := m.placeLocked(size, replicas, preferred)
	if !ok {
		m.evictLocked(now, uint64(replicas)*roundUp(size))
		if bufs, ok = m.placeLocked(size, replicas, preferred); !ok {
			return nil, fail(NoAvailableHandle, "no room for %d replicas of %d bytes (%d of %d bytes used)", replicas, size, m.used, m.total)
		}
	}
	o := &object{key: key, size: size, replicas: bufs, owner: client, started: now}
	m.objects[key], m.pending[o] = o, true
	return append([]Buffer(nil), bufs...), nil
}

// placeLocked allocates replicas buffers of size bytes in distinct segments: preferred first,
// then the segments with the most free space.
func (m *Master) placeLocked(size uint64, replicas int, preferred string) ([]Buffer, bool) {
	names := make([]string, 0, len(m.segments))
	for n := range m.segments {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		a, b := m.segments[names[i]], m.segments[names[j]]
		if (names[i] == preferred) != (names[j] == preferred) {
			return names[i] == preferred
		}
		if fa, fb := a.seg.Size-a.alloc.used, b.seg.Size-b.alloc.used; fa != fb {
			return fa > fb
		}
		return names[i] < names[j]
	})
	var bufs []Buffer
	for _, n := range names {
		if len(bufs) == replicas {
			break
		}
		s := m.segments[n]
		off, ok := s.alloc.alloc(size)
		if !ok {
			continue
		}
		bufs = append(bufs, Buffer{Client: s.seg.Client, Segment: n, Addr: s.seg.Base + off, Size: size})
	}
	if len(bufs) < replicas {
		m.releaseLocked(bufs)
		return nil, false
	}
	m.used += uint64(len(bufs)) * roundUp(size)
	return bufs, true
}

func (m *Master) releaseLocked(bufs []Buffer) {
	for _, b := range bufs {
		if s, ok := m.segments[b.Segment]; ok {
			s.alloc.release(b.Addr-s.seg.Base, b.Size)
		}
	}
}

// PutEnd makes client's object visible: its replicas are written.
func (m *Master) PutEnd(client, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	o, ok := m.objects[key]
	switch {
	case !ok:
		return fail(ObjectNotFound, "%q: no put under way (revoked, timed out, or its segments are gone)", key)
	case o.complete && o.writer == client:
		return nil // a retry: the first PutEnd made it visible
	case o.complete:
		return fail(InvalidWrite, "%q is complete already", key)
	case o.owner != client:
		return fail(IllegalClient, "%q is being written by %q, not %q", key, o.owner, client)
	}
	m.completeLocked(o, client)
	return nil
}

// completeLocked makes client's object o visible.
func (m *Master) completeLocked(o *object, client string) {
	o.complete, o.owner, o.writer = true, "", client
	delete(m.pending, o)
	o.elem = m.lru.PushBack(o)
}

// PutRevoke abandons client's unfinished put of key and frees its space.
func (m *Master) PutRevoke(client, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	o, ok := m.objects[key]
	switch {
	case !ok:
		return fail(ObjectNotFound, "%q: no put under way", key)
	case o.complete:
		return fail(InvalidWrite, "%q is complete: remove it instead", key)
	case o.owner != client:
		return fail(IllegalClient, "%q is being written by %q, not %q", key, o.owner, client)
	}
	m.removeLocked(o)
	return nil
}

// GetReplicaList returns the complete object's replicas and pins it against eviction and
// removal until the returned lease ends (now + LeaseTTL; a later get extends it). Readers must
// finish reading before the lease ends, or read again.
func (m *Master) GetReplicaList(key string) ([]Buffer, time.Time, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	o, ok := m.objects[key]
	if !ok {
		return nil, time.Time{}, fail(ObjectNotFound, "%q", key)
	}
	if !o.complete {
		return nil, time.Time{}, fail(ReplicaIsNotReady, "%q is being written", key)
	}
	until := m.cfg.Now().Add(m.cfg.LeaseTTL)
	if until.After(o.lease) {
		o.lease = until
	}
	m.lru.MoveToBack(o.elem)
	return append([]Buffer(nil), o.replicas...), o.lease, nil
}

// Exist says whether key names a complete object.
func (m *Master) Exist(key string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	o, ok := m.objects[key]
	return ok && o.complete
}

// Size is a complete object's size.
func (m *Master) Size(key string) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	o, ok := m.objects[key]
	if !ok || !o.complete {
		return 0, fail(ObjectNotFound, "%q", key)
	}
	return o.size, nil
}

// Remove deletes a complete object; a leased one is refused (ObjectHasLease) until its lease
// ends unless force (Mooncake's force: the caller takes the risk that a reader within its lease
// reads space reused since), one being written is refused (ReplicaIsNotReady).
func (m *Master) Remove(key string, force bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	o, ok := m.objects[key]
	switch {
	case !ok:
		return fail(ObjectNotFound, "%q", key)
	case !o.complete:
		return fail(ReplicaIsNotReady, "%q is being written", key)
	case !force && m.cfg.Now().Before(o.lease):
		return fail(ObjectHasLease, "%q is leased for %v more", key, o.lease.Sub(m.cfg.Now()).Round(time.Millisecond))
	}
	m.removeLocked(o)
	return nil
}

// RemoveByRegex removes every complete object whose key matches pattern, leased ones only if
// force, and returns how many it removed.
func (m *Master) RemoveByRegex(pattern string, force bool) (int, error) {
	re, err := regexp.Compile(pattern)
	if err != nil {
		return 0, fail(InvalidParams, "regex %q: %v", pattern, err)
	}
	return m.removeIf(force, func(o *object) bool { return re.MatchString(o.key) }), nil
}

// RemoveAll removes every complete object, leased ones only if force, and returns how many.
func (m *Master) RemoveAll(force bool) int {
	return m.removeIf(force, func(*object) bool { return true })
}

func (m *Master) removeIf(force bool, match func(*object) bool) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.cfg.Now()
	n := 0
	for _, o := range m.objects {
		if o.complete && (force || !now.Before(o.lease)) && match(o) {
			m.removeLocked(o)
			n++
		}
	}
	return n
}

func (m *Master) removeLocked(o *object) {
	if m.journal {
		m.removed = append(m.removed, o.key)
	}
	if !o.complete && len(o.replicas) > 0 { // a writer may still be writing: hold the space
		m.discarded = append(m.discarded, discard{bufs: o.replicas, size: o.size, until: m.cfg.Now().Add(m.cfg.DiscardDelay)})
	} else {
		m.releaseLocked(o.replicas)
		m.used -= uint64(len(o.replicas)) * roundUp(o.size)
	}
	if o.elem != nil {
		m.lru.Remove(o.elem)
	}
	delete(m.pending, o)
	delete(m.objects, o.key)
}

// evictLocked removes least recently used complete, unleased objects until the pool is at
// most at HighWatermark - EvictRatio of its space with need bytes more, or nothing is left to
// evict.
func (m *Master) evictLocked(now time.Time, need uint64) {
	target := (m.cfg.HighWatermark - m.cfg.EvictRatio) * float64(m.total)
	for e := m.lru.Front(); e != nil && float64(m.used+need) > target; {
		o := e.Value.(*object)
		e = e.Next()
		if now.Before(o.lease) {
			continue // leased: never evicted
		}
		m.removeLocked(o)
	}
}

// reapLocked frees the space of puts unfinished after PutTimeout (it looks at the puts under
// way only: a put costs no walk over the pool's objects).
func (m *Master) reapLocked(now time.Time) {
	for o := range m.pending {
		if now.Sub(o.started) > m.cfg.PutTimeout {
			m.removeLocked(o)
		}
	}
	kept := m.discarded[:0]
	for _, d := range m.discarded {
		if now.Before(d.until) {
			kept = append(kept, d)
			continue
		}
		m.releaseLocked(d.bufs)
		m.used -= uint64(len(d.bufs)) * roundUp(d.size)
	}
	clear(m.discarded[len(kept):])
	m.discarded = kept
}

// Stats is the pool's size and use.
type Stats struct {
	Segments, Objects int
	Total, Used       uint64
}

// Stats returns the pool's size and use now.
func (m *Master) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return Stats{Segments: len(m.segments), Objects: len(m.objects), Total: m.total, Used: m.used}
}
