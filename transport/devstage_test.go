package transport_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/transporttest"
)

// memRMA is an RMA endpoint over a host slice: writes land in it, reads come from it, each op
// completing after delay (0: at once), failing with fail when set. A discarding one takes the
// bytes of a write at once without copying them (a wire as fast as the ring can feed it).
type memRMA struct {
	mem     []byte
	delay   time.Duration
	fail    error
	discard bool
}

func (m *memRMA) op(f func()) (*transport.Op, error) {
	if m.fail != nil {
		return nil, m.fail
	}
	if m.discard {
		return transport.Succeeded(), nil
	}
	if m.delay == 0 {
		f()
		return transport.Succeeded(), nil
	}
	op := transport.NewOp(1)
	time.AfterFunc(m.delay, func() { f(); op.Finish(nil) })
	return op, nil
}

func (m *memRMA) WriteAsync(_ context.Context, src []byte, dst transport.Remote) (*transport.Op, error) {
	return m.op(func() { copy(m.mem[dst.Addr:], src) })
}

func (m *memRMA) ReadAsync(_ context.Context, dst []byte, src transport.Remote) (*transport.Op, error) {
	return m.op(func() { copy(dst, m.mem[src.Addr:]) })
}

func (m *memRMA) Atomic(context.Context, buffer.AtomicOp, transport.Remote, uint64, uint64) (uint64, error) {
	return 0, status.ErrUnsupported
}

func deviceAlloc(t testing.TB, n uint64) (memory.Ptr, memory.Place) {
	t.Helper()
	if memory.Probe(memory.NvidiaGPU) != nil {
		transporttest.EmulateGPU(t)
	}
	m, err := memory.New(0, memory.NvidiaGPU)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	b, err := m.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	pl, err := memory.Locate(b.Ptr())
	if err != nil || !pl.OnDevice() {
		t.Fatalf("an allocation of device memory is at %v (%v)", pl, err)
	}
	return b.Ptr(), pl
}

// The ring moves device memory through an endpoint of host memory in both directions, in
// chunks that end unaligned, with several transfers sharing a two-chunk ring at once (none
// holds a chunk while waiting for one), and fails typed when the endpoint or the context does.
func TestHostRing(t *testing.T) {
	const n = 3<<20 + 13
	dev, pl := deviceAlloc(t, 4<<20)
	ring, err := transport.NewHostRing(pl, 1<<20, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer ring.Close()
	src := make([]byte, n)
	for i := range src {
		src[i] = byte(i*31 + i>>11)
	}
	if err := memory.Copy(dev, memory.Ptr(memory.AddrOf(src)), n); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, delay := range []time.Duration{0, time.Millisecond} {
		peer := &memRMA{mem: make([]byte, 4*n), delay: delay}
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for k := range 4 { // four transfers at once through two chunks
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[k] = ring.Write(ctx, peer, dev, n, transport.Remote{Addr: uint64(k * n)}).Wait(ctx)
			}()
		}
		wg.Wait()
		for k := range 4 {
			if errs[k] != nil {
				t.Fatal(errs[k])
			}
			if !bytes.Equal(peer.mem[k*n:(k+1)*n], src) {
				t.Fatalf("delay %v: transfer %d's bytes differ", delay, k)
			}
		}
		clear(src[:7])
		copy(peer.mem[n:], src)
		if err := ring.Read(ctx, peer, dev+1, n-1, transport.Remote{Addr: uint64(n) + 1}).Wait(ctx); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, n)
		if err := memory.Copy(memory.Ptr(memory.AddrOf(got)), dev, n); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got[1:], src[1:]) {
			t.Fatalf("delay %v: read into device memory: bytes differ", delay)
		}
	}
	bad := &memRMA{mem: make([]byte, n), fail: status.ErrPeerClosed}
	if err := ring.Write(ctx, bad, dev, n, transport.Remote{}).Wait(ctx); !errors.Is(err, status.ErrPeerClosed) {
		t.Fatalf("a failing endpoint: %v", err)
	}
	// A transfer past its deadline fails at the deadline; its chunks come back to the ring
	// only once the endpoint is done with them, and the ring then serves the next transfer.
	slow := &memRMA{mem: make([]byte, n), delay: 300 * time.Millisecond}
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	if err := ring.Write(cctx, slow, dev, n, transport.Remote{}).Wait(ctx); !errors.Is(err, status.ErrTimeout) || time.Since(t0) > 250*time.Millisecond {
		t.Fatalf("a transfer past its deadline: %v after %v", err, time.Since(t0))
	}
	peer := &memRMA{mem: make([]byte, n)}
	if err := ring.Write(ctx, peer, dev, n, transport.Remote{}).Wait(ctx); err != nil {
		t.Fatalf("the next transfer: %v", err)
	}
}

// Staging device memory to a host endpoint through the ring (the copies overlap the sends)
// against its peer, one device-to-pinned-host copy of the same bytes (cuMemcpyDtoH on a GPU),
// and a device-to-device copy inside this process (cuMemcpyDtoD), the peer of same-host
// transfers between two processes. On the emulation these are CPU copies.
func BenchmarkStaging(b *testing.B) {
	const n = 64 << 20
	dev, pl := deviceAlloc(b, 2*n)
	pinned, free, err := memory.AllocStagingFor(pl, n)
	if err != nil {
		b.Fatal(err)
	}
	defer free()
	// The rings feed a wire that takes their bytes at once: their own rate shows, as one
	// device-to-host copy's does.
	b.Run("ring-to-host", func(b *testing.B) {
		ring, err := transport.NewHostRing(pl, 0, 0)
		if err != nil {
			b.Fatal(err)
		}
		defer ring.Close()
		peer := &memRMA{mem: pinned, discard: true}
		b.SetBytes(n)
		for b.Loop() {
			if err := ring.Write(context.Background(), peer, dev, n, transport.Remote{}).Wait(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
	})
	// TCP's DeviceRMA streams a transfer through a Stager into its socket: here a writer that
	// takes the bytes at once, so the ring's own rate shows.
	b.Run("stream-to-wire", func(b *testing.B) {
		st, err := transport.NewRing(func(n uint64) ([]byte, func() error, error) { return memory.AllocStagingFor(pl, n) }, 0, 0)
		if err != nil {
			b.Fatal(err)
		}
		defer st.Close()
		src := transport.DeviceRange{Ptr: dev, Place: pl, Size: n}
		b.SetBytes(n)
		for b.Loop() {
			if err := st.SendFrom(io.Discard, src, 0, n); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("DtoH-4KiB", func(b *testing.B) { // one copy's fixed cost
		b.SetBytes(4096)
		for b.Loop() {
			if err := memory.CopyPlaced(memory.Ptr(memory.AddrOf(pinned)), memory.HostPlace, dev, pl, 4096); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("DtoH-pinned", func(b *testing.B) {
		b.SetBytes(n)
		for b.Loop() {
			if err := memory.CopyPlaced(memory.Ptr(memory.AddrOf(pinned)), memory.HostPlace, dev, pl, n); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("DtoD", func(b *testing.B) {
		b.SetBytes(n)
		for b.Loop() {
			if err := memory.CopyPlaced(dev+n, pl, dev, pl, n); err != nil {
				b.Fatal(err)
			}
		}
	})
}
