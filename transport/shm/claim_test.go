package shm

import (
	"slices"
	"sync"
	"testing"
	"time"
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

// TestClaimGuided: a vector job's claims shrink as it empties, a quarter of what is left and
// at least an eighth of the group, so that the last claims of two cores end close together;
// a contiguous job's (g 1) stay one unit.
func TestClaimGuided(t *testing.T) {
	for _, c := range []struct {
		units, g uint32
		want     []uint32
	}{
		{512, 128, []uint32{128, 96, 72, 54, 40, 30, 23, 17, 16, 16, 16, 4}},
		{100, 128, []uint32{25, 18, 16, 16, 16, 9}},
		{10, 1, []uint32{1, 1, 1, 1, 1, 1, 1, 1, 1, 1}},
		{3, 8, []uint32{1, 1, 1}},
	} {
		j := &copyJob{units: c.units}
		j.ends.Store(uint64(c.units) << 32)
		var got []uint32
		for {
			from, to := j.claim(c.g, false)
			if from >= to {
				break
			}
			got = append(got, to-from)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%d units by %d: claims %v, want %v", c.units, c.g, got, c.want)
		}
	}
}

// TestShareWaitsForEmptyClaims: a shared vector job returns only once every claim is done,
// claims of empty pieces too. When the job counted bytes, a helper still walking a group of
// empty pieces (pieces moved on their own have none) kept reading the caller's lists after
// share returned, and the next vector, reusing the lists, could be copied by that helper into
// the last vector's buffers. Here the lists are refilled the moment share returns; a helper
// still reading them would copy a byte into a fresh destination (and -race reports the read).
func TestShareWaitsForEmptyClaims(t *testing.T) {
	const pieces, group = 1 << 18, 1 << 17 // the first claims: a quarter each
	for range 20 {
		h := newHelpers(1, time.Millisecond)
		src := []byte{1}
		vs, vd := make([][]byte, pieces), make([][]byte, pieces)
		vs[0], vd[0] = src, make([]byte, 1) // one byte to copy, the rest empty
		j := &copyJob{vd: vd, vs: vs, units: pieces, group: group, pieceMin: DefaultPieceSize}
		h.share(j, 1)
		if vd[0][0] != 1 {
			t.Fatalf("piece 0 not copied: %d", vd[0][0])
		}
		fresh := make([]byte, pieces)
		for k := pieces - 1; k > 0; k-- { // from the end: a helper still walking up meets them
			vs[k], vd[k] = src, fresh[k:k+1]
		}
		h.close() // waits for the helper
		if k := slices.Index(fresh[1:], 1); k >= 0 {
			t.Fatalf("piece %d copied after share returned", k+1)
		}
	}
}
