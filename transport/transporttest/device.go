package transporttest

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// EmulateGPU turns the GPU emulation on for the test (memory.SetEmulateGPU), in this process
// and, through HMC_EMULATE_GPU, in the child processes it starts (their TestMain applies it).
func EmulateGPU(t testing.TB) {
	t.Setenv(memory.EmulateGPUEnv, "1")
	was := memory.SetEmulateGPU(true)
	t.Cleanup(func() { memory.SetEmulateGPU(was) })
}

// DeviceBuf returns a GPU ConnBuffer of size bytes: a real one when a CUDA device is present,
// else the emulation (EmulateGPU), which hides its bytes as device memory does. It is closed
// when the test ends.
func DeviceBuf(t testing.TB, size uint64) *buffer.ConnBuffer {
	t.Helper()
	if err := memory.Probe(memory.NvidiaGPU); err != nil {
		EmulateGPU(t)
		t.Logf("GPU ConnBuffer emulated in host memory (no CUDA device: %v)", err)
	} else {
		t.Log("GPU ConnBuffer in CUDA device memory")
	}
	b, err := buffer.New(0, size, memory.NvidiaGPU)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if b.Bytes() != nil {
		t.Fatal("device buffer exposes host bytes")
	}
	return b
}

// HostBuf returns a CPU ConnBuffer closed when the test ends.
func HostBuf(t testing.TB, size uint64) *buffer.ConnBuffer { return newBuf(t, size) }

// Contents returns a copy of a region's bytes, wherever it lives.
func Contents(t testing.TB, b *buffer.ConnBuffer) []byte {
	t.Helper()
	out := make([]byte, b.Size())
	if err := b.ReadToCPU(out, 0); err != nil {
		t.Fatal(err)
	}
	return out
}

// DeviceRoundTrip serves target with tr, dials it with local (either may be device memory) and
// checks every byte of puts of several sizes (around 1 MiB chunk and ring boundaries, up to the
// whole region), of concurrent gets back into the cleared local region, and that ranges are
// still checked.
func DeviceRoundTrip(t *testing.T, tr transport.Transport, addr string, target, local *buffer.ConnBuffer) {
	t.Helper()
	size := min(target.Size(), local.Size())
	srv, err := tr.Listen(transport.ServerConfig{BindAddr: addr, Region: target})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ep, err := tr.Dial(ctx, transport.DialConfig{Addr: srv.Addr(), Local: local})
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	src := make([]byte, size)
	Fill(src, 42)
	if err := local.WriteFromCPU(src, 0); err != nil {
		t.Fatal(err)
	}
	for _, n := range []uint64{0, 1, 1<<20 - 1, 1 << 20, 1<<20 + 1, 4<<20 + 1, size} {
		n = min(n, size)
		if err := transport.Put(ctx, ep, 0, 0, n); err != nil {
			t.Fatalf("put %d: %v", n, err)
		}
		if got := Contents(t, target); !bytes.Equal(got[:n], src[:n]) {
			t.Fatalf("put %d: target differs", n)
		}
	}
	if err := local.WriteFromCPU(make([]byte, local.Size()), 0); err != nil {
		t.Fatal(err)
	}
	var ops []*transport.Op
	for off := uint64(0); off < size; off += 3 << 20 {
		op, err := ep.GetAsync(ctx, off, off, min(3<<20, size-off))
		if err != nil {
			t.Fatal(err)
		}
		ops = append(ops, op)
	}
	for _, op := range ops {
		if err := op.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(Contents(t, local)[:size], src) {
		t.Fatal("get into the local region differs")
	}
	if err := transport.Put(ctx, ep, 1, 0, local.Size()); !errors.Is(err, status.ErrOutOfRange) {
		t.Fatalf("local range of a %v region not checked: %v", local.Type(), err)
	}
}
