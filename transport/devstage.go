package transport

import (
	"context"
	"fmt"
	"sync"

	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
)

// HostRing stages this process's device memory through an endpoint that moves host memory
// only (TCP, UCX without device memory types): a bounded ring of host chunks, page-locked for
// a CUDA device, with the device copy of one chunk overlapping the transfer of the others.
// Host memory use is depth × chunk whatever the transfer sizes; transfers share the ring and
// may run concurrently. Its methods are safe for concurrent use.
type HostRing struct {
	pl    memory.Place
	chunk uint64
	free  chan []byte
	frees []func() error
}

// HostRingChunk is the chunk of a HostRing whose maker names none (HMC_STAGE_CHUNK and
// HMC_STAGE_DEPTH override it, as they override every ring's). Each device copy has a fixed
// cost beside its bytes (~11 us on a lent H100): staging 64 MiB in 2 MiB chunks ran at 0.94 of
// one page-locked device-to-host copy where 1 MiB chunks ran at 0.85 (same run,
// docs/results/gpu-2026-11-28.md). A ring is per engine and device: 8 MiB of locked memory.
const HostRingChunk = 2 << 20

// NewHostRing allocates a ring for device memory at pl (chunk ≤ 0 takes HostRingChunk,
// depth ≤ 0 DefaultStageDepth).
func NewHostRing(pl memory.Place, chunk, depth int) (*HostRing, error) {
	dc, dd := StageSizes(HostRingChunk, DefaultStageDepth)
	if chunk <= 0 {
		chunk = dc
	}
	if depth <= 0 {
		depth = dd
	}
	h := &HostRing{pl: pl, chunk: uint64(chunk), free: make(chan []byte, depth)}
	for range depth {
		b, free, err := memory.AllocStagingFor(pl, uint64(chunk))
		if err != nil {
			_ = h.Close()
			return nil, fmt.Errorf("staging ring for %v memory: %w", pl, err)
		}
		h.frees = append(h.frees, free)
		h.free <- b
	}
	return h, nil
}

// Close frees the ring; no transfer may be running.
func (h *HostRing) Close() error {
	var first error
	for _, f := range h.frees {
		if err := f(); err != nil && first == nil {
			first = err
		}
	}
	h.frees = nil
	return first
}

// Write copies n bytes of device memory at src to dst through r; the returned Op completes
// when every byte has landed, or with the first error.
func (h *HostRing) Write(ctx context.Context, r RMA, src memory.Ptr, n uint64, dst Remote) *Op {
	return h.run(ctx, n, func(b []byte, off uint64) (*Op, error) {
		// The device copy is started here and the chunk's write posted once it has landed, so
		// the copies of the chunks behind it are queued meanwhile.
		wait, err := memory.CopyAsync(memory.Ptr(memory.AddrOf(b)), memory.HostPlace, src+memory.Ptr(off), h.pl, uint64(len(b)))
		if err != nil {
			return nil, fmt.Errorf("staging from device: %w", err)
		}
		op := NewOp(1)
		go func() { // owned by op: the chunk is the ring's again only when op has finished
			if err := wait(); err != nil {
				op.Finish(fmt.Errorf("staging from device: %w", err))
				return
			}
			w, err := r.WriteAsync(ctx, b, dst.At(off))
			if err != nil {
				op.Finish(err)
				return
			}
			<-w.Done()
			op.Finish(w.Err())
		}()
		return op, nil
	}, nil)
}

// Read copies n bytes at src through r into device memory at dst, as Write.
func (h *HostRing) Read(ctx context.Context, r RMA, dst memory.Ptr, n uint64, src Remote) *Op {
	return h.run(ctx, n, func(b []byte, off uint64) (*Op, error) {
		return r.ReadAsync(ctx, b, src.At(off))
	}, func(b []byte, off uint64) error {
		if err := memory.CopyPlaced(dst+memory.Ptr(off), h.pl, memory.Ptr(memory.AddrOf(b)), memory.HostPlace, uint64(len(b))); err != nil {
			return fmt.Errorf("staging to device: %w", err)
		}
		return nil
	})
}

type staged struct {
	op  *Op
	b   []byte
	off uint64
}

// run moves n bytes chunk by chunk: start posts a chunk's transfer, then (if set) runs once
// it completed. Chunks already posted are waited for before a chunk is taken from the ring when
// none is free, so transfers sharing the ring never hold chunks while waiting for one.
func (h *HostRing) run(ctx context.Context, n uint64, start func(b []byte, off uint64) (*Op, error), then func(b []byte, off uint64) error) *Op {
	op := NewOp(1)
	go func() { // owned by op: it ends when the transfer has
		var (
			queue []staged
			err   error
			mu    sync.Mutex
		)
		fail := func(e error) {
			mu.Lock()
			if err == nil {
				err = e
			}
			mu.Unlock()
		}
		// finish waits for a chunk's transfer, runs then, and gives the chunk back. A transfer
		// still running when ctx ends keeps its chunk until it completes (the endpoint may
		// still read or fill it: another transfer must not have it meanwhile).
		finish := func(s staged) {
			select {
			case <-s.op.Done():
			case <-ctx.Done():
				fail(status.FromContext(ctx))
				go func() { // ends when the op does: endpoints complete every op, at the latest on Close
					<-s.op.Done()
					h.free <- s.b[:cap(s.b)]
				}()
				return
			}
			e := s.op.Err()
			if e == nil && then != nil {
				e = then(s.b, s.off)
			}
			if e != nil {
				fail(e)
			}
			h.free <- s.b[:cap(s.b)]
		}
		failed := func() bool {
			mu.Lock()
			defer mu.Unlock()
			return err != nil
		}
		for off := uint64(0); off < n && !failed(); {
			var oldest <-chan struct{} // nil (never ready) with nothing posted
			if len(queue) > 0 {
				oldest = queue[0].op.Done()
			}
			var b []byte
			select {
			case b = <-h.free:
			case <-oldest:
				finish(queue[0])
				queue = queue[1:]
				continue
			case <-ctx.Done():
				fail(status.FromContext(ctx))
				continue
			}
			k := min(uint64(len(b)), n-off)
			o, e := start(b[:k], off)
			if e != nil {
				h.free <- b
				fail(e)
				break
			}
			queue = append(queue, staged{op: o, b: b[:k], off: off})
			off += k
		}
		for _, s := range queue {
			finish(s)
		}
		op.Finish(err)
	}()
	return op
}

// DeviceRange is Size bytes of device memory at Ptr (at Place, from memory.Locate) as a
// DeviceIO: the host reaches it by device copies only.
type DeviceRange struct {
	Ptr   memory.Ptr
	Place memory.Place
	Size  uint64
}

var _ DeviceIO = DeviceRange{}

// Check implements DeviceIO.
func (d DeviceRange) Check(off, n uint64) error {
	if off > d.Size || n > d.Size-off {
		return fmt.Errorf("[%d, +%d) is outside %d bytes of %v memory at %#x: %w", off, n, d.Size, d.Place, uintptr(d.Ptr), status.ErrOutOfRange)
	}
	return nil
}

// WriteFromCPU implements DeviceIO: src lands at off.
func (d DeviceRange) WriteFromCPU(src []byte, off uint64) error {
	if err := d.Check(off, uint64(len(src))); err != nil {
		return err
	}
	return memory.CopyPlaced(d.Ptr+memory.Ptr(off), d.Place, memory.Ptr(memory.AddrOf(src)), memory.HostPlace, uint64(len(src)))
}

// ReadToCPUAsync starts filling dst from off (memory.CopyAsync): the Stager issues the copies
// of the chunks ahead and waits for each before it sends it.
func (d DeviceRange) ReadToCPUAsync(dst []byte, off uint64) (wait func() error, err error) {
	if err := d.Check(off, uint64(len(dst))); err != nil {
		return nil, err
	}
	return memory.CopyAsync(memory.Ptr(memory.AddrOf(dst)), memory.HostPlace, d.Ptr+memory.Ptr(off), d.Place, uint64(len(dst)))
}

// WriteFromCPUAsync queues the copy of src to off (memory.CopyAsync): a Stager receiving a
// transfer has several chunks' copies queued at once.
func (d DeviceRange) WriteFromCPUAsync(src []byte, off uint64) (wait func() error, err error) {
	if err := d.Check(off, uint64(len(src))); err != nil {
		return nil, err
	}
	return memory.CopyAsync(d.Ptr+memory.Ptr(off), d.Place, memory.Ptr(memory.AddrOf(src)), memory.HostPlace, uint64(len(src)))
}

// ReadToCPU implements DeviceIO: dst is filled from off.
func (d DeviceRange) ReadToCPU(dst []byte, off uint64) error {
	if err := d.Check(off, uint64(len(dst))); err != nil {
		return err
	}
	return memory.CopyPlaced(memory.Ptr(memory.AddrOf(dst)), memory.HostPlace, d.Ptr+memory.Ptr(off), d.Place, uint64(len(dst)))
}
