package shmem

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
)

// A team's flags live in its slot of every rank's private block: barrier arrival counters, one
// per round of a dissemination barrier, then the arrival counter of a central barrier (used in
// its first member's block).
//
// A slot is 128 bytes (the 12 words in two cache lines of their own), so a heap has room for
// 16,352 teams over its life: teams are never destroyed, and programs that split per phase
// make many. The private block's last 4 KiB are not slots (sleepersOff lies there).
const (
	slotSize      = 128
	teamSlots     = int((privSize - 4096) / slotSize)
	maxRounds     = 11 // 2^11 > 1024 ranks
	flagsOffset   = 0
	centralOffset = flagsOffset + maxRounds*8
)

// A slot holds its flags (a negative length here fails the build).
var _ [slotSize - centralOffset - 8]byte

// Team is a set of ranks that run collectives together (OpenSHMEM's teams). Methods of one team
// must be called by all its members in the same order.
type Team struct {
	h       *Heap
	members []int // world ranks, by team index
	me      int   // this rank's index
	slot    int   // its flag slot
	epoch   uint64
	central bool // every member maps the first member's private block: Sync counts there
}

// newTeam makes the team of the given world ranks in flag slot slot. Its barrier is central
// when every member maps the first member's private block (as the members told each other at
// Create, so all choose alike), dissemination otherwise.
func (h *Heap) newTeam(members []int, me, slot int) *Team {
	t := &Team{h: h, members: members, me: me, slot: slot, central: true}
	for _, m := range members {
		if !h.rankMaps(m, members[0]) {
			t.central = false
		}
	}
	return t
}

// World returns the team of every rank.
func (h *Heap) World() *Team { return h.world }

// Size returns the team's number of members; MyPE this rank's index in it.
func (t *Team) Size() int { return len(t.members) }

// MyPE returns this rank's index in the team.
func (t *Team) MyPE() int { return t.me }

// TranslatePE returns the world rank of team index pe (-1 outside).
func (t *Team) TranslatePE(pe int) int {
	if pe < 0 || pe >= len(t.members) {
		return -1
	}
	return t.members[pe]
}

// newSlot hands out the next team slot; every member of the parent calls the split, in the
// same order, so every process hands out the same slot.
func (h *Heap) newSlot() (int, error) {
	h.teamMu.Lock()
	defer h.teamMu.Unlock()
	if h.teams >= teamSlots {
		return 0, fmt.Errorf("shmem: %d teams, the most: %w", teamSlots, status.ErrUnsupported)
	}
	h.teams++
	return h.teams - 1, nil
}

// SplitStrided makes the team of parent indices start, start+stride, ... (size of them). Every
// parent member calls it; a rank outside the new team gets nil (OpenSHMEM's TEAM_INVALID).
func (t *Team) SplitStrided(start, stride, size int) (*Team, error) {
	if start < 0 || size < 1 || stride < 1 || start+(size-1)*stride >= len(t.members) {
		return nil, fmt.Errorf("shmem: split (start %d, stride %d, size %d) of a team of %d: %w", start, stride, size, len(t.members), status.ErrInvalidConfig)
	}
	slot, err := t.h.newSlot()
	if err != nil {
		return nil, err
	}
	me := -1
	var members []int
	for i := range size {
		idx := start + i*stride
		if idx == t.me {
			me = i
		}
		members = append(members, t.members[idx])
	}
	if me < 0 {
		return nil, nil
	}
	return t.h.newTeam(members, me, slot), nil
}

// Split2D arranges the team as a grid of xRange columns (row-major) and returns this rank's row
// team (x) and column team (y).
func (t *Team) Split2D(xRange int) (x, y *Team, err error) {
	n := len(t.members)
	if xRange < 1 {
		return nil, nil, fmt.Errorf("shmem: 2-D split with x range %d: %w", xRange, status.ErrInvalidConfig)
	}
	xRange = min(xRange, n)
	rows := (n + xRange - 1) / xRange
	for r := range rows { // every member creates every row team: the slots stay in step
		size := min(xRange, n-r*xRange)
		tt, err := t.SplitStrided(r*xRange, 1, size)
		if err != nil {
			return nil, nil, err
		}
		if tt != nil {
			x = tt
		}
	}
	for c := range xRange {
		size := (n - c + xRange - 1) / xRange
		tt, err := t.SplitStrided(c, xRange, size)
		if err != nil {
			return nil, nil, err
		}
		if tt != nil {
			y = tt
		}
	}
	return x, y, nil
}

// Sync waits until every member has called it (no completion of this rank's puts; see
// Barrier).
//
// Where every member maps the first member's private block (co-located ranks) the barrier is
// central: each member adds one to a counter there and sleeps on it until it reaches size ×
// epoch; the last to arrive wakes all with one system call. Each member then sleeps and is
// woken once a barrier, which is what counts when ranks outnumber cores: every sleep is a
// context switch. Otherwise it is a dissemination barrier on arrival counters in the members'
// private blocks: log2(size) rounds of one remote increment and one local wait.
func (t *Team) Sync(ctx context.Context) error {
	t.epoch++
	n := len(t.members)
	base := uint64(t.slot)*slotSize + flagsOffset
	if t.central {
		return t.syncCentral(ctx, uint64(t.slot)*slotSize+centralOffset, t.epoch*uint64(n))
	}
	for k, dist := 0, 1; dist < n; k, dist = k+1, dist*2 {
		if k >= maxRounds {
			return fmt.Errorf("shmem: team of %d: %w", n, status.ErrUnsupported)
		}
		partner := t.members[(t.me+dist)%n]
		if _, err := t.h.atomic64(ctx, buffer.AtomicFetchAdd, partner, base+uint64(k)*8, 1, 0, true); err != nil {
			return fmt.Errorf("shmem: barrier: %w", err)
		}
		t.h.wakeAt(partner, base+uint64(k)*8, true)
		w, err := t.h.localWord(base+uint64(k)*8, true)
		if err != nil {
			return err
		}
		epoch := t.epoch
		if _, err := t.h.spin(ctx, w, func(v uint64) bool { return v >= epoch }); err != nil {
			return fmt.Errorf("shmem: barrier round %d: %w", k, err)
		}
	}
	return nil
}

// syncCentral is Sync's central barrier: the counter at off of the first member's private
// block reaches target when all have arrived.
func (t *Team) syncCentral(ctx context.Context, off, target uint64) error {
	blk := t.h.mapped(t.members[0], true)
	c, err := memory.Word64(blk, off)
	if err != nil {
		return err
	}
	sleepers, err := memory.Word64(blk, sleepersOff)
	if err != nil {
		return err
	}
	if c.Add(1) >= target { // the last: wake whoever sleeps on the counter
		if sleepers.Load() > 0 {
			wake(c)
		}
		return nil
	}
	if _, err := spinOn(ctx, c, sleepers, wokenNapMax, func(v uint64) bool { return v >= target }); err != nil {
		return fmt.Errorf("shmem: barrier: %w", err)
	}
	return nil
}

// Barrier completes this rank's non-blocking operations (Quiet), then Syncs.
func (t *Team) Barrier(ctx context.Context) error {
	if err := t.h.Quiet(ctx); err != nil {
		return err
	}
	return t.Sync(ctx)
}

// Broadcast copies n bytes at srcOff of root's block (a team index) to dstOff of every member's
// block, root's included, and returns when all have them.
func (t *Team) Broadcast(ctx context.Context, root int, dstOff, srcOff, n uint64) error {
	if root < 0 || root >= len(t.members) {
		return fmt.Errorf("shmem: broadcast root %d of %d: %w", root, len(t.members), status.ErrInvalidConfig)
	}
	if err := t.h.check(t.h.w.rank, srcOff, n, t.h.size); err != nil {
		return err
	}
	if err := t.Sync(ctx); err != nil { // every destination is ready
		return err
	}
	if t.me == root {
		src := t.h.local[srcOff : srcOff+n]
		for _, pe := range t.members {
			if err := t.h.PutNBI(ctx, pe, dstOff, src); err != nil {
				return err
			}
		}
	}
	return t.Barrier(ctx)
}

// FCollect concatenates every member's n bytes at srcOff, in team order, at dstOff of every
// member's block (OpenSHMEM's fcollect; AllGather).
func (t *Team) FCollect(ctx context.Context, dstOff, srcOff, n uint64) error {
	if err := t.h.check(t.h.w.rank, srcOff, n, t.h.size); err != nil {
		return err
	}
	if err := t.Sync(ctx); err != nil {
		return err
	}
	src := t.h.local[srcOff : srcOff+n]
	for _, pe := range t.members {
		if err := t.h.PutNBI(ctx, pe, dstOff+uint64(t.me)*n, src); err != nil {
			return err
		}
	}
	return t.Barrier(ctx)
}

// AllToAll sends block j (n bytes at srcOff + j×n) of every member to member j's dstOff + i×n,
// i being the sender's index.
func (t *Team) AllToAll(ctx context.Context, dstOff, srcOff, n uint64) error {
	if err := t.h.check(t.h.w.rank, srcOff, n*uint64(len(t.members)), t.h.size); err != nil {
		return err
	}
	if err := t.Sync(ctx); err != nil {
		return err
	}
	for j, pe := range t.members {
		src := t.h.local[srcOff+uint64(j)*n : srcOff+uint64(j+1)*n]
		if err := t.h.PutNBI(ctx, pe, dstOff+uint64(t.me)*n, src); err != nil {
			return err
		}
	}
	return t.Barrier(ctx)
}

// ReduceOp is a reduction.
type ReduceOp int

// The reductions.
const (
	Sum ReduceOp = iota
	Min
	Max
	Prod
)

// DType is a reduced element's type.
type DType int

// The element types.
const (
	Int32 DType = iota
	Int64
	Uint64
	Float32
	Float64
)

func (d DType) size() uint64 {
	if d == Int32 || d == Float32 {
		return 4
	}
	return 8
}

// Reduce combines count elements of type dt at srcOff of every member's block with op and
// leaves the result at dstOff of every member's block.
func (t *Team) Reduce(ctx context.Context, op ReduceOp, dt DType, dstOff, srcOff uint64, count int) error {
	if op < Sum || op > Prod || dt < Int32 || dt > Float64 || count < 1 {
		return fmt.Errorf("shmem: reduce op %d type %d count %d: %w", op, dt, count, status.ErrInvalidConfig)
	}
	n := dt.size() * uint64(count)
	if err := t.h.check(t.h.w.rank, srcOff, n, t.h.size); err != nil {
		return err
	}
	if err := t.h.check(t.h.w.rank, dstOff, n, t.h.size); err != nil {
		return err
	}
	if err := t.Sync(ctx); err != nil { // every source is ready
		return err
	}
	acc := make([]byte, n)
	tmp := make([]byte, n)
	for i, pe := range t.members {
		if err := t.h.Get(ctx, pe, srcOff, tmp); err != nil {
			return err
		}
		if i == 0 {
			copy(acc, tmp)
			continue
		}
		combine(op, dt, acc, tmp)
	}
	if err := t.Sync(ctx); err != nil { // nobody overwrites a source another still reads
		return err
	}
	copy(t.h.local[dstOff:dstOff+n], acc)
	return nil
}

// combine folds b into a element-wise.
func combine(op ReduceOp, dt DType, a, b []byte) {
	le := binary.LittleEndian
	switch dt {
	case Int32:
		for i := 0; i < len(a); i += 4 {
			le.PutUint32(a[i:], uint32(fold(op, int32(le.Uint32(a[i:])), int32(le.Uint32(b[i:])))))
		}
	case Int64:
		for i := 0; i < len(a); i += 8 {
			le.PutUint64(a[i:], uint64(fold(op, int64(le.Uint64(a[i:])), int64(le.Uint64(b[i:])))))
		}
	case Uint64:
		for i := 0; i < len(a); i += 8 {
			le.PutUint64(a[i:], fold(op, le.Uint64(a[i:]), le.Uint64(b[i:])))
		}
	case Float32:
		for i := 0; i < len(a); i += 4 {
			v := fold(op, math.Float32frombits(le.Uint32(a[i:])), math.Float32frombits(le.Uint32(b[i:])))
			le.PutUint32(a[i:], math.Float32bits(v))
		}
	case Float64:
		for i := 0; i < len(a); i += 8 {
			v := fold(op, math.Float64frombits(le.Uint64(a[i:])), math.Float64frombits(le.Uint64(b[i:])))
			le.PutUint64(a[i:], math.Float64bits(v))
		}
	}
}

func fold[T int32 | int64 | uint64 | float32 | float64](op ReduceOp, x, y T) T {
	switch op {
	case Sum:
		return x + y
	case Min:
		return min(x, y)
	case Max:
		return max(x, y)
	default:
		return x * y
	}
}
