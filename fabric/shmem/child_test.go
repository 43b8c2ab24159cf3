package shmem

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"time"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/coord/store/storetest"
	"github.com/hmc-go/hmc/internal/childtest"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

const mib = 1 << 20

// Offsets in the 4 MiB test heap, one area per category.
const (
	offRMA    = 0         // world × 4 KiB: rank q's puts into each peer
	offNBI    = 64 << 10  // world × 4 KiB
	offStride = 128 << 10 // iput target
	offAtomic = 192 << 10 // counters
	offLock   = 200 << 10
	offShared = 208 << 10 // the lock-protected counter
	offSignal = 216 << 10 // signal words, one per sender
	offSigDat = 256 << 10 // signal payloads, 4 KiB per sender
	offBcast  = 512 << 10
	offColl   = 1 * mib // fcollect / alltoall / reduce areas
	offOrder  = 3 * mib
)

func pat(r, i int) byte { return byte(r*29 + i*3 + i>>7) }

// childKinds: HMC_SHMEM_OPS shm (co-located blocks mapped), tcp (none), mixed (even ranks map
// each other; odd ranks use the network for everything).
func childKinds(rank int) []transport.ConnType {
	switch os.Getenv("HMC_SHMEM_OPS") {
	case "tcp":
		return []transport.ConnType{transport.TCP}
	case "mixed":
		if rank%2 == 1 {
			return []transport.ConnType{transport.TCP}
		}
	}
	return []transport.ConnType{transport.SHM, transport.TCP}
}

func child() int {
	if err := runChild(); err != nil {
		fmt.Println("FAIL", err)
		fmt.Fprintln(os.Stderr, "shmem child: FAIL", err) // seen even when the test reads another child
		return 1
	}
	return 0
}

func runChild() error {
	world, _ := strconv.Atoi(os.Getenv("HMC_WORLD"))
	me, _ := strconv.Atoi(os.Getenv("HMC_RANK"))
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cfg := DefaultConfig()
	cfg.StartStore = false
	cfg.Kinds = childKinds(me)
	cfg.BindIP = os.Getenv("HMC_SHMEM_BIND") // another network namespace's address (netns tests)
	cfg.World, cfg.Rank = world, me
	w, err := Init(ctx, os.Getenv("HMC_STORE_URL"), cfg)
	if err != nil {
		return err
	}
	defer w.Close()
	h, err := w.Create(ctx, 5, 4*mib)
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	switch os.Getenv("HMC_SHMEM_CHILD") { // no Destroy in these: it is collective
	case "storekill":
		return outliveStore(ctx, w, h, me, world)
	case "rankkill":
		return outliveRank(ctx, h, me, world)
	case "netfault":
		return outliveNetFaults(ctx, h, me, world)
	}
	if err := categories(ctx, w, h, me, world); err != nil {
		return err
	}
	if err := h.Destroy(ctx); err != nil {
		return err
	}
	fmt.Println("OK", me)
	return nil
}

func categories(ctx context.Context, w *World, h *Heap, me, n int) error {
	wt := h.World()
	// Setup and memory: the layout, and which blocks are plain memory here.
	if h.Rank() != me || h.NumRanks() != n || wt.Size() != n || wt.MyPE() != me {
		return errors.New("setup: ranks")
	}
	for pe := range n {
		p := h.Ptr(pe)
		reach, _ := h.TopologyCanReach(pe)
		wantMapped := pe == me || (os.Getenv("HMC_SHMEM_OPS") == "shm") || (os.Getenv("HMC_SHMEM_OPS") == "mixed" && me%2 == 0 && pe%2 == 0)
		if (p != nil) != wantMapped || (reach&OpMTE != 0) != wantMapped {
			return fmt.Errorf("memory: rank %d mapped %v (reach %d), want %v", pe, p != nil, reach, wantMapped)
		}
	}
	// Remote RMA: blocking puts to every rank, checked after a barrier by the owner; G and
	// Get back; non-blocking puts completed by Quiet.
	src := make([]byte, 4096)
	for i := range src {
		src[i] = pat(me, i)
	}
	for pe := range n {
		if err := h.Put(ctx, pe, offRMA+uint64(me)*4096, src); err != nil {
			return fmt.Errorf("put to %d: %w", pe, err)
		}
		if err := h.PutNBI(ctx, pe, offNBI+uint64(me)*4096, src); err != nil {
			return fmt.Errorf("put_nbi to %d: %w", pe, err)
		}
	}
	if err := h.Quiet(ctx); err != nil {
		return err
	}
	if err := h.P(ctx, (me+1)%n, offAtomic+512+uint64(me)*8, uint64(1000+me)); err != nil {
		return err
	}
	if err := wt.Barrier(ctx); err != nil {
		return fmt.Errorf("barrier: %w", err)
	}
	for q := range n {
		for _, area := range []uint64{offRMA, offNBI} {
			got := h.Local()[area+uint64(q)*4096 : area+uint64(q+1)*4096]
			for i, b := range got {
				if b != pat(q, i) {
					return fmt.Errorf("rma: area %d from rank %d byte %d", area, q, i)
				}
			}
		}
	}
	prev := (me + n - 1) % n
	if v, err := h.G(ctx, me, offAtomic+512+uint64(prev)*8); err != nil || v != uint64(1000+prev) {
		return fmt.Errorf("p/g: %d %v", v, err)
	}
	back := make([]byte, 4096)
	if err := h.GetNBI(ctx, (me+1)%n, offRMA+uint64(me)*4096, back); err != nil {
		return err
	}
	if err := h.Quiet(ctx); err != nil || !bytes.Equal(back, src) {
		return fmt.Errorf("get_nbi: %v", err)
	}
	// Strided: every 3rd 8-byte element of src to every 2nd element at the next rank.
	if err := h.Iput(ctx, (me+1)%n, offStride, 2, src, 3, 8, 16); err != nil {
		return fmt.Errorf("iput: %w", err)
	}
	// Bad input: typed errors, nothing moves.
	if err := h.Put(ctx, 0, h.Size()-8, src[:16]); !errors.Is(err, status.ErrOutOfRange) {
		return fmt.Errorf("put past the block: %v", err)
	}
	if err := h.Put(ctx, n, 0, src[:8]); !errors.Is(err, status.ErrInvalidConfig) {
		return fmt.Errorf("put to rank %d: %v", n, err)
	}
	if _, err := h.Atomic(ctx, buffer.AtomicFetchAdd, 0, offAtomic+4, 1, 0); !errors.Is(err, status.ErrInvalidConfig) {
		return fmt.Errorf("misaligned atomic: %v", err)
	}
	if err := wt.Barrier(ctx); err != nil {
		return err
	}
	got := make([]byte, 16*8)
	if err := h.Iget(ctx, me, offStride, 2, got, 1, 8, 16); err != nil {
		return fmt.Errorf("iget: %w", err)
	}
	for e := range 16 {
		if !bytes.Equal(got[e*8:e*8+8], func() []byte { s := make([]byte, 8); copy(s, srcOf(prev)[e*24:e*24+8]); return s }()) {
			return fmt.Errorf("iput/iget element %d", e)
		}
	}
	// Atomics: 1,000 fetch-adds by every rank on rank 0's counter end exact; 32-bit adds next to
	// it; a lock built from compare-swap protects a plain read-modify-write counter.
	for range 1000 {
		if _, err := h.AtomicFetchAdd(ctx, 0, offAtomic, 1); err != nil {
			return fmt.Errorf("fetch-add: %w", err)
		}
		if _, err := h.Atomic32(ctx, buffer.AtomicFetchAdd, 0, offAtomic+8, 2, 0); err != nil {
			return fmt.Errorf("32-bit add: %w", err)
		}
		if _, err := h.Atomic32(ctx, buffer.AtomicFetchAdd, 0, offAtomic+12, 3, 0); err != nil {
			return fmt.Errorf("32-bit add: %w", err)
		}
	}
	for range 50 {
		for {
			old, err := h.AtomicCompareSwap(ctx, 0, offLock, 0, uint64(me+1))
			if err != nil {
				return err
			}
			if old == 0 {
				break
			}
		}
		v, err := h.G(ctx, 0, offShared)
		if err != nil {
			return err
		}
		if err := h.P(ctx, 0, offShared, v+1); err != nil {
			return err
		}
		if old, err := h.AtomicSwap(ctx, 0, offLock, 0); err != nil || old != uint64(me+1) {
			return fmt.Errorf("unlock: held by %d, %v", old, err)
		}
	}
	if _, err := h.AtomicFetchOr(ctx, 0, offAtomic+16, 1<<uint(me)); err != nil {
		return err
	}
	if err := wt.Barrier(ctx); err != nil {
		return err
	}
	if me == 0 {
		c, _ := h.AtomicFetch(ctx, 0, offAtomic)
		lo, _ := h.Atomic32(ctx, buffer.AtomicLoad, 0, offAtomic+8, 0, 0)
		hi, _ := h.Atomic32(ctx, buffer.AtomicLoad, 0, offAtomic+12, 0, 0)
		shared, _ := h.G(ctx, 0, offShared)
		bits, _ := h.AtomicFetch(ctx, 0, offAtomic+16)
		if c != uint64(1000*n) || lo != uint32(2000*n) || hi != uint32(3000*n) || shared != uint64(50*n) || bits != 1<<uint(n)-1 {
			return fmt.Errorf("atomics: counter %d (want %d), 32-bit %d/%d, locked counter %d, bits %b", c, 1000*n, lo, hi, shared, bits)
		}
	}
	// Signals and point-to-point sync: put-with-signal to the next rank; the receiver waits on
	// its signal word and must then see the whole payload.
	next := (me + 1) % n
	if err := h.PutSignal(ctx, next, offSigDat+uint64(me)*4096, src, offSignal+uint64(me)*8, 7, SignalAdd); err != nil {
		return fmt.Errorf("put_signal: %w", err)
	}
	if _, err := h.WaitUntil(ctx, offSignal+uint64(prev)*8, CmpGE, 7); err != nil {
		return fmt.Errorf("wait_until: %w", err)
	}
	for i, b := range h.Local()[offSigDat+uint64(prev)*4096 : offSigDat+uint64(prev+1)*4096] {
		if b != pat(prev, i) {
			return fmt.Errorf("signal arrived before the data: byte %d", i)
		}
	}
	if ok, _ := h.Test(offSignal+uint64(prev)*8, CmpEQ, 7); !ok {
		return errors.New("test")
	}
	// Ordering: 100 puts of an increasing value, each fenced before a flag; the next rank reads
	// the value after seeing the flag and must never see it behind.
	for i := 1; i <= 100; i++ {
		if err := h.P(ctx, next, offOrder, uint64(i)); err != nil {
			return err
		}
		if err := h.Fence(ctx); err != nil {
			return err
		}
		if err := h.P(ctx, next, offOrder+8, uint64(i)); err != nil {
			return err
		}
	}
	for {
		flag := binary.LittleEndian.Uint64(h.Local()[offOrder+8:]) // plain read of our own word
		val := binary.LittleEndian.Uint64(h.Local()[offOrder:])
		_ = val
		if f, _ := h.AtomicFetch(ctx, me, offOrder+8); f != flag {
			continue
		}
		v, _ := h.AtomicFetch(ctx, me, offOrder)
		if v < flag {
			return fmt.Errorf("ordering: flag %d before value %d", flag, v)
		}
		if flag == 100 {
			break
		}
	}
	if err := wt.Barrier(ctx); err != nil {
		return err
	}
	// Collectives on the world and on split teams.
	return collectives(ctx, w, h, me, n)
}

// srcOf is rank r's 4 KiB source pattern.
func srcOf(r int) []byte {
	s := make([]byte, 4096)
	for i := range s {
		s[i] = pat(r, i)
	}
	return s
}

func collectives(ctx context.Context, w *World, h *Heap, me, n int) error {
	wt := h.World()
	local := h.Local()
	// Broadcast from the last rank.
	root := n - 1
	if me == root {
		copy(local[offBcast:offBcast+4096], srcOf(77))
	}
	if err := wt.Broadcast(ctx, root, offBcast+8192, offBcast, 4096); err != nil {
		return fmt.Errorf("broadcast: %w", err)
	}
	if !bytes.Equal(local[offBcast+8192:offBcast+8192+4096], srcOf(77)) {
		return errors.New("broadcast: bytes")
	}
	// FCollect of 256 bytes each.
	copy(local[offColl:offColl+256], srcOf(me)[:256])
	if err := wt.FCollect(ctx, offColl+4096, offColl, 256); err != nil {
		return fmt.Errorf("fcollect: %w", err)
	}
	for q := range n {
		if !bytes.Equal(local[offColl+4096+q*256:offColl+4096+(q+1)*256], srcOf(q)[:256]) {
			return fmt.Errorf("fcollect: block %d", q)
		}
	}
	// AllToAll: block j of rank q is byte value q*16+j.
	for j := range n {
		for i := range 64 {
			local[offColl+64<<10+uint64(j*64+i)] = byte(me*16 + j)
		}
	}
	if err := wt.AllToAll(ctx, offColl+128<<10, offColl+64<<10, 64); err != nil {
		return fmt.Errorf("alltoall: %w", err)
	}
	for q := range n {
		for i := range 64 {
			if local[offColl+128<<10+uint64(q*64+i)] != byte(q*16+me) {
				return fmt.Errorf("alltoall: from %d", q)
			}
		}
	}
	// Reduce: int64 sum and max, float64 min.
	for i := range 16 {
		binary.LittleEndian.PutUint64(local[offColl+256<<10+uint64(i*8):], uint64(int64(me*i-5)))
		binary.LittleEndian.PutUint64(local[offColl+260<<10+uint64(i*8):], math.Float64bits(float64(me)+0.5*float64(i)))
	}
	if err := wt.Reduce(ctx, Sum, Int64, offColl+264<<10, offColl+256<<10, 16); err != nil {
		return fmt.Errorf("reduce: %w", err)
	}
	if err := wt.Reduce(ctx, Max, Int64, offColl+268<<10, offColl+256<<10, 16); err != nil {
		return err
	}
	if err := wt.Reduce(ctx, Min, Float64, offColl+272<<10, offColl+260<<10, 16); err != nil {
		return err
	}
	for i := range 16 {
		sum, mx := int64(0), int64(math.MinInt64)
		for q := range n {
			sum += int64(q*i - 5)
			mx = max(mx, int64(q*i-5))
		}
		if got := int64(binary.LittleEndian.Uint64(local[offColl+264<<10+uint64(i*8):])); got != sum {
			return fmt.Errorf("reduce sum[%d] = %d, want %d", i, got, sum)
		}
		if got := int64(binary.LittleEndian.Uint64(local[offColl+268<<10+uint64(i*8):])); got != mx {
			return fmt.Errorf("reduce max[%d] = %d, want %d", i, got, mx)
		}
		if got := math.Float64frombits(binary.LittleEndian.Uint64(local[offColl+272<<10+uint64(i*8):])); got != 0.5*float64(i) {
			return fmt.Errorf("reduce min[%d] = %v", i, got)
		}
	}
	// Teams: even ranks (strided), and a 2-D grid of rows of 2.
	even, err := wt.SplitStrided(0, 2, (n+1)/2)
	if err != nil {
		return err
	}
	row, col, err := wt.Split2D(2)
	if err != nil {
		return err
	}
	if (even != nil) != (me%2 == 0) || row == nil || col == nil || row.TranslatePE(row.MyPE()) != me || col.TranslatePE(col.MyPE()) != me {
		return errors.New("teams: membership")
	}
	for ti, t := range []*Team{even, row, col} {
		if t == nil {
			continue
		}
		// Each member counts itself in at the team's first member before every barrier; after
		// barrier k all have counted k+1 times and none more than k+2 (it waits for us).
		counter, first, size := offColl+320<<10+uint64(ti)*8, t.TranslatePE(0), uint64(t.Size())
		for round := range uint64(20) {
			if err := h.AtomicAdd(ctx, first, counter, 1); err != nil {
				return err
			}
			if err := t.Barrier(ctx); err != nil {
				return fmt.Errorf("team barrier %d: %w", round, err)
			}
			got, err := h.AtomicFetch(ctx, first, counter)
			if err != nil {
				return err
			}
			if got < (round+1)*size || got >= (round+2)*size {
				return fmt.Errorf("team %d barrier %d: %d arrivals counted, want %d..%d", ti, round, got, (round+1)*size, (round+2)*size-1)
			}
		}
		binary.LittleEndian.PutUint64(local[offColl+300<<10:], uint64(me+1))
		if err := t.Reduce(ctx, Sum, Uint64, offColl+304<<10, offColl+300<<10, 1); err != nil {
			return err
		}
		want := uint64(0)
		for i := range t.Size() {
			want += uint64(t.TranslatePE(i) + 1)
		}
		if got := binary.LittleEndian.Uint64(local[offColl+304<<10:]); got != want {
			return fmt.Errorf("team reduce: %d, want %d", got, want)
		}
	}
	// Many teams over a heap's life (programs that split per phase): the 300th still works.
	var last *Team
	for i := range 300 {
		if last, err = wt.SplitStrided(0, 1, n); err != nil {
			return fmt.Errorf("team %d: %w", i, err)
		}
	}
	for range 3 {
		if err := last.Barrier(ctx); err != nil {
			return fmt.Errorf("the 300th team's barrier: %w", err)
		}
	}
	if err := wt.Barrier(ctx); err != nil {
		return err
	}
	// memfabric's host extras.
	if err := w.ControlBarrier(ctx); err != nil {
		return err
	}
	all, err := w.ControlAllGather(ctx, []byte{byte(me), byte(me * 2)})
	if err != nil || len(all) != 2*n || all[2*(n-1)+1] != byte(2*(n-1)) {
		return fmt.Errorf("control allgather: %v %v", all, err)
	}
	num, err := w.AllocNumber(ctx, 1024)
	if err != nil {
		return err
	}
	if err := w.ReleaseNumber(ctx, num); err != nil {
		return err
	}
	if err := w.SetExtraContext(make([]byte, 65537)); !errors.Is(err, status.ErrInvalidConfig) {
		return fmt.Errorf("extra context of 64 KiB + 1: %v", err)
	}
	if err := w.SetExtraContext([]byte("ctx")); err != nil || string(w.ExtraContext()) != "ctx" {
		return err
	}
	return wt.Barrier(ctx)
}

// outliveStore puts, gets back, adds to a counter on every other rank and meets them at heap
// barriers, checked, while the parent kills the store (it says so on stdin) and 50 rounds
// after; then a control barrier, which needs the store, must fail with a typed error within its
// deadline (or succeed, with HMC_SHMEM_STORE_SURVIVES=1: the parent killed one member of an
// etcd cluster). It exits when the parent says (the others may still be reaching it).
func outliveStore(ctx context.Context, w *World, h *Heap, me, n int) error {
	wt := h.World()
	src, back := make([]byte, 4096), make([]byte, 4096)
	round := func(k int) error {
		for pe := range n {
			if pe == me {
				continue
			}
			for i := range src {
				src[i] = pat(me, i) ^ byte(k)
			}
			off := uint64(offRMA + me*4096)
			if err := h.Put(ctx, pe, off, src); err != nil {
				return fmt.Errorf("round %d: put to %d: %w", k, pe, err)
			}
			if err := h.Get(ctx, pe, off, back); err != nil {
				return fmt.Errorf("round %d: get from %d: %w", k, pe, err)
			}
			if !bytes.Equal(src, back) {
				return fmt.Errorf("round %d: what came back from %d differs", k, pe)
			}
			old, err := h.AtomicFetchAdd(ctx, pe, uint64(offAtomic+me*8), 1)
			if err != nil {
				return fmt.Errorf("round %d: fetch-add on %d: %w", k, pe, err)
			}
			if old != uint64(k) {
				return fmt.Errorf("round %d: my counter on %d was %d", k, pe, old)
			}
		}
		if err := wt.Barrier(ctx); err != nil {
			return fmt.Errorf("round %d: heap barrier: %w", k, err)
		}
		return nil
	}
	if err := round(0); err != nil {
		return err
	}
	fmt.Println("RUNNING", me)
	said := childtest.ParentSays()
	// The same number of rounds on every rank (a heap barrier ends each): 300 while the parent
	// kills the store, then 50 more once it has said so.
	k := 1
	for ; k <= 300; k++ {
		if err := round(k); err != nil {
			return err
		}
	}
	<-said // killed
	for end := k + 50; k < end; k++ {
		if err := round(k); err != nil {
			return fmt.Errorf("after the store died: %w", err)
		}
	}
	// An etcd cluster that lost one member goes on; a killed store does not.
	outcome, err := storetest.AfterKill(ctx, os.Getenv("HMC_SHMEM_STORE_SURVIVES") == "1", w.ControlBarrier)
	if err != nil {
		return fmt.Errorf("a control barrier %w", err)
	}
	fmt.Println("OK", me, k, "rounds; control barrier:", outcome)
	select {
	case <-said: // exit
	case <-ctx.Done():
	}
	return nil
}

// outliveRank: the last rank (reached over TCP by everyone under HMC_SHMEM_OPS=mixed) waits to
// be killed; the others, once the parent says it was, find that a put, a get, an atomic and a
// heap barrier involving it fail with a typed error within their deadline, and go on putting,
// getting and adding among themselves, checked.
func outliveRank(ctx context.Context, h *Heap, me, n int) error {
	victim := n - 1
	buf := make([]byte, 64<<10)
	for pe := range n { // connected to everyone before the kill
		if err := h.Put(ctx, pe, uint64(offRMA+me*4096), buf[:4096]); err != nil {
			return err
		}
	}
	if err := h.World().Barrier(ctx); err != nil {
		return err
	}
	fmt.Println("RUNNING", me)
	said := childtest.ParentSays()
	if me == victim {
		<-ctx.Done() // until killed
		return nil
	}
	<-said // killed
	fails := []struct {
		what string
		op   func(ctx context.Context) error
	}{
		{"put", func(ctx context.Context) error { return h.Put(ctx, victim, offRMA, buf) }},
		{"get", func(ctx context.Context) error { return h.Get(ctx, victim, offRMA, buf) }},
		{"fetch-add", func(ctx context.Context) error { _, err := h.AtomicFetchAdd(ctx, victim, offAtomic, 1); return err }},
		{"heap barrier", func(ctx context.Context) error { return h.World().Barrier(ctx) }},
	}
	for _, f := range fails {
		fctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		start := time.Now()
		err := f.op(fctx)
		cancel()
		took := time.Since(start)
		// The link to it breaks (PEER_CLOSED), a new dial is refused (FAILED), or nobody
		// answers (TIMEOUT).
		if !errors.Is(err, status.ErrPeerClosed) && !errors.Is(err, status.ErrFailed) && !errors.Is(err, status.ErrTimeout) {
			return fmt.Errorf("%s with the killed rank: %v, want ErrPeerClosed, ErrFailed or ErrTimeout", f.what, err)
		}
		if took > 3*time.Second {
			return fmt.Errorf("%s with the killed rank failed after %v", f.what, took)
		}
		fmt.Println("DOWN", me, f.what, "after", took.Round(time.Millisecond), err)
	}
	src := make([]byte, 4096)
	for k := 1; k <= 50; k++ {
		for pe := range victim {
			if pe == me {
				continue
			}
			for i := range src {
				src[i] = pat(me, i) ^ byte(k)
			}
			off := uint64(offNBI + me*4096)
			if err := h.Put(ctx, pe, off, src); err != nil {
				return fmt.Errorf("round %d: put to %d: %w", k, pe, err)
			}
			if err := h.Get(ctx, pe, off, buf[:4096]); err != nil {
				return fmt.Errorf("round %d: get from %d: %w", k, pe, err)
			}
			if !bytes.Equal(src, buf[:4096]) {
				return fmt.Errorf("round %d: what came back from %d differs", k, pe)
			}
			if old, err := h.AtomicFetchAdd(ctx, pe, uint64(offAtomic+64+me*8), 1); err != nil || old != uint64(k-1) {
				return fmt.Errorf("round %d: my counter on %d was %d (%v)", k, pe, old, err)
			}
		}
	}
	fmt.Println("OK", me)
	select {
	case <-said: // exit
	case <-ctx.Done():
	}
	return nil
}

// outliveNetFaults: the last rank runs in another network namespace and every rank reaches the
// others over TCP. In lockstep phases the parent starts with stdin lines: rounds of put, get
// back, fetch-add and a heap barrier, checked (READY after 20); 20 more rounds while the parent
// delays, drops and reorders that rank's packets (IMPAIRED); then, its link down, operations
// with it fail typed within their 500 ms deadline while those among the others succeed (CUT);
// and once the link is back, 20 more checked rounds with everyone (OK).
func outliveNetFaults(ctx context.Context, h *Heap, me, n int) error {
	cut := n - 1
	said := childtest.ParentSays()
	src, back := make([]byte, 16<<10), make([]byte, 16<<10)
	counter := 0 // this rank's fetch-adds on each peer so far (the same count on every peer)
	// exchange puts, gets back and checks 16 KiB with pe, and adds to this rank's counter there.
	exchange := func(ctx context.Context, pe, k int) error {
		for i := range src {
			src[i] = pat(me, i) ^ byte(k)
		}
		off := uint64(offColl + me*(16<<10))
		if err := h.Put(ctx, pe, off, src); err != nil {
			return err
		}
		if err := h.Get(ctx, pe, off, back); err != nil {
			return err
		}
		if !bytes.Equal(src, back) {
			return fmt.Errorf("round %d: what came back from %d differs", k, pe)
		}
		return nil
	}
	rounds := func(from, to int, d time.Duration) error {
		for k := from; k < to; k++ {
			rctx, cancel := context.WithTimeout(ctx, d)
			for pe := range n {
				if pe == me {
					continue
				}
				if err := exchange(rctx, pe, k); err != nil {
					cancel()
					return fmt.Errorf("round %d, rank %d: %w", k, pe, err)
				}
				old, err := h.AtomicFetchAdd(rctx, pe, uint64(offAtomic+me*8), 1)
				if err != nil || old != uint64(counter) {
					cancel()
					return fmt.Errorf("round %d: my counter on %d was %d, want %d (%v)", k, pe, old, counter, err)
				}
			}
			counter++
			err := h.World().Barrier(rctx)
			cancel()
			if err != nil {
				return fmt.Errorf("round %d: heap barrier: %w", k, err)
			}
		}
		return nil
	}
	if err := rounds(0, 20, 10*time.Second); err != nil {
		return err
	}
	fmt.Println("READY", me)
	<-said // impaired
	if err := rounds(20, 40, 20*time.Second); err != nil {
		return fmt.Errorf("with delay, loss and reordering: %w", err)
	}
	fmt.Println("IMPAIRED", me)
	<-said // cut
	for pe := range n {
		if pe == me {
			continue
		}
		for try := range 2 {
			cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			start := time.Now()
			err := exchange(cctx, pe, 100+try)
			cancel()
			took := time.Since(start)
			if pe != cut && me != cut {
				if err != nil {
					return fmt.Errorf("across no cut link, to %d: %w", pe, err)
				}
				continue
			}
			if !errors.Is(err, status.ErrTimeout) && !errors.Is(err, status.ErrPeerClosed) {
				return fmt.Errorf("across the cut link, to %d: %v, want a timeout or ErrPeerClosed", pe, err)
			}
			if took > 1500*time.Millisecond {
				return fmt.Errorf("across the cut link, to %d: failed after %v", pe, took)
			}
		}
	}
	fmt.Println("CUT", me)
	<-said // healed
	if err := rounds(40, 60, 30*time.Second); err != nil {
		return fmt.Errorf("after the heal: %w", err)
	}
	fmt.Println("OK", me)
	<-said // exit
	return nil
}
