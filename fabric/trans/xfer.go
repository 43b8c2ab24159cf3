package trans

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// Opcode is a transfer's direction (Mooncake's TransferOpcode values).
type Opcode int

// The opcodes.
const (
	Read  Opcode = 0 // remote -> local
	Write Opcode = 1 // local -> remote
)

// Request is one transfer of a batch: Size bytes between this process's memory at Local and
// the peer's at Remote (its own virtual address, inside memory it registered).
type Request struct {
	Op            Opcode
	Local, Remote uint64
	Size          uint64
}

// Status is a batch's state (Mooncake's TransferStatusEnum values).
type Status int

// The statuses.
const (
	Waiting Status = iota
	Pending
	Invalid
	Canceled
	Completed
	Timeout
	Failed
)

func (s Status) String() string {
	return [...]string{"waiting", "pending", "invalid", "canceled", "completed", "timeout", "failed"}[s]
}

// MaxBatch bounds the requests of one batch.
const MaxBatch = 1 << 20

// Batch is a submitted set of transfers to one peer.
type Batch struct {
	done  chan struct{}
	state atomic.Int32
	err   error // set before done closes
}

// Status returns the batch's state without waiting.
func (b *Batch) Status() Status { return Status(b.state.Load()) }

// Done is closed when the batch has completed, failed or timed out.
func (b *Batch) Done() <-chan struct{} { return b.done }

// Wait waits for the batch and returns its error (nil when completed).
func (b *Batch) Wait(ctx context.Context) error {
	select {
	case <-b.done:
		return b.err
	case <-ctx.Done():
		return status.FromContext(ctx)
	}
}

// Write copies size bytes at local to the peer's memory at remote; it returns when they are
// visible there.
func (e *Engine) Write(ctx context.Context, peer string, local, remote, size uint64) error {
	return e.Transfer(ctx, peer, []Request{{Op: Write, Local: local, Remote: remote, Size: size}}, nil)
}

// Read copies size bytes of the peer's memory at remote to local.
func (e *Engine) Read(ctx context.Context, peer string, local, remote, size uint64) error {
	return e.Transfer(ctx, peer, []Request{{Op: Read, Local: local, Remote: remote, Size: size}}, nil)
}

// BatchWrite writes every (locals[i], remotes[i], sizes[i]).
func (e *Engine) BatchWrite(ctx context.Context, peer string, locals, remotes, sizes []uint64) error {
	reqs, err := requests(Write, locals, remotes, sizes)
	if err != nil {
		return err
	}
	return e.Transfer(ctx, peer, reqs, nil)
}

// BatchRead reads every (locals[i], remotes[i], sizes[i]).
func (e *Engine) BatchRead(ctx context.Context, peer string, locals, remotes, sizes []uint64) error {
	reqs, err := requests(Read, locals, remotes, sizes)
	if err != nil {
		return err
	}
	return e.Transfer(ctx, peer, reqs, nil)
}

func requests(op Opcode, locals, remotes, sizes []uint64) ([]Request, error) {
	if len(locals) != len(remotes) || len(locals) != len(sizes) {
		return nil, fmt.Errorf("trans: %d locals, %d remotes, %d sizes: %w", len(locals), len(remotes), len(sizes), status.ErrInvalidConfig)
	}
	reqs := make([]Request, len(locals))
	for i := range locals {
		reqs[i] = Request{Op: op, Local: locals[i], Remote: remotes[i], Size: sizes[i]}
	}
	return reqs, nil
}

// Transfer runs reqs to peer and returns when all are complete; notify, if set, is delivered to
// the peer after them. The caller's goroutine waits for the requests itself (no goroutine per
// batch, no wake-up from one: from C and Python, whose threads call in, that hand-off cost more
// than a shared-memory batch).
func (e *Engine) Transfer(ctx context.Context, peer string, reqs []Request, notify *Notify) error {
	p, ops, kind, ep, err := e.start(ctx, peer, reqs)
	if err != nil {
		return err
	}
	defer e.wg.Done()
	// The batch is bounded by Config.Timeout within the caller's ctx; a batch whose ops all
	// completed while posted (shared memory) has nothing to wait for, and skips the timer.
	bctx := ctx
	if notify != nil || slices.ContainsFunc(ops, func(o *transport.Op) bool { return !o.Completed() }) {
		var cancel context.CancelFunc
		bctx, cancel = context.WithTimeout(ctx, e.cfg.Timeout)
		defer cancel()
	}
	_, err = e.finish(bctx, peer, p, ops, kind, ep, notify)
	if err != nil && bctx.Err() != nil && errors.Is(err, status.ErrTimeout) {
		return fmt.Errorf("trans: batch of %d requests to %s: %w", len(reqs), peer, err)
	}
	return err
}

// Submit starts reqs to peer and returns at once (Mooncake's submitTransfer, with notify its
// submitTransferWithNotify). Requests are checked first (nothing moves if one is bad); the
// batch times out after Config.Timeout.
func (e *Engine) Submit(ctx context.Context, peerID string, reqs []Request, notify *Notify) (*Batch, error) {
	p, ops, kind, ep, err := e.start(ctx, peerID, reqs)
	if err != nil {
		return nil, err
	}
	b := &Batch{done: make(chan struct{})}
	b.state.Store(int32(Pending))
	go func() { // owned by e: Close waits for it
		defer e.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), e.cfg.Timeout)
		defer cancel()
		st, err := e.finish(ctx, peerID, p, ops, kind, ep, notify)
		b.err = err
		b.state.Store(int32(st))
		close(b.done)
	}()
	return b, nil
}

// start checks reqs and posts them to peer; on success the engine's WaitGroup counts the batch
// (the caller calls e.wg.Done once it has finished).
func (e *Engine) start(ctx context.Context, peerID string, reqs []Request) (*peer, []*transport.Op, transport.ConnType, transport.Endpoint, error) {
	if e.cfg.Role == Receiver {
		return nil, nil, -1, nil, fmt.Errorf("trans: a receiver does not initiate transfers: %w", status.ErrInvalidConfig)
	}
	if len(reqs) == 0 || len(reqs) > MaxBatch {
		return nil, nil, -1, nil, fmt.Errorf("trans: batch of %d requests: %w", len(reqs), status.ErrInvalidConfig)
	}
	merges, err := check(reqs)
	if err != nil {
		return nil, nil, -1, nil, err
	}
	var places []memory.Place   // each request's local place; nil: all host memory
	if memory.MayHoldDevice() { // one look per batch; each local buffer only where device memory can exist
		for i, r := range reqs {
			pl, err := memory.LocateRange(memory.Ptr(r.Local), r.Size)
			if err != nil {
				return nil, nil, -1, nil, fmt.Errorf("trans: request %d's local buffer: %w", i, err)
			}
			if pl.OnDevice() && places == nil {
				places = make([]memory.Place, len(reqs))
				for j := range i {
					places[j] = memory.HostPlace
				}
			}
			if places != nil {
				places[i] = pl
			}
		}
	}
	p, err := e.peer(ctx, peerID)
	if err != nil {
		return nil, nil, -1, nil, err
	}
	if places == nil && merges { // device requests stay apart: neighbouring allocations are not one
		// The merged list lives until post has read it, in a pooled array: a batch of 512
		// adjacent blocks made 16 KiB of garbage, and the collections it brought put
		// 100-150 µs batches in its shared-memory p99 (22 µs without them).
		m := mergePool.Get().(*[]Request)
		reqs = mergeInto((*m)[:0], reqs)
		defer func() {
			*m = reqs[:0]
			mergePool.Put(m)
		}()
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil, nil, -1, nil, fmt.Errorf("trans: %w", status.ErrClosed)
	}
	e.wg.Add(1)
	e.mu.Unlock()
	ops, kind, ep, err := e.post(ctx, p, reqs, places)
	if err != nil {
		e.wg.Done()
		e.dropIfGone(p, err)
		return nil, nil, -1, nil, err
	}
	return p, ops, kind, ep, nil
}

// check refuses a batch with a request that names no memory, no bytes, a range past the
// address space or an unknown direction, and says whether a request continues the one before
// it (as continues does). A function of its own, with the previous request's direction and
// ends kept in registers and the error built out of line: inside start the loop reloaded
// start's state from its stack for every request (perf annotate: 2-3 µs of a 512-block batch).
func check(reqs []Request) (merges bool, err error) {
	prevOp, prevL, prevR := Opcode(-1), uint64(0), uint64(0)
	for i := range reqs {
		r := &reqs[i]
		le, re := r.Local+r.Size, r.Remote+r.Size
		if (r.Op != Read && r.Op != Write) || r.Local == 0 || r.Remote == 0 || r.Size == 0 || le < r.Local || re < r.Remote {
			return false, badRequest(i, *r)
		}
		merges = merges || r.Op == prevOp && r.Local == prevL && r.Remote == prevR
		prevOp, prevL, prevR = r.Op, le, re
	}
	return merges, nil
}

// badRequest is the error for request i, one that check refuses.
//
//go:noinline
func badRequest(i int, r Request) error {
	return fmt.Errorf("trans: request %d (op %d, %d bytes %#x <-> %#x): %w", i, r.Op, r.Size, r.Local, r.Remote, status.ErrInvalidConfig)
}

// finish waits for a batch's ops within ctx, delivers notify after them, and returns the
// batch's final state and error (a failed endpoint is dropped from the mesh).
func (e *Engine) finish(ctx context.Context, peerID string, p *peer, ops []*transport.Op, kind transport.ConnType, ep transport.Endpoint, notify *Notify) (Status, error) {
	var errs []error
	for _, op := range ops {
		if err := op.Wait(ctx); err != nil {
			errs = append(errs, err)
			if status.FromContext(ctx) != nil {
				break
			}
		}
	}
	err := errors.Join(errs...)
	if err == nil && notify != nil {
		n := *notify
		if n.Name == "" {
			n.Name = e.id
		}
		err = e.call(ctx, peerID, "notify", []Notify{n}, nil)
	}
	st := Completed
	switch {
	case err != nil && errors.Is(err, status.ErrTimeout):
		st = Timeout
	case err != nil:
		st = Failed
		if kind >= 0 && !errors.Is(err, status.ErrOutOfRange) && !errors.Is(err, status.ErrNotFound) {
			e.mesh.Drop(p.id, kind, ep)
			e.dropIfGone(p, err)
		}
	}
	if err != nil {
		err = fmt.Errorf("trans: to %s: %w", peerID, err)
	}
	return st, err
}

// dropIfGone forgets a peer after an error that says its process is gone, so its restart is
// reached anew.
func (e *Engine) dropIfGone(p *peer, err error) {
	if errors.Is(err, status.ErrPeerClosed) || errors.Is(err, status.ErrClosed) {
		e.forget(p.uid)
	}
}

// post posts every request on the first transport to p that connects (shared memory for a peer
// on this host, then the others in Config.Kinds' order). Requests whose local memory is on a
// device (places[i]) go by the endpoint's own device path (same host: one device copy), else
// through a staging ring of the device's.
func (e *Engine) post(ctx context.Context, p *peer, reqs []Request, places []memory.Place) ([]*transport.Op, transport.ConnType, transport.Endpoint, error) {
	kinds := make([]transport.ConnType, 0, len(e.cfg.Kinds))
	for _, k := range e.cfg.Kinds {
		if k != transport.SHM || e.mesh.SameHost(p.card) {
			kinds = append(kinds, k)
		}
	}
	ep, k, err := e.mesh.First(ctx, p.id, kinds)
	if err != nil {
		return nil, -1, nil, fmt.Errorf("trans: no transport reaches %s: %w", p.uid, err)
	}
	r := ep.(transport.RMA)
	// An endpoint that carries many pieces per message (TCP, shm) gets the batch's host requests
	// as two vectors, one per direction: a KV cache's scattered blocks then cost a message per
	// megabyte (TCP) or one vector copy (shm), not a request, a wake-up and an ack each.
	vr, vector := ep.(transport.VectorRMA)
	vector = vector && len(reqs) > 1
	var ops []*transport.Op
	var wsrc, rdst [][]byte
	var wrem, rrem []transport.Remote
	if !vector {
		ops = make([]*transport.Op, 0, len(reqs))
	} else {
		// The lists are the engine's again when the vector calls return (VectorRMA's
		// contract): pooled, a batch of 512 blocks does not make 24 KiB of garbage.
		w, r := vecPool.Get().(*vecLists), vecPool.Get().(*vecLists)
		wsrc, wrem, rdst, rrem = w.bufs, w.rems, r.bufs, r.rems
		if reqs[0].Op == Write { // a batch is mostly one direction: room for all of it
			wsrc, wrem = slices.Grow(wsrc, len(reqs)), slices.Grow(wrem, len(reqs))
		} else {
			rdst, rrem = slices.Grow(rdst, len(reqs)), slices.Grow(rrem, len(reqs))
		}
		defer func() {
			w.put(wsrc, wrem)
			r.put(rdst, rrem)
		}()
	}
	if vector && places == nil { // all host memory: a loop of its own, nothing spilled per request
		// The batch's leading run of one direction fills that direction's list by index (a
		// batch is mostly one direction; its list has room for all of it): appending to four
		// lists kept them all live, and the loop spilled them to its stack for every request.
		i, n := 0, len(reqs)
		if reqs[0].Op == Write {
			wsrc, wrem = wsrc[:n], wrem[:n]
			for ; i < n && reqs[i].Op == Write; i++ {
				wsrc[i] = memory.HostSlice(memory.Ptr(reqs[i].Local), reqs[i].Size)
				wrem[i] = transport.Remote{Addr: reqs[i].Remote}
			}
			wsrc, wrem = wsrc[:i], wrem[:i]
		} else {
			rdst, rrem = rdst[:n], rrem[:n]
			for ; i < n && reqs[i].Op != Write; i++ {
				rdst[i] = memory.HostSlice(memory.Ptr(reqs[i].Local), reqs[i].Size)
				rrem[i] = transport.Remote{Addr: reqs[i].Remote}
			}
			rdst, rrem = rdst[:i], rrem[:i]
		}
		for _, q := range reqs[i:] {
			local := memory.HostSlice(memory.Ptr(q.Local), q.Size)
			if q.Op == Write {
				wsrc, wrem = append(wsrc, local), append(wrem, transport.Remote{Addr: q.Remote})
			} else {
				rdst, rrem = append(rdst, local), append(rrem, transport.Remote{Addr: q.Remote})
			}
		}
	} else {
		for i, q := range reqs {
			if places != nil && places[i].OnDevice() {
				ops = append(ops, e.postDevice(ctx, r, q, places[i]))
				continue
			}
			local := memory.HostSlice(memory.Ptr(q.Local), q.Size)
			remote := transport.Remote{Addr: q.Remote}
			if vector {
				if q.Op == Write {
					wsrc, wrem = append(wsrc, local), append(wrem, remote)
				} else {
					rdst, rrem = append(rdst, local), append(rrem, remote)
				}
				continue
			}
			var op *transport.Op
			if q.Op == Write {
				op, err = r.WriteAsync(ctx, local, remote)
			} else {
				op, err = r.ReadAsync(ctx, local, remote)
			}
			if err != nil {
				op = transport.Failed(err)
			}
			ops = append(ops, op)
		}
	}
	if len(wsrc) > 0 {
		op, err := vr.WriteVAsync(ctx, wsrc, wrem)
		if err != nil {
			op = transport.Failed(err)
		}
		ops = append(ops, op)
	}
	if len(rdst) > 0 {
		op, err := vr.ReadVAsync(ctx, rdst, rrem)
		if err != nil {
			op = transport.Failed(err)
		}
		ops = append(ops, op)
	}
	return ops, k, ep, nil
}

// vecLists are one direction's lists of a vector call, kept between batches.
type vecLists struct {
	bufs [][]byte
	rems []transport.Remote
}

var vecPool = sync.Pool{New: func() any { return new(vecLists) }}

// put clears bufs (the pool must not keep the batch's memory alive) and pools both lists.
func (v *vecLists) put(bufs [][]byte, rems []transport.Remote) {
	clear(bufs)
	v.bufs, v.rems = bufs[:0], rems[:0]
	vecPool.Put(v)
}

// postDevice posts one request whose local memory is device memory at pl.
func (e *Engine) postDevice(ctx context.Context, r transport.RMA, q Request, pl memory.Place) *transport.Op {
	remote := transport.Remote{Addr: q.Remote}
	if d, ok := r.(transport.DeviceRMA); ok {
		var op *transport.Op
		var err error
		if q.Op == Write {
			op, err = d.WriteFromDeviceAsync(ctx, memory.Ptr(q.Local), pl, q.Size, remote)
		} else {
			op, err = d.ReadToDeviceAsync(ctx, memory.Ptr(q.Local), pl, q.Size, remote)
		}
		if err != nil {
			return transport.Failed(err)
		}
		return op
	}
	ring, err := e.ring(pl)
	if err != nil {
		return transport.Failed(err)
	}
	// The batch's goroutine bounds the wait; the ring's transfers stop with the engine's timeout.
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.Timeout)
	var op *transport.Op
	if q.Op == Write {
		op = ring.Write(tctx, r, memory.Ptr(q.Local), q.Size, remote)
	} else {
		op = ring.Read(tctx, r, memory.Ptr(q.Local), q.Size, remote)
	}
	go func() { <-op.Done(); cancel() }() // owned by op: ends with it
	return op
}

// ring returns the staging ring of device memory at pl, made on first use.
func (e *Engine) ring(pl memory.Place) (*transport.HostRing, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, fmt.Errorf("trans: %w", status.ErrClosed)
	}
	if r := e.rings[pl]; r != nil {
		return r, nil
	}
	r, err := transport.NewHostRing(pl, 0, 0)
	if err != nil {
		return nil, fmt.Errorf("trans: %w", err)
	}
	if e.rings == nil {
		e.rings = map[memory.Place]*transport.HostRing{}
	}
	e.rings[pl] = r
	return r, nil
}

// mergeInto appends reqs to out with each request that continues the one before it (same
// direction, local and remote ranges both contiguous) merged into it, and returns out. start
// calls it only for a batch where one does: a KV batch's blocks are mostly scattered, and its
// slice is then posted as it is.
func mergeInto(out, reqs []Request) []Request {
	for _, r := range reqs {
		if n := len(out); n > 0 {
			if l := &out[n-1]; continues(*l, r) {
				l.Size += r.Size
				continue
			}
		}
		out = append(out, r)
	}
	return out
}

// mergePool keeps start's merged request lists.
var mergePool = sync.Pool{New: func() any { return new([]Request) }}

// continues says whether r goes on where l ends, on both sides and in the same direction.
func continues(l, r Request) bool {
	return l.Op == r.Op && l.Local+l.Size == r.Local && l.Remote+l.Size == r.Remote
}

// SendNotify delivers a notification to peer on its own.
func (e *Engine) SendNotify(ctx context.Context, peer string, n Notify) error {
	if n.Name == "" {
		n.Name = e.id
	}
	return e.call(ctx, peer, "notify", []Notify{n}, nil)
}

// Paged describes transfers of whole blocks of paged KV layouts in one request: block i of the
// list moves LocalBlocks[i] (at LocalBase + index × BlockSize) to or from RemoteBlocks[i] (at
// RemoteBase + index × BlockSize). Runs of consecutive indices on both sides go as one
// transfer.
type Paged struct {
	Op                        Opcode
	LocalBase, RemoteBase     uint64
	BlockSize                 uint64
	LocalBlocks, RemoteBlocks []uint32
}

// Requests expands p into requests.
func (p Paged) Requests() ([]Request, error) {
	if len(p.LocalBlocks) != len(p.RemoteBlocks) || len(p.LocalBlocks) == 0 || p.BlockSize == 0 {
		return nil, fmt.Errorf("trans: paged: %d local and %d remote blocks of %d bytes: %w", len(p.LocalBlocks), len(p.RemoteBlocks), p.BlockSize, status.ErrInvalidConfig)
	}
	reqs := make([]Request, len(p.LocalBlocks))
	for i := range reqs {
		lo, ro := uint64(p.LocalBlocks[i])*p.BlockSize, uint64(p.RemoteBlocks[i])*p.BlockSize
		if lo/p.BlockSize != uint64(p.LocalBlocks[i]) || p.LocalBase+lo < p.LocalBase || p.RemoteBase+ro < p.RemoteBase {
			return nil, fmt.Errorf("trans: paged: block %d overflows: %w", i, status.ErrOutOfRange)
		}
		reqs[i] = Request{Op: p.Op, Local: p.LocalBase + lo, Remote: p.RemoteBase + ro, Size: p.BlockSize}
	}
	return reqs, nil
}

// TransferPaged runs a paged descriptor (notify as Transfer's).
func (e *Engine) TransferPaged(ctx context.Context, peer string, p Paged, notify *Notify) error {
	reqs, err := p.Requests()
	if err != nil {
		return err
	}
	return e.Transfer(ctx, peer, reqs, notify)
}
