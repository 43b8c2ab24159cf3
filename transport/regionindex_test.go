package transport

import (
	"errors"
	"testing"

	"github.com/hmc-go/hmc/status"
)

func TestRegionIndex(t *testing.T) {
	var x RegionIndex[string]
	if err := x.Add(1, 1000, 100, "a"); err != nil {
		t.Fatal(err)
	}
	if err := x.Add(2, 2000, 10, "b"); err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][2]uint64{{1050, 10}, {990, 20}, {1099, 1000}, {1995, 6}} {
		if err := x.Add(3, bad[0], bad[1], "c"); !errors.Is(err, status.ErrProtocol) {
			t.Fatalf("overlap %v: %v", bad, err)
		}
	}
	cases := []struct {
		dst  Remote
		n    uint64
		want string
		off  uint64
		ok   bool
	}{
		{Remote{Addr: 1000}, 100, "a", 0, true},
		{Remote{Addr: 1099}, 1, "a", 99, true},
		{Remote{Addr: 1099}, 2, "", 0, false},
		{Remote{Addr: 1100}, 1, "", 0, false},
		{Remote{Addr: 999}, 1, "", 0, false},
		{Remote{Key: 2, Addr: 9}, 1, "b", 9, true},
		{Remote{Key: 2, Addr: 9}, 2, "", 0, false},
		{Remote{Key: 7}, 1, "", 0, false},
	}
	for _, c := range cases {
		r, off, ok := x.Lookup(c.dst, c.n)
		if ok != c.ok || r != c.want || off != c.off {
			t.Fatalf("%+v %d: %q %d %v", c.dst, c.n, r, off, ok)
		}
	}
	if r, ok := x.Remove(1); !ok || r != "a" {
		t.Fatal("remove")
	}
	if _, _, ok := x.Lookup(Remote{Addr: 1000}, 1); ok {
		t.Fatal("found after remove")
	}
	if all := x.Reset(); len(all) != 1 || all[0] != "b" {
		t.Fatalf("reset %v", all)
	}
}
