package shmem

import "testing"

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
