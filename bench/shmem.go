package bench

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/hmc-go/hmc/fabric/shmem"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// ShmemConfig configures a Share Memory benchmark; every rank is given the same one.
type ShmemConfig struct {
	Store    string
	World    int
	Kinds    []transport.ConnType // nil: shared memory for co-located ranks, then TCP
	Sizes    []uint64             // put/get sizes
	Iters    int                  // timed operations per measurement (0: 2000, fewer for large sizes)
	Progress func(string)
}

// ShmemRun is one rank of the benchmark (rank 0 measures and reports): put and get bandwidth to
// rank 1 by size, the latency of a blocking 8-byte put (P) and of an 8-byte fetch-add on rank
// 1, and barrier latency on teams of 2, 4, ... ranks up to the world.
func ShmemRun(ctx context.Context, cfg ShmemConfig, rank int, onResult func(Result)) error {
	if cfg.World < 2 {
		return fmt.Errorf("shmem bench: a world of %d: need 2 or more: %w", cfg.World, status.ErrInvalidConfig)
	}
	if cfg.Progress == nil {
		cfg.Progress = func(string) {}
	}
	sc := shmem.DefaultConfig()
	sc.StartStore = false
	if cfg.Kinds != nil {
		sc.Kinds = cfg.Kinds
	}
	sc.World, sc.Rank = cfg.World, rank
	w, err := shmem.Init(ctx, cfg.Store, sc)
	if err != nil {
		return err
	}
	defer w.Close()
	maxSize := uint64(8)
	for _, s := range cfg.Sizes {
		maxSize = max(maxSize, s)
	}
	heapSize := (maxSize + 4096 + (2<<20 - 1)) &^ (2<<20 - 1)
	h, err := w.Create(ctx, 0, heapSize)
	if err != nil {
		return err
	}
	wt := h.World()
	name := "shm+tcp"
	if cfg.Kinds != nil {
		name = kindsName(cfg.Kinds)
	}
	iters := func(size uint64) int {
		if cfg.Iters > 0 {
			return cfg.Iters
		}
		return int(min(max((1<<30)/max(size, 1), 20), 2000))
	}
	timed := func(n int, f func() error) ([]time.Duration, time.Duration, error) {
		lats := make([]time.Duration, 0, n)
		start := time.Now()
		last := start
		for range n {
			if err := f(); err != nil {
				return nil, 0, err
			}
			now := time.Now()
			lats = append(lats, now.Sub(last))
			last = now
		}
		return lats, last.Sub(start), nil
	}
	report := func(op string, size uint64, window int, lats []time.Duration, el time.Duration, bytes uint64) {
		p50, p99 := pct(slices.Clone(lats))
		var sum time.Duration
		for _, l := range lats {
			sum += l
		}
		r := Result{Transport: name, Op: op, Mem: "cpu", Size: size, Iters: len(lats), P50us: p50, P99us: p99,
			MeanUs: float64(sum) / float64(len(lats)) / 1e3, Window: window}
		if bytes > 0 {
			r.GBps = float64(bytes) / el.Seconds() / 1e9
		}
		onResult(r)
	}
	if rank == 0 {
		buf := make([]byte, maxSize)
		for _, op := range []string{"put", "get"} {
			for _, size := range cfg.Sizes {
				cfg.Progress(fmt.Sprintf("%s %s", op, FormatSize(size)))
				f := func() error { return h.Put(ctx, 1, 0, buf[:size]) }
				if op == "get" {
					f = func() error { return h.Get(ctx, 1, 0, buf[:size]) }
				}
				n := iters(size)
				lats, el, err := timed(n, f)
				if err != nil {
					return err
				}
				report(op, size, 1, lats, el, size*uint64(n))
			}
		}
		// P and fetch-add alternate, so both meet the same state of the peer's threads (on a
		// busy VM a target's wake-up latency moves between modes minutes apart).
		cfg.Progress("latency")
		var pl, al []time.Duration
		var pt, at time.Duration
		for range iters(8) {
			t0 := time.Now()
			if err := h.P(ctx, 1, heapSize-16, 1); err != nil {
				return err
			}
			t1 := time.Now()
			if _, err := h.AtomicFetchAdd(ctx, 1, heapSize-8, 1); err != nil {
				return err
			}
			t2 := time.Now()
			pl, al = append(pl, t1.Sub(t0)), append(al, t2.Sub(t1))
			pt, at = pt+t1.Sub(t0), at+t2.Sub(t1)
		}
		report("p", 8, 1, pl, pt, 0)
		report("amo", 8, 1, al, at, 0)
	}
	if err := wt.Barrier(ctx); err != nil {
		return err
	}
	for size := 2; ; size *= 2 {
		size = min(size, cfg.World)
		t, err := wt.SplitStrided(0, 1, size)
		if err != nil {
			return err
		}
		if t != nil {
			for range 100 { // warm up
				if err := t.Sync(ctx); err != nil {
					return err
				}
			}
			lats, el, err := timed(2000, func() error { return t.Sync(ctx) })
			if err != nil {
				return err
			}
			if rank == 0 {
				report("barrier", uint64(size), size, lats, el, 0)
			}
		}
		if err := wt.Barrier(ctx); err != nil {
			return err
		}
		if size == cfg.World {
			break
		}
	}
	return h.Destroy(ctx)
}
