package trans

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport/transporttest"
)

// Device memory registered for transfers, or given as a transfer's local buffer, is refused with
// the reason (it used to be taken as
// host memory: a peer's write into it crashed this process). Host memory around it still
// registers.
func TestRegisterDeviceMemoryRefused(t *testing.T) {
	if memory.Probe(memory.NvidiaGPU) != nil {
		transporttest.EmulateGPU(t)
	}
	m, err := memory.New(0, memory.NvidiaGPU)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	d, err := m.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	e, err := Create(context.Background(), P2P, Config{UniqueID: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := e.Register(uint64(d.Ptr()), 1<<20); !errors.Is(err, status.ErrUnsupported) || !strings.Contains(err.Error(), "device memory") {
		t.Fatalf("registering device memory: %v", err)
	}
	if err := e.BatchRegister([]Buffer{{Addr: uint64(d.Ptr()) + 4096, Size: 4096}}); !errors.Is(err, status.ErrUnsupported) {
		t.Fatalf("batch-registering device memory: %v", err)
	}
	host := make([]byte, 8192)
	if err := e.Register(memory.AddrOf(host), 8192); err != nil {
		t.Fatalf("host memory: %v", err)
	}
	// Device memory as a transfer's local buffer is refused before anything is sent or copied
	// (a host copy from it would crash this process), naming the request.
	reqs := []Request{{Op: Write, Local: memory.AddrOf(host), Remote: memory.AddrOf(host), Size: 4096},
		{Op: Write, Local: uint64(d.Ptr()), Remote: memory.AddrOf(host) + 4096, Size: 4096}}
	if _, err := e.Submit(context.Background(), e.UniqueID(), reqs, nil); !errors.Is(err, status.ErrUnsupported) ||
		!strings.Contains(err.Error(), "request 1's local buffer") {
		t.Fatalf("a device source: %v", err)
	}
	if !memory.MayHoldDevice() {
		t.Fatal("MayHoldDevice is false while device memory exists")
	}
}
