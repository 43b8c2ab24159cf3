package shmem

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// check validates pe and [off, off+n) of a block of size bytes.
func (h *Heap) check(pe int, off, n, size uint64) error {
	if pe < 0 || pe >= h.w.world {
		return fmt.Errorf("shmem: rank %d of %d: %w", pe, h.w.world, status.ErrInvalidConfig)
	}
	if err := buffer.CheckRange(size, off, n); err != nil {
		return fmt.Errorf("shmem: %d bytes at %d of rank %d's block: %w", n, off, pe, err)
	}
	return nil
}

// mapped returns pe's block (heap or private) when this process addresses it.
func (h *Heap) mapped(pe int, priv bool) []byte {
	if pe == h.w.rank {
		if priv {
			return h.priv
		}
		return h.local
	}
	if priv {
		return h.peers[pe].priv
	}
	return h.peers[pe].heap
}

// addr is pe's global address of offset off (heap or private block).
func (h *Heap) addr(pe int, off uint64, priv bool) uint64 {
	if priv {
		return h.pspace.Slice(pe) + off
	}
	return h.space.Slice(pe) + off
}

// rma returns the endpoint to pe over the first of the heap's transports that connects.
func (h *Heap) rma(ctx context.Context, pe int) (transport.RMA, error) {
	ep, _, err := h.mesh.First(ctx, pe, h.kinds)
	if err != nil {
		return nil, fmt.Errorf("shmem: rank %d: %w", pe, err)
	}
	return ep.(transport.RMA), nil
}

func (h *Heap) atomicRemote(ctx context.Context, pe int, op buffer.AtomicOp, addr, operand, compare uint64) (uint64, error) {
	r, err := h.rma(ctx, pe)
	if err != nil {
		return 0, err
	}
	return r.Atomic(ctx, op, transport.Remote{Addr: addr}, operand, compare)
}

// move copies b to (write) or from pe's block at off (heap or private block); async leaves a
// network transfer for Quiet.
func (h *Heap) move(ctx context.Context, write bool, pe int, off uint64, b []byte, priv, async bool) error {
	size := h.size
	if priv {
		size = privSize
	}
	if err := h.check(pe, off, uint64(len(b)), size); err != nil {
		return err
	}
	if len(b) == 0 {
		return nil
	}
	if m := h.mapped(pe, priv); m != nil {
		if write {
			h.copier.Copy(m[off:], b)
		} else {
			h.copier.Copy(b, m[off:off+uint64(len(b))])
		}
		return nil
	}
	r, err := h.rma(ctx, pe)
	if err != nil {
		return err
	}
	var op *transport.Op
	if write {
		op, err = r.WriteAsync(ctx, b, transport.Remote{Addr: h.addr(pe, off, priv)})
	} else {
		op, err = r.ReadAsync(ctx, b, transport.Remote{Addr: h.addr(pe, off, priv)})
	}
	if err != nil {
		return err
	}
	if async {
		h.track(op)
		return nil
	}
	return op.Wait(ctx)
}

func (h *Heap) track(op *transport.Op) {
	h.nbiMu.Lock()
	h.nbi = append(h.nbi, op)
	h.nbiMu.Unlock()
}

// Put copies src into rank pe's block at off and returns when the bytes are visible there.
func (h *Heap) Put(ctx context.Context, pe int, off uint64, src []byte) error {
	return h.move(ctx, true, pe, off, src, false, false)
}

// Get copies len(dst) bytes of rank pe's block at off into dst.
func (h *Heap) Get(ctx context.Context, pe int, off uint64, dst []byte) error {
	return h.move(ctx, false, pe, off, dst, false, false)
}

// PutNBI starts Put; src must stay unchanged until Quiet, which completes it.
func (h *Heap) PutNBI(ctx context.Context, pe int, off uint64, src []byte) error {
	return h.move(ctx, true, pe, off, src, false, true)
}

// GetNBI starts Get; dst is valid after Quiet.
func (h *Heap) GetNBI(ctx context.Context, pe int, off uint64, dst []byte) error {
	return h.move(ctx, false, pe, off, dst, false, true)
}

// P puts one 64-bit value (little-endian) at off of rank pe's block.
func (h *Heap) P(ctx context.Context, pe int, off, v uint64) error {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], v)
	return h.Put(ctx, pe, off, b[:])
}

// G gets one 64-bit value at off of rank pe's block.
func (h *Heap) G(ctx context.Context, pe int, off uint64) (uint64, error) {
	var b [8]byte
	if err := h.Get(ctx, pe, off, b[:]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

// Quiet completes every non-blocking operation this process issued, and returns the first
// error among them.
func (h *Heap) Quiet(ctx context.Context) error {
	h.nbiMu.Lock()
	ops := h.nbi
	h.nbi = nil
	h.nbiMu.Unlock()
	var first error
	for _, op := range ops {
		if err := op.Wait(ctx); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Fence orders this process's puts to each rank: puts issued after it are delivered after those
// before it. It completes them (as Quiet), which is the ordering with one-sided transports.
func (h *Heap) Fence(ctx context.Context) error { return h.Quiet(ctx) }

// Iput copies n elements of elem bytes from src (every srcStride elements) into rank pe's block
// from off (every dstStride elements): OpenSHMEM's strided put.
func (h *Heap) Iput(ctx context.Context, pe int, off uint64, dstStride int, src []byte, srcStride, elem, n int) error {
	if err := strided(len(src), srcStride, elem, n); err != nil || dstStride < 1 {
		return fmt.Errorf("shmem: iput: %w", errors.Join(err, status.ErrInvalidConfig))
	}
	if err := h.check(pe, off, uint64((n-1)*dstStride*elem+elem), h.size); err != nil {
		return err
	}
	for i := range n {
		s := src[i*srcStride*elem : i*srcStride*elem+elem]
		if err := h.move(ctx, true, pe, off+uint64(i*dstStride*elem), s, false, true); err != nil {
			return err
		}
	}
	return h.Quiet(ctx)
}

// Iget is Iput's mirror: n elements from rank pe's block (every srcStride) into dst (every
// dstStride).
func (h *Heap) Iget(ctx context.Context, pe int, off uint64, srcStride int, dst []byte, dstStride, elem, n int) error {
	if err := strided(len(dst), dstStride, elem, n); err != nil || srcStride < 1 {
		return fmt.Errorf("shmem: iget: %w", errors.Join(err, status.ErrInvalidConfig))
	}
	if err := h.check(pe, off, uint64((n-1)*srcStride*elem+elem), h.size); err != nil {
		return err
	}
	for i := range n {
		d := dst[i*dstStride*elem : i*dstStride*elem+elem]
		if err := h.move(ctx, false, pe, off+uint64(i*srcStride*elem), d, false, true); err != nil {
			return err
		}
	}
	return h.Quiet(ctx)
}

func strided(have, stride, elem, n int) error {
	if stride < 1 || elem < 1 || n < 1 || (n-1)*stride*elem+elem > have {
		return fmt.Errorf("%d elements of %d bytes every %d need more than %d bytes", n, elem, stride, have)
	}
	return nil
}

// Atomic runs op on the aligned 64-bit word at off of rank pe's block and returns its previous
// value: sync/atomic on a mapped block, a remote atomic otherwise; atomic with respect to every
// other atomic on the word from any rank.
func (h *Heap) Atomic(ctx context.Context, op buffer.AtomicOp, pe int, off, operand, compare uint64) (uint64, error) {
	return h.atomic64(ctx, op, pe, off, operand, compare, false)
}

func (h *Heap) atomic64(ctx context.Context, op buffer.AtomicOp, pe int, off, operand, compare uint64, priv bool) (uint64, error) {
	size := h.size
	if priv {
		size = privSize
	}
	if err := h.check(pe, off, 8, size); err != nil {
		return 0, err
	}
	if m := h.mapped(pe, priv); m != nil {
		return buffer.Atomic(m, off, op, operand, compare)
	}
	return h.atomicRemote(ctx, pe, op, h.addr(pe, off, priv), operand, compare)
}

// The OpenSHMEM atomics on 64-bit words.

// AtomicFetch reads the word.
func (h *Heap) AtomicFetch(ctx context.Context, pe int, off uint64) (uint64, error) {
	return h.Atomic(ctx, buffer.AtomicLoad, pe, off, 0, 0)
}

// AtomicSet sets the word.
func (h *Heap) AtomicSet(ctx context.Context, pe int, off, v uint64) error {
	_, err := h.Atomic(ctx, buffer.AtomicStore, pe, off, v, 0)
	return err
}

// AtomicFetchAdd adds v and returns the previous value; AtomicAdd only adds.
func (h *Heap) AtomicFetchAdd(ctx context.Context, pe int, off, v uint64) (uint64, error) {
	return h.Atomic(ctx, buffer.AtomicFetchAdd, pe, off, v, 0)
}

// AtomicAdd adds v.
func (h *Heap) AtomicAdd(ctx context.Context, pe int, off, v uint64) error {
	_, err := h.AtomicFetchAdd(ctx, pe, off, v)
	return err
}

// AtomicFetchInc adds 1 and returns the previous value; AtomicInc only adds.
func (h *Heap) AtomicFetchInc(ctx context.Context, pe int, off uint64) (uint64, error) {
	return h.AtomicFetchAdd(ctx, pe, off, 1)
}

// AtomicInc adds 1.
func (h *Heap) AtomicInc(ctx context.Context, pe int, off uint64) error {
	return h.AtomicAdd(ctx, pe, off, 1)
}

// AtomicCompareSwap sets the word to v if it equals cond, and returns the previous value.
func (h *Heap) AtomicCompareSwap(ctx context.Context, pe int, off, cond, v uint64) (uint64, error) {
	return h.Atomic(ctx, buffer.AtomicCAS, pe, off, v, cond)
}

// AtomicSwap sets the word to v and returns the previous value.
func (h *Heap) AtomicSwap(ctx context.Context, pe int, off, v uint64) (uint64, error) {
	return h.Atomic(ctx, buffer.AtomicSwap, pe, off, v, 0)
}

// AtomicFetchAnd, AtomicFetchOr and AtomicFetchXor combine v in and return the previous value.
func (h *Heap) AtomicFetchAnd(ctx context.Context, pe int, off, v uint64) (uint64, error) {
	return h.Atomic(ctx, buffer.AtomicFetchAnd, pe, off, v, 0)
}

// AtomicFetchOr ORs v in.
func (h *Heap) AtomicFetchOr(ctx context.Context, pe int, off, v uint64) (uint64, error) {
	return h.Atomic(ctx, buffer.AtomicFetchOr, pe, off, v, 0)
}

// AtomicFetchXor XORs v in.
func (h *Heap) AtomicFetchXor(ctx context.Context, pe int, off, v uint64) (uint64, error) {
	return h.Atomic(ctx, buffer.AtomicFetchXor, pe, off, v, 0)
}

// Atomic32 runs op on the aligned 32-bit word at off of rank pe's block: sync/atomic on a
// mapped block; remotely a compare-swap loop on the 64-bit word holding it (atomic with respect
// to every other atomic on either word). Load, Store, FetchAdd, Swap, CAS, FetchAnd/Or/Xor.
func (h *Heap) Atomic32(ctx context.Context, op buffer.AtomicOp, pe int, off uint64, operand, compare uint32) (uint32, error) {
	if err := h.check(pe, off, 4, h.size); err != nil {
		return 0, err
	}
	if off%4 != 0 || !op.Valid() {
		return 0, fmt.Errorf("shmem: 32-bit %v at offset %d: %w", op, off, status.ErrInvalidConfig)
	}
	apply := func(old uint32) (uint32, bool) {
		switch op {
		case buffer.AtomicLoad:
			return old, false
		case buffer.AtomicStore, buffer.AtomicSwap:
			return operand, true
		case buffer.AtomicFetchAdd:
			return old + operand, true
		case buffer.AtomicCAS:
			return operand, old == compare
		case buffer.AtomicFetchAnd:
			return old & operand, true
		case buffer.AtomicFetchOr:
			return old | operand, true
		default:
			return old ^ operand, true
		}
	}
	if m := h.mapped(pe, false); m != nil {
		p := (*uint32)(unsafe.Pointer(&m[off])) // 4-byte aligned: the block is page-aligned
		for {
			old := atomic.LoadUint32(p)
			nv, write := apply(old)
			if !write || atomic.CompareAndSwapUint32(p, old, nv) {
				return old, nil
			}
		}
	}
	word := off &^ 7
	shift := (off - word) * 8 // little-endian: the word's low half is the lower address
	cur, err := h.atomicRemote(ctx, pe, buffer.AtomicLoad, h.addr(pe, word, false), 0, 0)
	if err != nil {
		return 0, err
	}
	for {
		old := uint32(cur >> shift)
		nv, write := apply(old)
		if !write {
			return old, nil
		}
		next := cur&^(0xffffffff<<shift) | uint64(nv)<<shift
		prev, err := h.atomicRemote(ctx, pe, buffer.AtomicCAS, h.addr(pe, word, false), next, cur)
		if err != nil {
			return 0, err
		}
		if prev == cur {
			return old, nil
		}
		cur = prev
	}
}

// SignalOp is how PutSignal updates the signal word.
type SignalOp int

// The signal operations (OpenSHMEM's SHMEM_SIGNAL_SET, SHMEM_SIGNAL_ADD).
const (
	SignalSet SignalOp = iota
	SignalAdd
)

// PutSignal puts src at off of rank pe's block, then updates pe's 64-bit signal word at sigOff
// (set to or add sig): a rank waiting on the signal sees the data.
func (h *Heap) PutSignal(ctx context.Context, pe int, off uint64, src []byte, sigOff, sig uint64, op SignalOp) error {
	if op != SignalSet && op != SignalAdd {
		return fmt.Errorf("shmem: signal op %d: %w", op, status.ErrInvalidConfig)
	}
	if err := h.check(pe, sigOff, 8, h.size); err != nil {
		return err
	}
	if err := h.Put(ctx, pe, off, src); err != nil {
		return err
	}
	aop := buffer.AtomicStore
	if op == SignalAdd {
		aop = buffer.AtomicFetchAdd
	}
	if _, err := h.Atomic(ctx, aop, pe, sigOff, sig, 0); err != nil {
		return err
	}
	h.wakeAt(pe, sigOff, false)
	return nil
}

// wakeAt wakes a co-located rank pe sleeping on its word at off (heap or private block),
// if any of its waits sleeps at all (its sleeper count is not zero): no system call otherwise.
func (h *Heap) wakeAt(pe int, off uint64, priv bool) {
	if pe == h.w.rank {
		return
	}
	p := h.peers[pe]
	if p.priv == nil {
		return // reached over the network: its sleeps are bounded
	}
	n, err := memory.Word64(p.priv, sleepersOff)
	if err != nil || n.Load() == 0 {
		return
	}
	m := p.heap
	if priv {
		m = p.priv
	}
	if w, err := memory.Word64(m, off); err == nil {
		wake(w)
	}
}

// SignalFetch reads this rank's signal word at off.
func (h *Heap) SignalFetch(off uint64) (uint64, error) {
	return h.Atomic(context.Background(), buffer.AtomicLoad, h.w.rank, off, 0, 0)
}

// Cmp compares a word with a value in WaitUntil and Test.
type Cmp int

// The comparisons (OpenSHMEM's SHMEM_CMP_*).
const (
	CmpEQ Cmp = iota
	CmpNE
	CmpGT
	CmpGE
	CmpLT
	CmpLE
)

func (c Cmp) holds(v, with uint64) bool {
	switch c {
	case CmpEQ:
		return v == with
	case CmpNE:
		return v != with
	case CmpGT:
		return v > with
	case CmpGE:
		return v >= with
	case CmpLT:
		return v < with
	default:
		return v <= with
	}
}

func (h *Heap) localWord(off uint64, priv bool) (*atomic.Uint64, error) {
	b := h.local
	if priv {
		b = h.priv
	}
	return memory.Word64(b, off)
}

// Test says whether this rank's 64-bit word at off compares with value as cmp says.
func (h *Heap) Test(off uint64, cmp Cmp, value uint64) (bool, error) {
	if cmp < CmpEQ || cmp > CmpLE {
		return false, fmt.Errorf("shmem: comparison %d: %w", cmp, status.ErrInvalidConfig)
	}
	w, err := h.localWord(off, false)
	if err != nil {
		return false, err
	}
	return cmp.holds(w.Load(), value), nil
}

// WaitUntil waits until this rank's 64-bit word at off compares with value as cmp says (written
// by a peer's put, atomic or signal) and returns the word.
func (h *Heap) WaitUntil(ctx context.Context, off uint64, cmp Cmp, value uint64) (uint64, error) {
	if cmp < CmpEQ || cmp > CmpLE {
		return 0, fmt.Errorf("shmem: comparison %d: %w", cmp, status.ErrInvalidConfig)
	}
	w, err := h.localWord(off, false)
	if err != nil {
		return 0, err
	}
	return h.spin(ctx, w, func(v uint64) bool { return cmp.holds(v, value) })
}

// sleepersOff is the word of a rank's private block that counts its waits asleep, so a
// co-located writer makes the wake-up system call only when someone sleeps. It lies past the
// flags of the last team slot.
const sleepersOff = privSize - 8

// spin polls w until ok: briefly busy, then sleeping on the word (futex, see futex.go), so a
// short wait is fast and a long one, or one among more ranks than cores, costs no CPU. A
// co-located writer that signals (PutSignal, a barrier's arrival) wakes it; any other change is
// seen when a sleep's bound ends (napFor).
func (h *Heap) spin(ctx context.Context, w *atomic.Uint64, ok func(uint64) bool) (uint64, error) {
	sleepers, err := memory.Word64(h.priv, sleepersOff)
	if err != nil {
		return 0, err
	}
	return spinOn(ctx, w, sleepers, futexNapMax, ok)
}

// spinOn is spin on a word of any mapped private block, whose sleepersOff word is sleepers;
// no sleep lasts longer than napMax.
func spinOn(ctx context.Context, w, sleepers *atomic.Uint64, napMax time.Duration, ok func(uint64) bool) (uint64, error) {
	var y yielder
	var asleep time.Time // when the first sleep began
	for i := 0; ; i++ {
		v := w.Load()
		if ok(v) {
			y.done()
			return v, nil
		}
		if i < 64 {
			continue
		}
		if i%16 == 0 || !asleep.IsZero() {
			if err := status.FromContext(ctx); err != nil {
				return 0, err
			}
		}
		if y.yield() {
			continue
		}
		nap := futexNap
		if asleep.IsZero() {
			asleep = time.Now()
		} else {
			nap = napFor(time.Since(asleep), napMax)
		}
		if dl, has := ctx.Deadline(); has {
			nap = max(min(nap, time.Until(dl)), time.Microsecond)
		}
		sleepers.Add(1)
		if v = w.Load(); !ok(v) { // a writer that saw no sleeper did not wake us: look again first
			sleepOn(w, uint32(v), nap)
		}
		sleepers.Add(^uint64(0))
	}
}
