package shmem

import (
	"testing"
	"time"
)

// TestTeamBarrierChoice: a team's barrier is central only when every member told the others at
// Create that it maps the first member's private block; a short or missing bitmap counts as no.
func TestTeamBarrierChoice(t *testing.T) {
	h := &Heap{w: &World{world: 10}}
	all := []byte{0xff, 0x03}
	h.maps = [][]byte{all, all, {0x05, 0}, all, {0x01}, all, all, all, all, nil}
	for _, c := range []struct {
		members []int
		central bool
	}{
		{[]int{0, 1, 3}, true},
		{[]int{0, 2, 4}, true},  // 2 and 4 map rank 0
		{[]int{1, 2}, false},    // 2 does not map rank 1
		{[]int{2, 0}, true},     // 0 maps 2 (and 2 itself)
		{[]int{8, 0, 4}, false}, // 4's bitmap is one byte: rank 8 unknown
		{[]int{0, 9}, false},    // 9 sent nothing
		{[]int{5}, true},
	} {
		if got := h.newTeam(c.members, 0, 1).central; got != c.central {
			t.Errorf("members %v: central %v, want %v", c.members, got, c.central)
		}
	}
	if h.rankMaps(-1, 0) || h.rankMaps(0, 16) || h.rankMaps(10, 0) {
		t.Error("out-of-range ranks map nothing")
	}
}

// TestNapGrows: a sleep's bound starts at futexNap and grows to an eighth of the wait so far,
// never past the cap it is given.
func TestNapGrows(t *testing.T) {
	for _, c := range []struct{ waited, most, want time.Duration }{
		{0, futexNapMax, futexNap},
		{200 * time.Microsecond, futexNapMax, futexNap},
		{2 * time.Millisecond, futexNapMax, 250 * time.Microsecond},
		{time.Second, futexNapMax, futexNapMax},
		{time.Second, wokenNapMax, wokenNapMax},
		{40 * time.Millisecond, wokenNapMax, 5 * time.Millisecond},
	} {
		if got := napFor(c.waited, c.most); got != c.want {
			t.Errorf("napFor(%v, %v) = %v, want %v", c.waited, c.most, got, c.want)
		}
	}
}
