package gva

import (
	"context"
	"errors"
	"testing"

	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/memory"
)

func TestLayout(t *testing.T) {
	l := Layout{Base: WindowStart, Stride: 8 << 20, Ranks: 4}
	for _, c := range []struct {
		addr uint64
		rank int
		off  uint64
	}{{WindowStart, 0, 0}, {WindowStart + 8<<20 + 5, 1, 5}, {WindowStart + 32<<20 - 1, 3, 8<<20 - 1}, {WindowStart + 32<<20, -1, 0}, {WindowStart - 1, -1, 0}} {
		if r, off := l.RankOf(c.addr); r != c.rank || off != c.off {
			t.Errorf("RankOf(%#x) = %d, %#x; want %d, %#x", c.addr, r, off, c.rank, c.off)
		}
	}
	if !l.Contains(WindowStart, 32<<20) || l.Contains(WindowStart+1, 32<<20) || l.Contains(^uint64(0), 2) {
		t.Error("Contains")
	}
}

// Two reservations of one process never overlap; a published layout is taken by the next
// creator, and a clash (here: the same process reserving it twice) is a typed error.
func TestReservePublished(t *testing.T) {
	srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx := context.Background()
	c, err := store.Open(ctx, srv.URL(), store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a, err := ReservePublished(ctx, c, "a", 2<<20, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release()
	b, err := Reserve(0, 2<<20, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	if b.Base < a.Base+a.Size() && a.Base < b.Base+b.Size() {
		t.Fatalf("overlap: %#x and %#x", a.Base, b.Base)
	}
	if _, err := ReservePublished(ctx, c, "a", 2<<20, 4); !errors.Is(err, memory.ErrAddressInUse) {
		t.Fatalf("second reservation at the published base: %v", err)
	}
	if _, err := ReservePublished(ctx, c, "a", 4<<20, 4); !errors.Is(err, ErrLayout) {
		t.Fatalf("another stride: %v", err)
	}
}
