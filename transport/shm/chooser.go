package shm

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"
)

// chooser decides, copy by copy, whether a large copy is shared with the endpoint's helpers or
// made by the caller alone, from what each way has been costing lately on this machine.
//
// Sharing pays only while a core is free for the helpers. When other processes keep every core
// busy, a helper is descheduled in the middle of its piece and the caller waits for it, and a
// shared copy can cost more than one memcpy; with a free core it costs half (docs/performance.md "Shared memory",
// bench/compare-shm-cores.sh). No load figure says which case holds (/proc shows the host from
// inside a container, and a core free now may be taken a millisecond later), so the copies
// measure it: each size class (a power of two) keeps a moving average of the time per byte of
// shared and of solo copies, takes the cheaper way, and tries the other way again once every
// probeEvery, so a change in the machine's load is noticed within a few probes. Probing costs
// at most one slower copy per probeEvery (about 1 % of a stream of 4 MiB copies).
type chooser struct {
	classes [classes]sizeClass
}

const (
	classes    = 8                     // size classes from 2^minClass bytes
	minClass   = 20                    // 1 MiB, DefaultParallelThreshold
	probeEvery = 10 * time.Millisecond // how often the costlier way is tried again
	weight     = 4                     // a new sample moves the average 1/weight of the way (1/2 for a probe)
)

type sizeClass struct {
	way [2]wayCost // [0] solo, [1] shared
	// A probe of sharing after solo copies finds the helpers parked, and its first copy pays
	// their wake-up, which a stream of shared copies does not: the probe is a burst of
	// probeBurst shared copies whose first is not measured.
	burst   atomic.Int32 // shared copies of the probe still to come
	warming atomic.Bool  // the probe's first shared copy is not recorded
}

const probeBurst = 3

type wayCost struct {
	perByte atomic.Uint64 // float64 bits: moving average of ns per byte; 0 until measured
	probed  atomic.Int64  // unix ns when this way was last measured or chosen as a probe
	sampled atomic.Int64  // unix ns when this way was last measured
}

func (c *chooser) of(n uint64) *sizeClass {
	i := max(0, min(bits.Len64(n)-1-minClass, classes-1))
	return &c.classes[i]
}

func (w *wayCost) cost() float64 { return math.Float64frombits(w.perByte.Load()) }

// pick says whether the copy of n bytes starting at now is shared. A way not yet measured is
// tried first, sharing before solo.
func (c *chooser) pick(n uint64, now time.Time) bool {
	sc := c.of(n)
	solo, shared := sc.way[0].cost(), sc.way[1].cost()
	switch {
	case shared == 0:
		return true
	case solo == 0:
		return false
	}
	if b := sc.burst.Load(); b > 0 && sc.burst.CompareAndSwap(b, b-1) {
		return true // the rest of a probe of sharing
	}
	best := 0
	if shared <= solo {
		best = 1
	}
	other := &sc.way[1-best]
	t := now.UnixNano()
	if last := other.probed.Load(); t-last >= int64(probeEvery) && other.probed.CompareAndSwap(last, t) {
		if best == 0 { // this caller starts a probe of sharing
			sc.warming.Store(true)
			sc.burst.Store(probeBurst - 1)
		}
		return best == 0 // this caller probes the costlier way
	}
	return best == 1
}

// record adds a copy's time per byte to its way's average. A way measured again after a
// probeEvery or more (a probe of the costlier way) takes the new sample at half weight, unclipped:
// its average is old news, and the probe is what tells whether the machine changed.
func (c *chooser) record(n uint64, shared bool, start, end time.Time) {
	sc := c.of(n)
	w := &sc.way[0]
	if shared {
		if sc.warming.CompareAndSwap(true, false) {
			return // the helpers' wake-up, not what sharing costs
		}
		w = &sc.way[1]
	}
	x := float64(end.Sub(start).Nanoseconds()) / float64(n)
	if old := w.cost(); old != 0 {
		if start.UnixNano()-w.sampled.Load() >= int64(probeEvery) {
			x = old + (x-old)/2
		} else {
			// One slow copy (a late wake-up, a page fault) moves the average by a quarter of
			// at most the average itself: a stream of them, as when the helpers have no core,
			// turns it within a few copies; a lone one does not.
			x = old + (min(x, 2*old)-old)/weight
		}
	}
	w.perByte.Store(math.Float64bits(x)) // racing updates lose a sample, no more
	w.probed.Store(end.UnixNano())
	w.sampled.Store(end.UnixNano())
}
