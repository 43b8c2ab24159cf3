package tcp

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/transporttest"
)

// deviceBuf returns a GPU ConnBuffer: a real one when a CUDA device is present, else the
// emulation (memory.EmulateGPUEnv), which hides its bytes exactly like device memory does.
func deviceBuf(t *testing.T, size uint64) *buffer.ConnBuffer {
	t.Helper()
	if memory.Probe(memory.NvidiaGPU) != nil {
		t.Setenv(memory.EmulateGPUEnv, "1")
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

func hostBuf(t *testing.T, size uint64) *buffer.ConnBuffer {
	b, err := buffer.New(0, size, memory.CPU)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func contents(t *testing.T, b *buffer.ConnBuffer) []byte {
	out := make([]byte, b.Size())
	if err := b.ReadToCPU(out, 0); err != nil {
		t.Fatal(err)
	}
	return out
}

// GPU ConnBuffers over TCP, on either side, go through the staging rings: every byte checked,
// sizes around the chunk and ring sizes, concurrent transfers on several lanes.
func TestDeviceRegionsAreStaged(t *testing.T) {
	const size = 11<<20 + 3
	for _, c := range []struct {
		name          string
		target, local func(*testing.T, uint64) *buffer.ConnBuffer
	}{
		{"device-target", deviceBuf, hostBuf},
		{"device-initiator", hostBuf, deviceBuf},
		{"device-both", deviceBuf, deviceBuf},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr, _ := New(Config{Lanes: 3, ChunkSize: 2 << 20})
			target, local := c.target(t, size), c.local(t, size)
			srv, err := tr.Listen(transport.ServerConfig{BindAddr: "127.0.0.1:0", Region: target})
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
			transporttest.Fill(src, 42)
			if err := local.WriteFromCPU(src, 0); err != nil {
				t.Fatal(err)
			}
			for _, n := range []uint64{0, 1, 1<<20 - 1, 1 << 20, 1<<20 + 1, 4<<20 + 1, size} {
				if err := transport.Put(ctx, ep, 0, 0, n); err != nil {
					t.Fatalf("put %d: %v", n, err)
				}
				if got := contents(t, target); !bytes.Equal(got[:n], src[:n]) {
					t.Fatalf("put %d: target differs", n)
				}
			}
			// Get back into a cleared local region, in concurrent pieces.
			if err := local.WriteFromCPU(make([]byte, size), 0); err != nil {
				t.Fatal(err)
			}
			var ops []*transport.Op
			for off := uint64(0); off < size; off += 3 << 20 {
				n := min(3<<20, size-off)
				op, err := ep.GetAsync(ctx, off, off, n)
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
			if !bytes.Equal(contents(t, local), src) {
				t.Fatal("get into the local region differs")
			}
			// Ranges are still checked against the device region's size.
			if err := transport.Put(ctx, ep, 0, size-1, 2); err == nil {
				t.Fatal("out-of-range put accepted")
			}
		})
	}
}
