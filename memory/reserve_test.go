package memory

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hmc-go/hmc/status"
)

const testBase = 0x3f00_0000_0000 // above Go's heap hints, below the fabric's GVA window

func TestReserveMapUnmap(t *testing.T) {
	r, err := Reserve(testBase, 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Release()
	if _, err := Reserve(testBase+4<<20, 8<<20); !errors.Is(err, ErrAddressInUse) {
		t.Fatalf("overlapping reserve: %v, want ErrAddressInUse", err)
	}
	fd, err := unix.MemfdCreate("t", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, 4<<20); err != nil {
		t.Fatal(err)
	}
	a, err := r.MapShared(2<<20, 2<<20, fd, 0)
	if err != nil {
		t.Fatal(err)
	}
	if AddrOf(a) != testBase+2<<20 {
		t.Fatalf("mapped at %#x", AddrOf(a))
	}
	b, err := r.MapShared(4<<20, 2<<20, fd, 0) // the same pages twice
	if err != nil {
		t.Fatal(err)
	}
	a[100] = 7
	if b[100] != 7 {
		t.Fatal("the two mappings of one memfd differ")
	}
	if _, err := r.MapShared(3<<20, 2<<20, fd, 0); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatalf("overlapping map: %v", err)
	}
	if _, err := r.MapShared(7<<20, 2<<20, fd, 0); !errors.Is(err, status.ErrOutOfRange) {
		t.Fatalf("map past the end: %v", err)
	}
	if err := r.Unmap(4 << 20); err != nil {
		t.Fatal(err)
	}
	if err := r.Unmap(4 << 20); !errors.Is(err, status.ErrNotFound) {
		t.Fatalf("second unmap: %v", err)
	}
	if a[100] != 7 {
		t.Fatal("unmapping one view lost the memory")
	}
	if err := r.Release(); err != nil {
		t.Fatal(err)
	}
	r2, err := Reserve(testBase, 8<<20) // free again
	if err != nil {
		t.Fatal(err)
	}
	r2.Release()
}

func TestReserveRejects(t *testing.T) {
	for _, c := range [][2]uint64{{0, 4096}, {testBase, 0}, {testBase + 1, 4096}, {testBase, 4097}, {^uint64(0) &^ 4095, 8192}} {
		if _, err := Reserve(c[0], c[1]); !errors.Is(err, status.ErrInvalidConfig) {
			t.Errorf("Reserve(%#x, %#x): %v", c[0], c[1], err)
		}
	}
}
