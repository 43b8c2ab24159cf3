package shm

import (
	"sync"
	"testing"
)

// TestClaimBothEnds: the caller's claims from a job's front and the helpers' from its back,
// racing, take every unit exactly once; the caller's come in order from 0 and each helper's
// in descending order from the end.
func TestClaimBothEnds(t *testing.T) {
	for _, c := range []struct{ units, g uint32 }{{1, 1}, {7, 1}, {8, 3}, {512, 128}, {1000, 7}, {1 << 20, 64}} {
		j := &copyJob{units: c.units}
		j.ends.Store(uint64(c.units) << 32)
		taken := make([]int32, c.units)
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				back := w > 0
				last := int64(-1)
				if back {
					last = int64(c.units) + 1
				}
				for {
					from, to := j.claim(c.g, back)
					if from >= to {
						return
					}
					if to-from > c.g || to > c.units {
						t.Errorf("%d units by %d: claim [%d, %d)", c.units, c.g, from, to)
						return
					}
					if (!back && int64(from) <= last) || (back && int64(to) > last) {
						t.Errorf("%d units by %d: claim [%d, %d) out of its end's order (last %d)", c.units, c.g, from, to, last)
						return
					}
					last = int64(from)
					for k := from; k < to; k++ {
						taken[k]++ // distinct claims never overlap, so no two goroutines write one k
					}
				}
			}()
		}
		wg.Wait()
		for k, n := range taken {
			if n != 1 {
				t.Fatalf("%d units by %d: unit %d taken %d times", c.units, c.g, k, n)
			}
		}
	}
}
