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

// Device memory registers as device memory (the driver says so; it is never taken as host
// memory, which crashed this process when a peer wrote into it), whole or in parts; a range
// that straddles device and host memory is refused naming both, and so is such a range as a
// transfer's local buffer, before anything is sent or copied.
func TestRegisterDeviceMemory(t *testing.T) {
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
	if err := e.Register(uint64(d.Ptr()), 1<<20); err != nil {
		t.Fatalf("registering device memory: %v", err)
	}
	if err := e.BatchRegister([]Buffer{{Addr: uint64(d.Ptr()) + 4096, Size: 4096}}); err != nil {
		t.Fatalf("batch-registering device memory inside a registered range: %v", err)
	}
	regs := e.table.Regions()
	if len(regs) != 1 || !regs[0].OnDevice() || regs[0].Place().Kind != memory.Device {
		t.Fatalf("registered regions: %d, the first on device: %v", len(regs), len(regs) > 0 && regs[0].OnDevice())
	}
	host := make([]byte, 8192)
	if err := e.Register(memory.AddrOf(host), 8192); err != nil {
		t.Fatalf("host memory: %v", err)
	}
	if bufs := e.Buffers(); len(bufs) < 2 || bufs[0].Location != "cuda:0" || bufs[len(bufs)-1].Location != "cpu" {
		t.Fatalf("published buffers: %+v", bufs)
	}
	if err := e.Register(uint64(d.Ptr())+1<<20-4096, 8192); err == nil || !strings.Contains(err.Error(), "ends in") {
		t.Fatalf("a range from device memory into what follows it: %v", err)
	}
	reqs := []Request{{Op: Write, Local: memory.AddrOf(host), Remote: memory.AddrOf(host), Size: 4096},
		{Op: Write, Local: uint64(d.Ptr()) + 1<<20 - 8, Remote: memory.AddrOf(host) + 4096, Size: 4096}}
	if _, err := e.Submit(context.Background(), e.UniqueID(), reqs, nil); !errors.Is(err, status.ErrInvalidConfig) ||
		!strings.Contains(err.Error(), "request 1's local buffer") {
		t.Fatalf("a source running out of device memory: %v", err)
	}
	if !memory.MayHoldDevice() {
		t.Fatal("MayHoldDevice is false while device memory exists")
	}
}
