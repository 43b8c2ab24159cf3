package buffer

import (
	"bytes"
	"errors"
	"math"
	"testing"

	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
)

func newCPU(t testing.TB, size uint64) *ConnBuffer {
	t.Helper()
	c, err := New(0, size, memory.CPU)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestWriteReadRoundTrip(t *testing.T) {
	c := newCPU(t, 1<<20)
	if c.Type() != memory.CPU || c.Size() != 1<<20 || c.FD() < 0 || c.Memory() == nil {
		t.Fatal("accessors")
	}
	src := []byte("hello hmc")
	if err := c.WriteFromCPU(src, 100); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, len(src))
	if err := c.ReadToCPU(dst, 100); err != nil || !bytes.Equal(dst, src) {
		t.Fatalf("read %q %v", dst, err)
	}
	// Last byte of the buffer.
	if err := c.WriteFromCPU([]byte{7}, c.Size()-1); err != nil {
		t.Fatal(err)
	}
	s, err := c.Slice(c.Size()-1, 1)
	if err != nil || s[0] != 7 || cap(s) != 1 {
		t.Fatalf("slice %v %v", s, err)
	}
}

func TestCopyWithinOverlap(t *testing.T) {
	c := newCPU(t, 64)
	_ = c.WriteFromCPU([]byte("0123456789"), 0)
	if err := c.CopyWithin(2, 0, 10); err != nil {
		t.Fatal(err)
	}
	got, _ := c.Slice(0, 12)
	if string(got) != "010123456789" {
		t.Fatalf("got %q", got)
	}
	if err := c.CopyWithin(5, 5, 10); err != nil {
		t.Fatal(err)
	}
	if err := c.CopyWithin(0, 0, 0); err != nil {
		t.Fatal(err)
	}
}

func TestOutOfRangeTouchesNothing(t *testing.T) {
	const size = 4096
	c := newCPU(t, size)
	before := bytes.Repeat([]byte{0xAB}, size)
	_ = c.WriteFromCPU(before, 0)
	cases := []struct {
		name string
		off  uint64
		n    int
	}{
		{"past end by one", size - 9, 10},
		{"offset past end", size + 1, 0},
		{"offset at end, one byte", size, 1},
		{"wraps around", math.MaxUint64 - 2, 8},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			buf := make([]byte, tc.n)
			for _, err := range []error{
				c.WriteFromCPU(buf, tc.off),
				c.ReadToCPU(buf, tc.off),
				c.CopyWithin(tc.off, 0, uint64(tc.n)),
				c.CopyWithin(0, tc.off, uint64(tc.n)),
				c.Check(tc.off, uint64(tc.n)),
			} {
				if !errors.Is(err, status.ErrOutOfRange) || !errors.Is(err, status.ErrInvalidConfig) {
					t.Fatalf("want out of range, got %v", err)
				}
			}
			if _, err := c.Slice(tc.off, uint64(tc.n)); !errors.Is(err, status.ErrOutOfRange) {
				t.Fatal(err)
			}
		})
	}
	// The wrap-around case: off+n overflows to a small number. Nothing may be written.
	if err := c.CopyWithin(0, math.MaxUint64, 2); err == nil {
		t.Fatal("wrapped copy accepted")
	}
	if !bytes.Equal(c.Bytes(), before) {
		t.Fatal("a refused call changed the buffer")
	}
	if err := c.Check(size, 0); err != nil {
		t.Fatalf("empty range at the end must be valid: %v", err)
	}
}

func TestGPUCallsOnCPUBuffer(t *testing.T) {
	c := newCPU(t, 64)
	if err := c.WriteFromGPU(c.Ptr(), 8, 0); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatal(err)
	}
	if err := c.ReadToGPU(c.Ptr(), 8, 0); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatal(err)
	}
}

func TestNewErrors(t *testing.T) {
	if _, err := New(0, 0, memory.CPU); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatal(err)
	}
	if _, err := New(0, 10, memory.MooreGPU); !errors.Is(err, status.ErrUnsupported) {
		t.Fatal(err)
	}
	c, err := New(0, 10, memory.Default)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestDeviceBuffer(t *testing.T) {
	if err := memory.Probe(memory.NvidiaGPU); err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	c, err := New(0, 1<<20, memory.NvidiaGPU)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Bytes() != nil {
		t.Fatal("device buffer exposes host bytes")
	}
	src := bytes.Repeat([]byte("gpu!"), 1000)
	if err := c.WriteFromCPU(src, 4096); err != nil {
		t.Fatal(err)
	}
	if err := c.CopyWithin(0, 4096, uint64(len(src))); err != nil {
		t.Fatal(err)
	}
	other, _ := c.Memory().Alloc(uint64(len(src)))
	if err := c.ReadToGPU(other.Ptr(), uint64(len(src)), 0); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteFromGPU(other.Ptr(), uint64(len(src)), 1<<19); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, len(src))
	if err := c.ReadToCPU(dst, 1<<19); err != nil || !bytes.Equal(dst, src) {
		t.Fatalf("gpu round trip: %v", err)
	}
	if _, err := c.Slice(0, 1); !errors.Is(err, status.ErrUnsupported) {
		t.Fatal(err)
	}
}

func FuzzCheckRange(f *testing.F) {
	f.Add(uint64(4096), uint64(0), uint64(4096))
	f.Add(uint64(4096), uint64(math.MaxUint64), uint64(2))
	f.Fuzz(func(t *testing.T, size, off, n uint64) {
		err := CheckRange(size, off, n)
		// Oracle: exact arithmetic in 128 bits.
		fits := off <= size && n <= size && off+n >= off && off+n <= size
		if (err == nil) != fits {
			t.Fatalf("CheckRange(%d,%d,%d) = %v, fits=%v", size, off, n, err, fits)
		}
	})
}

// Adopt makes memory another library allocated a ConnBuffer: no memfd, the bytes are the ones
// given, copies work, and Close gives the memory back once.
func TestAdopt(t *testing.T) {
	if _, err := Adopt(nil, func() error { return nil }); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatalf("empty: %v", err)
	}
	if _, err := Adopt(make([]byte, 8), nil); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatalf("no release: %v", err)
	}
	mem := make([]byte, 4096)
	released := 0
	b, err := Adopt(mem, func() error { released++; return nil })
	if err != nil {
		t.Fatal(err)
	}
	if b.FD() != -1 || b.Size() != 4096 || b.Type() != memory.CPU || &b.Bytes()[0] != &mem[0] {
		t.Fatalf("fd %d size %d type %v", b.FD(), b.Size(), b.Type())
	}
	if err := b.WriteFromCPU([]byte("adopted"), 100); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mem[100:107], []byte("adopted")) {
		t.Fatal("write did not land in the adopted memory")
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil || released != 1 {
		t.Fatalf("second Close: %v, released %d times", err, released)
	}
}
