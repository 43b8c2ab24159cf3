//go:build ucx && cgo

package ucx

/*
#include "hmc_ucx.h"
*/
import "C"

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"unsafe"

	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// hasCUDA says whether this UCX can move CUDA memory itself (its resources include a CUDA
// memory domain); then device regions are registered directly instead of staged.
var hasCUDA = sync.OnceValue(func() bool {
	rs, err := Resources()
	if err != nil {
		return false
	}
	for _, r := range rs {
		if strings.Contains(r.MD, "cuda") || strings.Contains(r.Component, "cuda") || strings.HasPrefix(r.MD, "gdr") {
			return true
		}
	}
	return false
})

// makeRing allocates and registers the staging chunks of a device local region.
func (e *endpoint) makeRing() error {
	for range transport.DefaultStageDepth {
		b, free, err := e.region.Memory().AllocStaging(transport.DefaultStageChunk)
		if err != nil {
			e.unmapLocal()
			return fmt.Errorf("ucx: staging ring: %w", err)
		}
		e.ringFree = append(e.ringFree, free)
		memh, err := e.w.memMap(b)
		if err != nil {
			e.unmapLocal()
			return err
		}
		e.ring = append(e.ring, b)
		e.ringMemh = append(e.ringMemh, memh)
	}
	return nil
}

// unmapLocal unregisters the local region or the ring and frees the ring.
func (e *endpoint) unmapLocal() {
	if e.local != nil {
		e.unregisterLocal()
	}
	for _, m := range e.ringMemh {
		e.w.memUnmap(m)
	}
	for _, f := range e.ringFree {
		_ = f()
	}
	e.ring, e.ringMemh, e.ringFree = nil, nil, nil
}

// staged runs a transfer of a device local region through the ring on its own goroutine
// (owned by the endpoint: Close waits for it; the returned Op completes when it returns): a put
// copies chunk i+1 from the device while chunk i is on its way; a get keeps the ring's chunks in
// flight and copies each to the device as it arrives.
func (e *endpoint) staged(put bool, localOff, remoteOff, n uint64) *transport.Op {
	e.stagingMu.Lock()
	defer e.stagingMu.Unlock()
	if e.closed.Load() {
		return transport.Failed(fmt.Errorf("ucx: endpoint: %w", status.ErrClosed))
	}
	op := transport.NewOp(1)
	e.staging.Add(1)
	go func() {
		defer e.staging.Done()
		op.Finish(e.runStaged(put, localOff, remoteOff, n))
	}()
	return op
}

func (e *endpoint) runStaged(put bool, localOff, remoteOff, n uint64) error {
	e.stageMu.Lock()
	defer e.stageMu.Unlock()
	if len(e.ring) == 0 {
		return fmt.Errorf("ucx: endpoint: %w", status.ErrClosed)
	}
	ctx := context.Background() // each piece completes or fails: the endpoint's close fails them
	chunk := uint64(len(e.ring[0]))
	type flight struct {
		op     *transport.Op
		off, k uint64
	}
	slots := make([]flight, len(e.ring))
	finish := func(i int) error {
		f := slots[i]
		slots[i] = flight{}
		if f.op == nil {
			return nil
		}
		if err := f.op.Wait(ctx); err != nil {
			return err
		}
		if !put {
			return e.region.WriteFromCPU(e.ring[i][:f.k], localOff+f.off)
		}
		return nil
	}
	var err error
	for i, done := 0, uint64(0); done < n && err == nil; i++ {
		slot := i % len(e.ring)
		if err = finish(slot); err != nil {
			break
		}
		k := min(chunk, n-done)
		if put {
			if err = e.region.ReadToCPU(e.ring[slot][:k], localOff+done); err != nil {
				break
			}
		}
		if e.closed.Load() {
			err = fmt.Errorf("ucx: endpoint: %w", status.ErrClosed)
			break
		}
		slots[slot] = flight{op: e.postRaw(put, unsafe.Pointer(&e.ring[slot][0]), e.ringMemh[slot], e.at(remoteOff+done), k), off: done, k: k}
		done += k
	}
	for i := range slots { // drain: every piece posted completes before the ring is reused
		if ferr := finish(i); err == nil {
			err = ferr
		}
	}
	return err
}

// DeviceMemory says how this UCX moves device memory: with its CUDA memory domain when it has
// one, else not (device regions are refused to UCX peers, whose local device memory is staged).
func DeviceMemory() string {
	if hasCUDA() {
		return "directly (this UCX has a CUDA memory domain)"
	}
	return "local device memory through a host staging ring; peers' device regions are refused (this UCX has no CUDA memory domain: Debian's has none), so tcp and shm carry them"
}
