package memory

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hmc-go/hmc/status"
)

func TestTypeValuesPinned(t *testing.T) {
	want := []struct {
		t    Type
		v    int
		name string
	}{
		{Default, 0, "DEFAULT"}, {CPU, 1, "CPU"}, {NvidiaGPU, 2, "NVIDIA_GPU"}, {AMDGPU, 3, "AMD_GPU"},
		{CambriconMLU, 4, "CAMBRICON_MLU"}, {MooreGPU, 5, "MOORE_GPU"}, {HuaweiAscendNPU, 6, "HUAWEI_ASCEND_NPU"},
	}
	for _, w := range want {
		if int(w.t) != w.v || w.t.String() != w.name {
			t.Errorf("%v = %d, want %s = %d", w.t, int(w.t), w.name, w.v)
		}
		p, err := ParseType(w.name)
		if err != nil || p != w.t {
			t.Errorf("ParseType(%q) = %v, %v", w.name, p, err)
		}
	}
	if _, err := ParseType("tpu"); !errors.Is(err, status.ErrInvalidConfig) {
		t.Errorf("ParseType(tpu) = %v", err)
	}
	if CPU.IsDevice() || !NvidiaGPU.IsDevice() || Type(99).IsDevice() {
		t.Error("IsDevice")
	}
}

func TestHostAllocCopyFree(t *testing.T) {
	m, err := New(0, CPU)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, size := range []uint64{1, 4095, 4096, 4097, 3 << 20} {
		b, err := m.Alloc(size)
		if err != nil {
			t.Fatal(err)
		}
		if b.Size() != size || uint64(len(b.Bytes())) != size || b.FD() < 0 || b.Type() != CPU {
			t.Fatalf("buffer %d: size %d len %d fd %d", size, b.Size(), len(b.Bytes()), b.FD())
		}
		if uintptr(b.Ptr())%uintptr(os.Getpagesize()) != 0 {
			t.Fatalf("not page-aligned: %#x", b.Ptr())
		}
		if !bytes.Equal(b.Bytes(), make([]byte, size)) {
			t.Fatal("not zeroed")
		}
		seals, err := unix.FcntlInt(uintptr(b.FD()), unix.F_GET_SEALS, 0)
		if err != nil || seals&unix.F_SEAL_SHRINK == 0 || seals&unix.F_SEAL_SEAL == 0 {
			t.Fatalf("memfd seals %#x, %v", seals, err)
		}
		src := pattern(size, 7)
		if err := m.CopyHostToDevice(b.Ptr(), src); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b.Bytes(), src) {
			t.Fatal("H2D mismatch")
		}
		dst := make([]byte, size)
		if err := m.CopyDeviceToHost(dst, b.Ptr()); err != nil || !bytes.Equal(dst, src) {
			t.Fatalf("D2H mismatch: %v", err)
		}
		if size > 1 {
			// Overlapping D2D is memmove.
			if err := m.CopyDeviceToDevice(b.Ptr()+1, b.Ptr(), size-1); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(b.Bytes()[1:], src[:size-1]) {
				t.Fatal("overlapping D2D mismatch")
			}
		}
		if err := m.Free(b); err != nil {
			t.Fatal(err)
		}
		if err := m.Free(b); !errors.Is(err, status.ErrInvalidConfig) {
			t.Fatalf("double free: %v", err)
		}
	}
}

func TestHostBadInput(t *testing.T) {
	m, err := New(0, CPU)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Alloc(0); !errors.Is(err, status.ErrInvalidConfig) {
		t.Errorf("alloc 0: %v", err)
	}
	if _, err := m.Alloc(1 << 63); !errors.Is(err, status.ErrInvalidConfig) {
		t.Errorf("alloc 2^63: %v", err)
	}
	if err := m.Free(nil); !errors.Is(err, status.ErrInvalidConfig) {
		t.Errorf("free nil: %v", err)
	}
	other, _ := New(0, CPU)
	b, _ := other.Alloc(10)
	if err := m.Free(b); !errors.Is(err, status.ErrInvalidConfig) {
		t.Errorf("foreign free: %v", err)
	}
	if err := m.CopyHostToDevice(0, []byte{1}); !errors.Is(err, status.ErrInvalidConfig) {
		t.Errorf("copy to null: %v", err)
	}
	if err := m.CopyDeviceToHost([]byte{1}, 0); !errors.Is(err, status.ErrInvalidConfig) {
		t.Errorf("copy from null: %v", err)
	}
	if err := m.CopyDeviceToDevice(0, b.Ptr(), 1); !errors.Is(err, status.ErrInvalidConfig) {
		t.Errorf("d2d null: %v", err)
	}
	if err := m.CopyHostToDevice(0, nil); err != nil {
		t.Errorf("empty copy: %v", err)
	}
	if err := other.Close(); err != nil { // frees b
		t.Fatal(err)
	}
	if err := other.Close(); err != nil {
		t.Fatal("second Close", err)
	}
	if _, err := other.Alloc(1); !errors.Is(err, status.ErrClosed) {
		t.Errorf("alloc after close: %v", err)
	}
	m.Close()
	if _, err := New(-1, CPU); !errors.Is(err, status.ErrInvalidConfig) {
		t.Errorf("device -1: %v", err)
	}
	if _, err := New(0, Type(42)); !errors.Is(err, status.ErrInvalidConfig) {
		t.Errorf("type 42: %v", err)
	}
}

func TestUnimplementedTypesAreUnsupported(t *testing.T) {
	for _, ty := range []Type{CambriconMLU, MooreGPU, HuaweiAscendNPU} {
		_, err := New(0, ty)
		if !errors.Is(err, status.ErrUnsupported) || status.CodeOf(err) != status.Unsupported {
			t.Errorf("%v: %v", ty, err)
		}
		if err := Probe(ty); !errors.Is(err, status.ErrUnsupported) {
			t.Errorf("Probe(%v): %v", ty, err)
		}
	}
}

// requireGPU skips when memory of type ty is not usable, or fails if HMC_REQUIRE_GPU (a
// comma-separated list of type names, e.g. NVIDIA_GPU) names it.
func requireGPU(t *testing.T, ty Type) {
	t.Helper()
	if err := Probe(ty); err != nil {
		if !errors.Is(err, status.ErrUnsupported) {
			t.Fatalf("Probe(%v) returned a non-UNSUPPORT error: %v", ty, err)
		}
		for _, want := range strings.Split(os.Getenv("HMC_REQUIRE_GPU"), ",") {
			if strings.EqualFold(strings.TrimSpace(want), ty.String()) {
				t.Fatalf("HMC_REQUIRE_GPU names %v but it is unavailable: %v", ty, err)
			}
		}
		t.Skipf("%v not available here: %v", ty, err)
	}
}

func TestDefaultResolves(t *testing.T) {
	m, err := New(0, Default)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.Type() == Default {
		t.Fatal("Default not resolved")
	}
	if Probe(NvidiaGPU) != nil && Probe(AMDGPU) != nil && m.Type() != CPU {
		t.Fatalf("no GPU here, Default resolved to %v", m.Type())
	}
}

func TestDeviceMemory(t *testing.T) {
	for _, ty := range []Type{NvidiaGPU, AMDGPU} {
		t.Run(ty.String(), func(t *testing.T) {
			requireGPU(t, ty)
			m, err := New(0, ty)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			const size = 8<<20 + 3
			a, err := m.Alloc(size)
			if err != nil {
				t.Fatal(err)
			}
			b, err := m.Alloc(size)
			if err != nil {
				t.Fatal(err)
			}
			if a.Bytes() != nil || a.FD() != -1 {
				t.Fatal("device buffer has host bytes")
			}
			src := pattern(size, 3)
			if err := m.CopyHostToDevice(a.Ptr(), src); err != nil {
				t.Fatal(err)
			}
			if err := m.CopyDeviceToDevice(b.Ptr(), a.Ptr(), size); err != nil {
				t.Fatal(err)
			}
			dst := make([]byte, size)
			if err := m.CopyDeviceToHost(dst, b.Ptr()); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(dst, src) {
				t.Fatal("device round trip mismatch")
			}
			if err := m.Free(a); err != nil {
				t.Fatal(err)
			}
			if _, err := New(1<<20, ty); !errors.Is(err, status.ErrInvalidConfig) {
				t.Fatalf("device 2^20: %v", err)
			}
		})
	}
	t.Run("missing-library-is-unsupported", func(t *testing.T) {
		if Probe(NvidiaGPU) == nil {
			t.Skip("CUDA present: the missing-library path cannot be observed")
		}
		_, err := New(0, NvidiaGPU)
		if !errors.Is(err, status.ErrUnsupported) {
			t.Fatalf("New(NVIDIA) without CUDA: %v", err)
		}
		t.Logf("reason given: %v", err)
	})
}

func pattern(n uint64, seed byte) []byte {
	b := make([]byte, n)
	x := uint32(seed) + 1
	for i := range b {
		x = x*1664525 + 1013904223
		b[i] = byte(x >> 24)
	}
	return b
}

func BenchmarkHostCopy(b *testing.B) {
	m, _ := New(0, CPU)
	defer m.Close()
	buf, _ := m.Alloc(4 << 20)
	src := make([]byte, 4<<20)
	b.SetBytes(int64(len(src)))
	for b.Loop() {
		_ = m.CopyHostToDevice(buf.Ptr(), src)
	}
}

// PinHost page-locks a shared mapping this package did not allocate; device copies into and out
// of it keep every byte, and it unpins before the unmap. CPU memory has nothing to pin. Without a
// device the emulation's no-op pin is what runs.
func TestPinHost(t *testing.T) {
	m := nvidiaOrEmulated(t)
	const size = 4<<20 + 5
	host := sharedMapping(t, size)
	unpin, err := m.PinHost(host)
	if err != nil {
		t.Fatal(err)
	}
	d, err := m.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	src := pattern(size, 9)
	if err := m.CopyHostToDevice(d.Ptr(), src); err != nil {
		t.Fatal(err)
	}
	if err := m.CopyDeviceToHost(host, d.Ptr()); err != nil || !bytes.Equal(host, src) {
		t.Fatalf("into pinned memory: %v", err)
	}
	copy(host, pattern(size, 10))
	if err := m.CopyHostToDevice(d.Ptr(), host); err != nil {
		t.Fatal(err)
	}
	back := make([]byte, size)
	if err := m.CopyDeviceToHost(back, d.Ptr()); err != nil || !bytes.Equal(back, pattern(size, 10)) {
		t.Fatalf("out of pinned memory: %v", err)
	}
	if err := unpin(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.PinHost(nil); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatalf("pin of nothing: %v", err)
	}
	c, err := New(0, CPU)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.PinHost(host); !errors.Is(err, status.ErrUnsupported) {
		t.Fatalf("CPU pin: %v", err)
	}
}

// Copies and page locks after Close fail with ErrClosed instead of reaching a released device.
func TestUseAfterClose(t *testing.T) {
	realCUDA := Probe(NvidiaGPU) == nil
	emulateGPU(t)
	for _, ty := range []Type{CPU, NvidiaGPU} {
		m, err := New(0, ty)
		if err != nil {
			t.Fatal(err)
		}
		b, err := m.Alloc(4096)
		if err != nil {
			t.Fatal(err)
		}
		host := make([]byte, 64)
		_, free, err := m.AllocStaging(4096)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		for name, err := range map[string]error{
			"h2d":  m.CopyHostToDevice(b.Ptr(), host),
			"d2h":  m.CopyDeviceToHost(host, b.Ptr()),
			"d2d":  m.CopyDeviceToDevice(b.Ptr(), b.Ptr()+64, 64),
			"free": free(),
		} {
			if name == "free" && (ty == CPU || !realCUDA) {
				continue // ordinary memory (also the emulation's staging): nothing to release
			}
			if !errors.Is(err, status.ErrClosed) {
				t.Errorf("%v %s after Close: %v", ty, name, err)
			}
		}
		if ty == NvidiaGPU {
			if _, err := m.PinHost(host); !errors.Is(err, status.ErrClosed) {
				t.Errorf("pin after Close: %v", err)
			}
		}
	}
}

// BenchmarkPinHost measures page-locking a 64 MiB shared mapping and releasing it (what an SHM
// dial from a GPU buffer pays once per peer, per 64 MiB of the peer's region).
func BenchmarkPinHost(b *testing.B) {
	if Probe(NvidiaGPU) != nil {
		b.Skip("no CUDA device: the emulation pins nothing")
	}
	m, err := New(0, NvidiaGPU)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	const size = 64 << 20
	host := sharedMapping(b, size)
	b.SetBytes(size)
	for b.Loop() {
		unpin, err := m.PinHost(host)
		if err != nil {
			b.Fatal(err)
		}
		if err := unpin(); err != nil {
			b.Fatal(err)
		}
	}
}

// sharedMapping maps size bytes of shared anonymous memory (as a peer's memfd mapping is),
// unmapped when the test ends.
func sharedMapping(tb testing.TB, size int) []byte {
	tb.Helper()
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = unix.Munmap(b) })
	return b
}

func TestAdopt(t *testing.T) {
	m, err := New(0, CPU)
	if err != nil {
		t.Fatal(err)
	}
	released := 0
	release := func() error { released++; return nil }
	b, err := m.Adopt(make([]byte, 64), release)
	if err != nil {
		t.Fatal(err)
	}
	if b.FD() != -1 || b.Size() != 64 || b.Memory() != m {
		t.Fatalf("fd %d size %d", b.FD(), b.Size())
	}
	if err := m.Free(b); err != nil || released != 1 {
		t.Fatalf("Free: %v, released %d", err, released)
	}
	if err := m.Free(b); !errors.Is(err, status.ErrInvalidConfig) || released != 1 {
		t.Fatalf("second Free: %v, released %d", err, released)
	}
	if _, err := m.Adopt(make([]byte, 64), release); err != nil { // Close gives it back
		t.Fatal(err)
	}
	if err := m.Close(); err != nil || released != 2 {
		t.Fatalf("Close: %v, released %d", err, released)
	}
	if _, err := m.Adopt(make([]byte, 64), release); !errors.Is(err, status.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
	g := nvidiaOrEmulated(t)
	if _, err := g.Adopt(make([]byte, 64), release); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatalf("host memory adopted as device memory: %v", err)
	}
}

// nvidiaOrEmulated returns NVIDIA GPU memory, the emulation where no CUDA device exists; it is
// closed by t.Cleanup.
func nvidiaOrEmulated(t *testing.T) *Memory {
	t.Helper()
	if Probe(NvidiaGPU) != nil {
		emulateGPU(t)
	}
	m, err := New(0, NvidiaGPU)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// emulateGPU turns the GPU emulation on for the test.
func emulateGPU(t *testing.T) {
	was := SetEmulateGPU(true)
	t.Cleanup(func() { SetEmulateGPU(was) })
}
