package shm

// The benchmarks behind Config's defaults: worker count and piece size for cache-resident
// (4 MiB) and DRAM-sized (256 MiB) copies, and glibc's memcpy against Go's copy.

import (
	"bytes"
	"fmt"
	"testing"
	"time"
	"unsafe"
)

func BenchmarkCopyShapes(b *testing.B) {
	for _, size := range []uint64{4 << 20, 256 << 20} {
		src, dst := make([]byte, size), make([]byte, size)
		for i := range src {
			src[i], dst[i] = byte(i), byte(i>>8)
		}
		for _, w := range []int{1, 2} {
			for _, piece := range []uint64{128 << 10, 256 << 10, 512 << 10, 64 << 20} {
				ep := &endpoint{cfg: Config{Workers: w, PieceSize: piece, ParallelThreshold: 1 << 20, HugeCopy: 64 << 20},
					helpers: newHelpers(w-1, 50*time.Microsecond)}
				defer ep.helpers.close()
				b.Run(fmt.Sprintf("%dMiB/w%d/p%dK", size>>20, w, piece>>10), func(b *testing.B) {
					b.SetBytes(int64(size))
					for b.Loop() {
						ep.copy(dst, src)
					}
				})
			}
		}
	}
}

func BenchmarkLibcMemcpy(b *testing.B) {
	mc := libcMemcpy()
	if mc == nil {
		b.Skip("no libc")
	}
	for _, size := range []uint64{4 << 20, 256 << 20} {
		src, dst := make([]byte, size), make([]byte, size)
		for i := range src {
			src[i], dst[i] = byte(i), byte(i>>8)
		}
		b.Run(fmt.Sprintf("%dMiB", size>>20), func(b *testing.B) {
			b.SetBytes(int64(size))
			for b.Loop() {
				mc(unsafe.Pointer(&dst[0]), unsafe.Pointer(&src[0]), uintptr(size))
			}
		})
	}
}

// The chooser takes the way that has been cheaper for the size, tries the other one again
// every probeEvery (one caller at a time), keeps size classes apart, and follows a change:
// sharing that starts stalling loses to solo within a few copies, and wins back when it
// recovers. The bytes are right either way.
func TestChooserFollowsCost(t *testing.T) {
	var c chooser
	const n = 4 << 20
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	if !c.pick(n, t0) {
		t.Fatal("sharing is not tried first")
	}
	c.record(n, true, t0, at(150*time.Microsecond)) // shared: 150 µs
	if c.pick(n, t0) {
		t.Fatal("solo is not measured once")
	}
	c.record(n, false, t0, at(300*time.Microsecond)) // solo: 300 µs
	now := at(time.Millisecond)
	if !c.pick(n, now) {
		t.Fatal("the cheaper way (shared) not taken")
	}
	probes := 0
	for i := range 100 { // 100 copies over 20 ms: the costlier way is probed twice at most
		if !c.pick(n, now.Add(time.Duration(i)*200*time.Microsecond)) {
			probes++
		}
	}
	if probes < 1 || probes > 3 {
		t.Fatalf("%d probes of solo in 20 ms, want 1-3 (every %v)", probes, probeEvery)
	}
	// best picks twice at ts: the first may be the other way's probe, the second is not.
	best := func(size uint64, ts time.Time) bool {
		c.pick(size, ts)
		return c.pick(size, ts)
	}
	// Sharing starts stalling (cores taken): a few slow shared copies and solo wins.
	for i := range 6 {
		end := at(time.Duration(21+i) * time.Millisecond)
		c.record(n, true, end.Add(-2*time.Millisecond), end)
	}
	if best(n, at(30*time.Millisecond)) {
		t.Fatal("sharing still taken after it stalled")
	}
	// Another size class is its own.
	if !best(1<<20, at(30*time.Millisecond)) {
		t.Fatal("1 MiB copies judged by 4 MiB's costs")
	}
	// Sharing recovers: each probe measures it cheap again, and a few bring it back.
	for i := range 12 {
		ts := at(time.Duration(40+10*i) * time.Millisecond)
		if c.pick(n, ts) {
			c.record(n, true, ts, ts.Add(100*time.Microsecond))
		}
	}
	if !best(n, at(200*time.Millisecond)) {
		t.Fatal("sharing not taken back after it recovered")
	}

	cp, err := NewCopier(Config{Workers: 2, ParallelThreshold: 64 << 10, PieceSize: 16 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Close()
	src, dst := make([]byte, 1<<20), make([]byte, 1<<20)
	for round := range 50 { // both ways are taken in the first rounds
		for i := range src {
			src[i] = byte(i*7+round) ^ byte(i>>9)
		}
		cp.Copy(dst, src)
		if !bytes.Equal(dst, src) {
			t.Fatalf("round %d: copy moved the wrong bytes", round)
		}
	}
}
