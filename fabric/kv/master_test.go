package kv

import (
	"errors"
	"math/rand"
	"testing"
	"time"

	"github.com/hmc-go/hmc/status"
)

// clock is a settable time for the master's leases and timeouts.
type clock struct{ t time.Time }

func (c *clock) now() time.Time         { return c.t }
func (c *clock) add(d time.Duration)    { c.t = c.t.Add(d) }
func newClock() *clock                  { return &clock{t: time.Unix(1_000_000, 0)} }
func code(t *testing.T, err error) Code { t.Helper(); return CodeOf(err) }
func mb(n uint64) uint64                { return n << 20 }
func seg(name, client string, base, size uint64) Segment {
	return Segment{Name: name, Client: client, Base: base, Size: size}
}

func newMaster(t *testing.T, c *clock, segs ...Segment) *Master {
	t.Helper()
	m := NewMaster(MasterConfig{LeaseTTL: time.Second, Now: c.now})
	for _, s := range segs {
		if err := m.MountSegment(s); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

// A put places its replicas in distinct segments (the preferred one first), is invisible until
// PutEnd, and is then read by its replica list; a second put of the key, a put while it is
// written, and bad arguments fail with Mooncake's codes.
func TestPutGet(t *testing.T) {
	c := newClock()
	m := newMaster(t, c, seg("a", "A", 1<<30, mb(64)), seg("b", "B", 2<<30, mb(64)), seg("c", "C", 3<<30, mb(64)))
	bufs, err := m.PutStart("A", "k1", 1000, 2, "c")
	if err != nil {
		t.Fatal(err)
	}
	if len(bufs) != 2 || bufs[0].Segment != "c" || bufs[0].Client != "C" || bufs[1].Segment == "c" {
		t.Fatalf("placed %+v", bufs)
	}
	if m.Exist("k1") {
		t.Fatal("an unfinished put is visible")
	}
	if _, _, err := m.GetReplicaList("k1"); code(t, err) != ReplicaIsNotReady {
		t.Fatalf("get while written: %v", err)
	}
	if _, err := m.PutStart("B", "k1", 1000, 1, ""); code(t, err) != ReplicaIsNotReady {
		t.Fatalf("a second put while written: %v", err)
	}
	if err := m.PutEnd("B", "k1"); code(t, err) != IllegalClient {
		t.Fatalf("PutEnd by another client: %v", err)
	}
	if err := m.PutEnd("A", "k1"); err != nil {
		t.Fatal(err)
	}
	got, until, err := m.GetReplicaList("k1")
	if err != nil || len(got) != 2 || got[0] != bufs[0] || !until.Equal(c.t.Add(time.Second)) {
		t.Fatalf("replicas %+v until %v: %v", got, until, err)
	}
	if n, err := m.Size("k1"); err != nil || n != 1000 {
		t.Fatalf("size %d: %v", n, err)
	}
	if _, err := m.PutStart("A", "k1", 10, 1, ""); code(t, err) != ObjectAlreadyExists || !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatalf("a second put: %v", err)
	}
	for _, bad := range []struct {
		key  string
		n    uint64
		reps int
		want Code
	}{{"", 10, 1, InvalidKey}, {"x", 0, 1, InvalidParams}, {"x", 10, 0, InvalidParams}, {"x", 10, 4, NoAvailableHandle}, {"x", mb(65), 1, NoAvailableHandle}} {
		if _, err := m.PutStart("A", bad.key, bad.n, bad.reps, ""); code(t, err) != bad.want {
			t.Errorf("put %q of %d bytes x %d: %v, want %v", bad.key, bad.n, bad.reps, err, bad.want)
		}
	}
	if _, _, err := m.GetReplicaList("nope"); code(t, err) != ObjectNotFound || !errors.Is(err, status.ErrNotFound) {
		t.Fatalf("get of a missing key: %v", err)
	}
	if err := m.MountSegment(seg("a", "A", 9<<30, 10)); code(t, err) != SegmentExists {
		t.Fatalf("mount twice: %v", err)
	}
}

// A get's lease keeps the object from removal and eviction until it ends; removal by key,
// regex and all skips leased objects.
func TestLeases(t *testing.T) {
	c := newClock()
	m := newMaster(t, c, seg("a", "A", 1<<30, mb(16)))
	for _, k := range []string{"p/1", "p/2", "q/1"} {
		if _, err := m.PutStart("A", k, 4096, 1, ""); err != nil {
			t.Fatal(err)
		}
		if err := m.PutEnd("A", k); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := m.GetReplicaList("p/1"); err != nil {
		t.Fatal(err)
	}
	if err := m.Remove("p/1", false); code(t, err) != ObjectHasLease {
		t.Fatalf("remove of a leased object: %v", err)
	}
	if n, err := m.RemoveByRegex("^p/", false); err != nil || n != 1 || !m.Exist("p/1") || m.Exist("p/2") {
		t.Fatalf("remove by regex: %d %v", n, err)
	}
	if _, err := m.RemoveByRegex("(", false); code(t, err) != InvalidParams {
		t.Fatalf("a bad regex: %v", err)
	}
	c.add(1500 * time.Millisecond) // the lease has ended
	if err := m.Remove("p/1", false); err != nil {
		t.Fatal(err)
	}
	if n := m.RemoveAll(false); n != 1 || m.Stats().Objects != 0 || m.Stats().Used != 0 {
		t.Fatalf("remove all: %d, %+v", n, m.Stats())
	}
}

// Above the high-water mark a put evicts the least recently used objects — a get counts as a
// use — never a leased one, and never one being written; with nothing evictable it fails.
func TestEviction(t *testing.T) {
	c := newClock()
	m := newMaster(t, c, seg("a", "A", 1<<30, mb(10)))
	for i := range 9 { // 9 MiB of 10: at the 0.95 mark
		k := string(rune('a' + i))
		if _, err := m.PutStart("A", k, mb(1), 1, ""); err != nil {
			t.Fatal(err)
		}
		if err := m.PutEnd("A", k); err != nil {
			t.Fatal(err)
		}
		c.add(time.Millisecond)
	}
	if _, _, err := m.GetReplicaList("a"); err != nil { // a is used again, and leased
		t.Fatal(err)
	}
	if _, err := m.PutStart("A", "new", mb(1), 1, ""); err != nil {
		t.Fatal(err)
	}
	if !m.Exist("a") || m.Exist("b") {
		t.Fatalf("eviction took the wrong object: a %v, b %v", m.Exist("a"), m.Exist("b"))
	}
	// Everything leased: a put that needs room fails, and nothing leased is gone.
	for _, k := range []string{"a", "c", "d", "e", "f", "g", "h", "i"} {
		if _, _, err := m.GetReplicaList(k); err != nil && code(t, err) != ObjectNotFound {
			t.Fatal(err)
		}
	}
	before := m.Stats().Objects
	if _, err := m.PutStart("A", "big", mb(3), 1, ""); code(t, err) != NoAvailableHandle || !errors.Is(err, status.ErrOutOfRange) {
		t.Fatalf("a put with every object leased: %v", err)
	}
	if m.Stats().Objects != before {
		t.Fatal("a leased or unfinished object was evicted")
	}
}

// A client that dies takes its segments with it: objects with a replica elsewhere keep it,
// objects without one are gone, and its unfinished puts are revoked; puts that a client never
// finishes are reclaimed after PutTimeout.
func TestClientDown(t *testing.T) {
	c := newClock()
	m := NewMaster(MasterConfig{LeaseTTL: time.Second, PutTimeout: 10 * time.Second, Now: c.now})
	for _, s := range []Segment{seg("a", "A", 1<<30, mb(16)), seg("b", "B", 2<<30, mb(16))} {
		if err := m.MountSegment(s); err != nil {
			t.Fatal(err)
		}
	}
	put := func(client, k string, reps int, pref string) {
		t.Helper()
		if _, err := m.PutStart(client, k, 4096, reps, pref); err != nil {
			t.Fatal(err)
		}
		if err := m.PutEnd(client, k); err != nil {
			t.Fatal(err)
		}
	}
	put("A", "both", 2, "a")
	put("A", "onA", 1, "a")
	put("B", "onB", 1, "b")
	if _, err := m.PutStart("A", "unfinished", 4096, 1, "b"); err != nil {
		t.Fatal(err)
	}
	if err := m.UnmountSegment("B", "a"); code(t, err) != IllegalClient {
		t.Fatalf("unmount of another client's segment: %v", err)
	}
	if gone := m.ClientDown("A"); len(gone) != 1 || gone[0] != "a" {
		t.Fatalf("segments gone with A: %v", gone)
	}
	if bufs, _, err := m.GetReplicaList("both"); err != nil || len(bufs) != 1 || bufs[0].Client != "B" {
		t.Fatalf("the surviving replica: %+v %v", bufs, err)
	}
	if m.Exist("onA") || m.Exist("unfinished") || !m.Exist("onB") {
		t.Fatal("a dead client's only replicas or unfinished puts survived")
	}
	if err := m.PutEnd("A", "unfinished"); code(t, err) != ObjectNotFound {
		t.Fatalf("PutEnd of a revoked put: %v", err)
	}
	if _, err := m.PutStart("B", "slow", 4096, 1, ""); err != nil {
		t.Fatal(err)
	}
	c.add(11 * time.Second)
	if _, err := m.PutStart("B", "other", 4096, 1, ""); err != nil { // reaps "slow"
		t.Fatal(err)
	}
	if err := m.PutEnd("B", "slow"); code(t, err) != ObjectNotFound {
		t.Fatalf("PutEnd after PutTimeout: %v", err)
	}
	// both, onB, other, and the space of unfinished and slow, held for DiscardDelay
	if s := m.Stats(); s.Segments != 1 || s.Used != roundUp(4096)*5 {
		t.Fatalf("stats %+v", s)
	}
	c.add(31 * time.Second)
	if _, err := m.PutStart("B", "later", 4096, 1, ""); err != nil { // reaps the held space
		t.Fatal(err)
	}
	if s := m.Stats(); s.Used != roundUp(4096)*4 { // both, onB, other, later
		t.Fatalf("stats after DiscardDelay %+v", s)
	}
}

// The space of a put that did not finish stays out of use for DiscardDelay: its writer may
// still have bytes on the way, which must not land in another object. Then it is reused.
func TestDiscardDelay(t *testing.T) {
	c := newClock()
	m := NewMaster(MasterConfig{LeaseTTL: time.Second, DiscardDelay: 5 * time.Second, HighWatermark: 1, Now: c.now})
	if err := m.MountSegment(seg("a", "A", 1<<30, 8192)); err != nil {
		t.Fatal(err)
	}
	first, err := m.PutStart("A", "k", 8192, 1, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.PutRevoke("A", "k"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.PutStart("B", "other", 8192, 1, ""); code(t, err) != NoAvailableHandle {
		t.Fatalf("a put into a revoked put's held space: %v", err)
	}
	c.add(6 * time.Second)
	again, err := m.PutStart("B", "other", 8192, 1, "")
	if err != nil || again[0].Addr != first[0].Addr {
		t.Fatalf("after DiscardDelay: %+v %v", again, err)
	}
}

// The allocator never hands out overlapping ranges, accounts every byte, and coalesces what
// is freed back into the whole segment.
func TestAllocator(t *testing.T) {
	const size = 1 << 20
	a := newAllocator(size)
	type r struct{ off, n uint64 }
	var live []r
	rng := rand.New(rand.NewSource(1))
	for i := 0; i < 20000; i++ {
		if len(live) > 0 && rng.Intn(2) == 0 {
			j := rng.Intn(len(live))
			a.release(live[j].off, live[j].n)
			live = append(live[:j], live[j+1:]...)
			continue
		}
		n := uint64(rng.Intn(8192) + 1)
		off, ok := a.alloc(n)
		if !ok {
			continue
		}
		if off%allocAlign != 0 || off+roundUp(n) > size {
			t.Fatalf("range [%d, +%d)", off, n)
		}
		for _, l := range live {
			if off < l.off+roundUp(l.n) && l.off < off+roundUp(n) {
				t.Fatalf("[%d, +%d) overlaps [%d, +%d)", off, n, l.off, l.n)
			}
		}
		live = append(live, r{off, n})
	}
	for _, l := range live {
		a.release(l.off, l.n)
	}
	if a.used != 0 || len(a.free) != 1 || a.free[0] != (span{0, size}) || a.largest() != size {
		t.Fatalf("after freeing everything: used %d, free %v", a.used, a.free)
	}
}

// An upsert inserts a new key, rewrites an object of the same shape in place (unreadable until
// PutEnd), replaces one of another size, and is refused while a get's lease holds the object;
// force removes a leased object.
func TestUpsertAndForce(t *testing.T) {
	c := newClock()
	m := newMaster(t, c, seg("a", "A", 1<<30, mb(16)), seg("b", "B", 2<<30, mb(16)))
	put := func(key string, size uint64, upsert bool) []Buffer {
		t.Helper()
		start := m.PutStart
		if upsert {
			start = m.UpsertStart
		}
		bufs, err := start("A", key, size, 1, "a")
		if err != nil {
			t.Fatal(err)
		}
		if err := m.PutEnd("A", key); err != nil {
			t.Fatal(err)
		}
		return bufs
	}
	first := put("u", 4096, true) // insert
	if _, err := m.PutStart("A", "u", 4096, 1, ""); code(t, err) != ObjectAlreadyExists {
		t.Fatalf("put of an existing key: %v", err)
	}
	again, err := m.UpsertStart("B", "u", 4096, 1, "")
	if err != nil || len(again) != 1 || again[0] != first[0] {
		t.Fatalf("an upsert of the same shape is not in place: %+v vs %+v, %v", again, first, err)
	}
	if m.Exist("u") {
		t.Fatal("an object being upserted is readable")
	}
	if _, err := m.UpsertStart("A", "u", 4096, 1, ""); code(t, err) != ReplicaIsNotReady {
		t.Fatalf("an upsert while another writes: %v", err)
	}
	if err := m.PutEnd("B", "u"); err != nil {
		t.Fatal(err)
	}
	used := m.Stats().Used
	bigger := put("u", 8192, true)
	if n, _ := m.Size("u"); n != 8192 || bigger[0].Size != 8192 || m.Stats().Used != used+4096 || m.Stats().Objects != 1 {
		t.Fatalf("replaced: %d bytes, %+v, %+v", n, bigger, m.Stats())
	}
	if _, _, err := m.GetReplicaList("u"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.UpsertStart("A", "u", 8192, 1, ""); code(t, err) != ObjectReplicaBusy {
		t.Fatalf("an upsert of a leased object: %v", err)
	}
	if n := m.RemoveAll(false); n != 0 {
		t.Fatalf("remove all took a leased object: %d", n)
	}
	if err := m.Remove("u", true); err != nil || m.Stats().Used != 0 {
		t.Fatalf("forced removal: %v, %+v", err, m.Stats())
	}
}
