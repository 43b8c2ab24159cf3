package memory

import (
	"errors"
	"testing"

	"github.com/hmc-go/hmc/status"
)

// Host memory is Host; device memory is Device (the emulation's where no CUDA device exists,
// a real device's where one does) from its first byte to its last, and HostRange refuses it.
func TestClassify(t *testing.T) {
	host := make([]byte, 4096)
	if k, _, err := Classify(Ptr(AddrOf(host))); err != nil || k != Host || !k.HostAddressable() {
		t.Fatalf("a Go slice: %v, %v", k, err)
	}
	if _, err := HostRange(Ptr(AddrOf(host)), 4096); err != nil {
		t.Fatal(err)
	}
	if Probe(NvidiaGPU) != nil {
		emulateGPU(t)
	}
	m, err := New(0, NvidiaGPU)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	b, err := m.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []Ptr{b.Ptr(), b.Ptr() + 1<<20 - 1} {
		if k, dev, err := Classify(p); err != nil || k != Device || dev != 0 || k.HostAddressable() {
			t.Fatalf("%#x in a device allocation: %v %d %v", uintptr(p), k, dev, err)
		}
	}
	if _, err := HostRange(b.Ptr(), 1<<20); !errors.Is(err, status.ErrUnsupported) {
		t.Fatalf("HostRange of device memory: %v", err)
	}
	if _, err := HostRange(b.Ptr()-4096, 8192); !errors.Is(err, status.ErrUnsupported) { // ends inside it
		t.Fatalf("HostRange ending in device memory: %v", err)
	}
	p := b.Ptr()
	if err := m.Free(b); err != nil {
		t.Fatal(err)
	}
	if k, _, _ := Classify(p); k == Device && emulating() {
		t.Fatal("a freed emulated allocation is still device memory")
	}
	for k, want := range map[Kind]string{Host: "host", PinnedHost: "pinned host", Device: "device", Managed: "managed"} {
		if k.String() != want {
			t.Errorf("%d: %q", int(k), k.String())
		}
	}
}

// loadedAlready finds a library the process has loaded (libc, which purego's loader brings) and
// not one it has not, loading nothing.
func TestLoadedAlready(t *testing.T) {
	if !loadedAlready("libc.so.6") {
		t.Error("libc.so.6 not found among the loaded libraries")
	}
	if loadedAlready("libhmc-not-a-library.so.9") {
		t.Error("found a library that does not exist")
	}
}
