package memory

import (
	"bytes"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"testing"

	"github.com/hmc-go/hmc/status"
)

// Copy moves bytes between host and device memory in every direction, from the addresses
// alone; device memory is located as such, and an emulated device address is not host memory
// (the host cannot read it: only copies reach its bytes).
func TestCopyEveryDirection(t *testing.T) {
	m := nvidiaOrEmulated(t)
	const n = 1 << 20
	a, err := m.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	pl, err := LocateRange(a.Ptr(), n)
	if err != nil || pl.Kind != Device || !pl.OnDevice() {
		t.Fatalf("a device allocation is at %v (%v)", pl, err)
	}
	src := make([]byte, n)
	for i := range src {
		src[i] = byte(i*7 + 3)
	}
	host := Ptr(AddrOf(src))
	if err := Copy(a.Ptr()+5, host, n-5); err != nil { // host to device, at an offset
		t.Fatal(err)
	}
	if err := Copy(b.Ptr(), a.Ptr(), n); err != nil { // device to device
		t.Fatal(err)
	}
	got := make([]byte, n)
	if err := Copy(Ptr(AddrOf(got)), b.Ptr(), n); err != nil { // device to host
		t.Fatal(err)
	}
	if !bytes.Equal(got[5:], src[:n-5]) {
		t.Fatal("bytes changed on the way through the device")
	}
	if err := Copy(a.Ptr()+n-4, host, 8); !errors.Is(err, status.ErrInvalidConfig) && !errors.Is(err, status.ErrOutOfRange) {
		t.Fatalf("a copy running past the allocation: %v", err)
	}
	if emulating() {
		if _, err := HostRange(a.Ptr(), n); !errors.Is(err, status.ErrUnsupported) {
			t.Fatalf("HostRange of emulated device memory: %v", err)
		}
	}
}

// childEnv marks the test binary run as TestIPCTwoProcesses's importer.
const childEnv = "HMC_MEMORY_IPC_CHILD"

// A device allocation exported by one process is opened by another, which reads what the
// first wrote and writes what the first then reads: the same memory, no copy between them.
func TestIPCTwoProcesses(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		return // the child runs TestIPCChild only
	}
	m := nvidiaOrEmulated(t)
	const n = 3 << 20
	buf, err := m.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	pat := bytes.Repeat([]byte("exported"), n/8)
	if err := Copy(buf.Ptr(), Ptr(AddrOf(pat)), n); err != nil {
		t.Fatal(err)
	}
	pl, _ := Locate(buf.Ptr())
	h, err := ExportIPC(buf.Ptr()+4096, pl)
	if err != nil {
		t.Fatal(err)
	}
	if h.Offset != 4096 {
		t.Fatalf("handle offset %d, want 4096", h.Offset)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestIPCChild$", "-test.v")
	cmd.Env = append(os.Environ(), childEnv+"=1", EmulateGPUEnv+"=1",
		"HMC_IPC_RAW="+hex.EncodeToString(h.Raw[:]), "HMC_IPC_SIZE="+strconv.FormatUint(h.Size, 10),
		"HMC_IPC_OFF="+strconv.FormatUint(h.Offset, 10), "HMC_IPC_DEV="+strconv.Itoa(h.Device))
	if h.Emulated() {
		f := os.NewFile(uintptr(h.FD), "ipc")
		defer f.Close()
		cmd.ExtraFiles = []*os.File{f}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("importer: %v\n%s", err, out)
	}
	got := make([]byte, n)
	if err := Copy(Ptr(AddrOf(got)), buf.Ptr(), n); err != nil {
		t.Fatal(err)
	}
	want := bytes.Clone(pat)
	copy(want[4096:], bytes.Repeat([]byte{0xab}, 8192))
	if !bytes.Equal(got, want) {
		t.Fatalf("the importer's write is not in the exporter's memory\n%s", out)
	}
}

// TestIPCChild is the importer of TestIPCTwoProcesses.
func TestIPCChild(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("run by TestIPCTwoProcesses")
	}
	SetEmulateGPU(os.Getenv(EmulateGPUEnv) == "1")
	var h IPCHandle
	h.Vendor, h.FD = NvidiaGPU, -1
	h.Size, _ = strconv.ParseUint(os.Getenv("HMC_IPC_SIZE"), 10, 64)
	h.Offset, _ = strconv.ParseUint(os.Getenv("HMC_IPC_OFF"), 10, 64)
	h.Device, _ = strconv.Atoi(os.Getenv("HMC_IPC_DEV"))
	raw, err := hex.DecodeString(os.Getenv("HMC_IPC_RAW"))
	if err != nil || len(raw) != len(h.Raw) {
		t.Fatalf("handle %q: %v", os.Getenv("HMC_IPC_RAW"), err)
	}
	copy(h.Raw[:], raw)
	if Probe(NvidiaGPU) != nil || emulating() {
		if _, err := cudaDeviceCount(); err != nil {
			h.FD = 3
		}
	}
	p, pl, closeIt, err := OpenIPC(h)
	if err != nil {
		t.Fatal(err)
	}
	defer closeIt()
	if !pl.OnDevice() {
		t.Fatalf("opened memory is at %v", pl)
	}
	got := make([]byte, 8)
	if err := Copy(Ptr(AddrOf(got)), p, 8); err != nil || string(got) != "exported" {
		t.Fatalf("read %q (%v)", got, err)
	}
	if err := Copy(p, Ptr(AddrOf(bytes.Repeat([]byte{0xab}, 8192))), 8192); err != nil {
		t.Fatal(err)
	}
	if err := closeIt(); err != nil {
		t.Fatal(err)
	}
}

// Work queued on a stream is not seen by a copy that does not wait for it, and is after
// SyncStream: the ordering the transfer faces document.
func TestStreamOrdering(t *testing.T) {
	m := nvidiaOrEmulated(t)
	const n = 64 << 10
	b, err := m.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	pl, _ := Locate(b.Ptr())
	s, err := NewStream(NvidiaGPU, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer DestroyStream(s, pl)
	if err := MemsetAsync(b.Ptr(), pl, 0x5a, n, s); err != nil {
		t.Fatal(err)
	}
	if err := SyncStream(s, pl); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, n)
	if err := Copy(Ptr(AddrOf(got)), b.Ptr(), n); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, bytes.Repeat([]byte{0x5a}, n)) {
		t.Fatal("the stream's memset is not seen after SyncStream")
	}
	if emulating() { // a real GPU may finish the memset before the copy: only the emulation shows the race
		if err := MemsetAsync(b.Ptr(), pl, 0x11, n, s); err != nil {
			t.Fatal(err)
		}
		if err := Copy(Ptr(AddrOf(got)), b.Ptr(), n); err != nil {
			t.Fatal(err)
		}
		if got[0] != 0x5a {
			t.Fatal("the emulated stream ran its work at once: ordering tests would prove nothing")
		}
	}
}

// TestDeviceCopyAsync: copies started ahead and waited for in turn, host to device and back
// through page-locked staging memory, land every byte (on a CUDA device: one stream, an event
// per copy; emulated: each copy done when started).
func TestDeviceCopyAsync(t *testing.T) {
	m := nvidiaOrEmulated(t)
	const chunk, chunks = 256<<10 + 8, 8
	d, err := m.Alloc(chunk * chunks)
	if err != nil {
		t.Fatal(err)
	}
	pl, err := Locate(d.Ptr())
	if err != nil {
		t.Fatal(err)
	}
	in, freeIn, err := AllocStagingFor(pl, chunk*chunks)
	if err != nil {
		t.Fatal(err)
	}
	defer freeIn()
	out, freeOut, err := AllocStagingFor(pl, chunk*chunks)
	if err != nil {
		t.Fatal(err)
	}
	defer freeOut()
	for i := range in {
		in[i] = byte(i*13 + 1)
	}
	each := func(dst func(i int) (Ptr, Place), src func(i int) (Ptr, Place)) {
		waits := make([]func() error, chunks)
		for i := range chunks {
			dp, dpl := dst(i)
			sp, spl := src(i)
			if waits[i], err = CopyAsync(dp, dpl, sp, spl, chunk); err != nil {
				t.Fatal(err)
			}
		}
		for _, w := range waits {
			if err := w(); err != nil {
				t.Fatal(err)
			}
		}
	}
	host := func(b []byte) func(int) (Ptr, Place) {
		return func(i int) (Ptr, Place) { return Ptr(AddrOf(b)) + Ptr(i*chunk), HostPlace }
	}
	device := func(i int) (Ptr, Place) { return d.Ptr() + Ptr(i*chunk), pl }
	each(device, host(in))
	each(host(out), device)
	if !bytes.Equal(in, out) {
		t.Fatal("bytes changed on the way through the device")
	}
	if w, err := CopyAsync(d.Ptr(), pl, Ptr(AddrOf(in)), HostPlace, 0); err != nil || w() != nil {
		t.Fatalf("an empty copy: %v", err)
	}
}

// TestDeviceMemoryCopyAsync: a Memory's queued copies land every byte, and once it is closed a
// copy is refused.
func TestDeviceMemoryCopyAsync(t *testing.T) {
	m := nvidiaOrEmulated(t)
	const n = 1<<20 + 5
	d, err := m.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	src := make([]byte, n)
	for i := range src {
		src[i] = byte(i*5 + 2)
	}
	back := make([]byte, n)
	w1, err := m.CopyHostToDeviceAsync(d.Ptr(), src)
	if err != nil {
		t.Fatal(err)
	}
	if err := w1(); err != nil {
		t.Fatal(err)
	}
	w2, err := m.CopyDeviceToHostAsync(back, d.Ptr())
	if err != nil {
		t.Fatal(err)
	}
	if err := w2(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back, src) {
		t.Fatal("bytes changed on the way through the device")
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.CopyDeviceToHostAsync(back, d.Ptr()); !errors.Is(err, status.ErrClosed) {
		t.Fatalf("a copy after Close: %v", err)
	}
}
