package comm

import (
	"context"
	"errors"
	"fmt"

	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// put copies local[localOff, +n) to the peer's region at remoteOff and returns when the bytes
// are visible there (on every transport: a control message sent after Put returns is observed
// by the target after the bytes). If ctx ends first the target range is left unspecified.
func (c *Communicator) put(ctx context.Context, ip string, port int, localOff, remoteOff, n uint64, ct transport.ConnType) error {
	ep, err := c.endpoint(ctx, ip, port, ct)
	if err != nil {
		return err
	}
	if err := transport.Put(ctx, ep, localOff, remoteOff, n); err != nil {
		return fmt.Errorf("comm: put %s:%d local %d remote %d size %d: %w", ip, port, localOff, remoteOff, n, err)
	}
	return nil
}

// get copies the peer's region [remoteOff, +n) into local[localOff, +n) and returns when the
// bytes are in the local buffer.
func (c *Communicator) get(ctx context.Context, ip string, port int, localOff, remoteOff, n uint64, ct transport.ConnType) error {
	ep, err := c.endpoint(ctx, ip, port, ct)
	if err != nil {
		return err
	}
	if err := transport.Get(ctx, ep, localOff, remoteOff, n); err != nil {
		return fmt.Errorf("comm: get %s:%d local %d remote %d size %d: %w", ip, port, localOff, remoteOff, n, err)
	}
	return nil
}

// putNB starts a Put and returns an operation id for Wait. Ids are unique per Communicator and
// never 0. ctx bounds only the posting.
func (c *Communicator) putNB(ctx context.Context, ip string, port int, localOff, remoteOff, n uint64, ct transport.ConnType) (uint64, error) {
	return c.postNB(ctx, true, ip, port, localOff, remoteOff, n, ct)
}

// getNB starts a Get and returns an operation id for Wait.
func (c *Communicator) getNB(ctx context.Context, ip string, port int, localOff, remoteOff, n uint64, ct transport.ConnType) (uint64, error) {
	return c.postNB(ctx, false, ip, port, localOff, remoteOff, n, ct)
}

func (c *Communicator) postNB(ctx context.Context, put bool, ip string, port int, localOff, remoteOff, n uint64, ct transport.ConnType) (uint64, error) {
	ep, err := c.endpoint(ctx, ip, port, ct)
	if err != nil {
		return 0, err
	}
	var op *transport.Op
	if put {
		op, err = ep.PutAsync(ctx, localOff, remoteOff, n)
	} else {
		op, err = ep.GetAsync(ctx, localOff, remoteOff, n)
	}
	if err != nil {
		return 0, fmt.Errorf("comm: post to %s:%d: %w", ip, port, err)
	}
	id := c.opIDs.Add(1)
	c.mu.Lock()
	c.ops.add(id, op)
	c.mu.Unlock()
	return id, nil
}

// Wait waits for the operations ids, in any order and on any peers, and returns the first
// error. Every id is forgotten when Wait returns, whatever the result (a second Wait on it is
// ErrNotFound); an unknown id is ErrNotFound after the known ones were waited for. If ctx ends,
// the operations not yet complete continue in the background and their results are dropped.
func (c *Communicator) Wait(ctx context.Context, ids ...uint64) error {
	var one [1]*transport.Op
	ops := one[:0] // a sliding window's step waits for one id: no allocation
	if len(ids) > 1 {
		ops = make([]*transport.Op, 0, len(ids))
	}
	var missing []uint64
	c.mu.Lock()
	for _, id := range ids {
		if op, ok := c.ops.take(id); ok {
			ops = append(ops, op)
		} else {
			missing = append(missing, id)
		}
	}
	c.mu.Unlock()
	var errs []error
	for _, op := range ops {
		if err := op.Wait(ctx); err != nil {
			errs = append(errs, err)
			if status.CodeOf(err) == status.Timeout || errors.Is(err, status.ErrCanceled) {
				break
			}
		}
	}
	if len(missing) > 0 {
		errs = append(errs, fmt.Errorf("comm: wait: unknown operation ids %v: %w", missing, status.ErrNotFound))
	}
	if len(errs) > 0 {
		return fmt.Errorf("comm: wait: %w", errs[0])
	}
	return nil
}

// Progress drives, once, the transports whose one-sided operations need this process's
// software to progress (transport.Progresser: UCX over tcp, or emulating RMA). Call it in a loop
// that polls the buffer for a peer's put, as a UCX program calls ucp_worker_progress; the other
// transports need nothing and it does nothing for them.
func (c *Communicator) Progress() {
	for _, t := range c.progressers {
		t.Progress()
	}
}

// Pending returns the number of operations posted and not yet waited for.
func (c *Communicator) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ops.len()
}

// Default pipeline parameters, as upstream.
const (
	DefaultPipelineChunk    = 4 << 20
	DefaultPipelineInflight = 64
)

// putPipeline puts n bytes as chunks of chunk bytes (0: 4 MiB) with at most maxInflight
// (0: 64) in flight, and returns when all are visible at the target. It works on every
// transport (upstream: RDMA only).
func (c *Communicator) putPipeline(ctx context.Context, ip string, port int, localOff, remoteOff, n, chunk uint64, maxInflight int, ct transport.ConnType) error {
	return c.pipeline(ctx, true, ip, port, localOff, remoteOff, n, chunk, maxInflight, ct)
}

// getPipeline is PutPipeline for gets.
func (c *Communicator) getPipeline(ctx context.Context, ip string, port int, localOff, remoteOff, n, chunk uint64, maxInflight int, ct transport.ConnType) error {
	return c.pipeline(ctx, false, ip, port, localOff, remoteOff, n, chunk, maxInflight, ct)
}

func (c *Communicator) pipeline(ctx context.Context, put bool, ip string, port int, localOff, remoteOff, n, chunk uint64, maxInflight int, ct transport.ConnType) error {
	if chunk == 0 {
		chunk = DefaultPipelineChunk
	}
	if maxInflight <= 0 {
		maxInflight = DefaultPipelineInflight
	}
	ep, err := c.endpoint(ctx, ip, port, ct)
	if err != nil {
		return err
	}
	if err := transport.CheckRanges(c.buf.Size(), ep.RemoteSize(), localOff, remoteOff, n); err != nil {
		return fmt.Errorf("comm: pipeline: %w", err)
	}
	window := make([]*transport.Op, 0, maxInflight)
	var first error
	for off := uint64(0); off < n && first == nil; off += chunk {
		if len(window) == maxInflight {
			first = window[0].Wait(ctx)
			window = window[1:]
			if first != nil {
				break
			}
		}
		size := min(chunk, n-off)
		var op *transport.Op
		if put {
			op, first = ep.PutAsync(ctx, localOff+off, remoteOff+off, size)
		} else {
			op, first = ep.GetAsync(ctx, localOff+off, remoteOff+off, size)
		}
		if first == nil {
			window = append(window, op)
		}
	}
	for _, op := range window {
		if err := op.Wait(ctx); err != nil && first == nil {
			first = err
		}
		if status.CodeOf(first) == status.Timeout || errors.Is(first, status.ErrCanceled) {
			break
		}
	}
	if first != nil {
		return fmt.Errorf("comm: pipeline %s:%d size %d: %w", ip, port, n, first)
	}
	return nil
}

// CtrlSend sends a u64 tag to rank peer over the control plane (upstream ctrlSend).
func (c *Communicator) CtrlSend(ctx context.Context, peer uint32, tag uint64) error {
	return c.ctrl.SendU64(ctx, peer, tag)
}

// CtrlRecv receives a u64 tag from rank peer, waiting for the peer to connect if needed.
func (c *Communicator) CtrlRecv(ctx context.Context, peer uint32) (uint64, error) {
	return c.ctrl.RecvU64(ctx, peer)
}
