package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/hmc-go/hmc/fabric/bm"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
)

// BMTypes are the copy types `hmc bm bench` measures (upstream BmBenchmark's names): h2rh
// (local DRAM to a remote rank's DRAM, H2G), rh2h (G2H), rh2rh (G2G between two other ranks'
// DRAM, or within the peer's when the world has two ranks), h2rd and rd2h (to and from a
// remote rank's HBM), batch (a KV block of 61 × 128 KiB + 61 × 16 KiB discrete pieces as one
// CopyBatch, upstream's DeepSeek-R1 case, beside the same bytes as one contiguous copy).
var BMTypes = []string{"h2rh", "rh2h", "rh2rh", "h2rd", "rd2h", "batch"}

// BMConfig configures a Big Memory benchmark. Every rank must be given the same Slice, HBM and
// ID, which fix the object's layout.
type BMConfig struct {
	Store string // the store every rank uses
	World int    // ranks in the object (≥ 2)
	ID    int    // object id
	Ops   bm.DataOp
	Slice uint64 // DRAM slice per rank (2 MiB multiple)
	HBM   uint64 // HBM slice per rank (0: none; h2rd and rd2h need it)
	Types []string
	Sizes []uint64 // block sizes
	Batch int      // blocks per copy (1: Copy; more: one CopyBatch of discrete blocks)
	Iters int      // timed copies per size (0: about 256 MiB per size, 10..5000)
	Warm  int      // untimed copies per size
	Peer  int      // the remote rank measured against (default 1)
	// Progress, if set, is told of phases.
	Progress func(string)
}

const bmDoneKey = "SMEM_BM_BENCH_DONE"

func (c *BMConfig) options() bm.Options {
	return bm.Options{LocalDRAM: c.Slice, LocalHBM: c.HBM, DataOps: c.Ops}
}

// BMServe is a passive rank of a benchmark: it creates and joins the object, then serves its
// slices until the measuring rank says it is done (or ctx ends).
func BMServe(ctx context.Context, cfg BMConfig, rank int) error {
	f, b, err := bmJoin(ctx, cfg, rank)
	if err != nil {
		return err
	}
	defer f.Close()
	fill(b.Local(), rank)
	if err := b.Barrier(ctx); err != nil {
		return err
	}
	_, err = f.Store().Get(ctx, bmDoneKey, -1)
	if err != nil && status.FromContext(ctx) == nil {
		return err
	}
	return b.Destroy(ctx)
}

func bmJoin(ctx context.Context, cfg BMConfig, rank int) (*bm.Fabric, *bm.BigMemory, error) {
	bc := bm.DefaultConfig()
	bc.World, bc.StartStore, bc.AutoRanking, bc.Rank = cfg.World, false, false, rank
	f, err := bm.Init(ctx, cfg.Store, bc)
	if err != nil {
		return nil, nil, err
	}
	b, err := f.Create(ctx, cfg.ID, cfg.options())
	if err == nil {
		if err = b.Join(ctx); err == nil {
			err = b.WaitMembers(ctx, cfg.World)
		}
	}
	if err != nil {
		_ = f.Close()
		return nil, nil, err
	}
	return f, b, nil
}

func fill(p []byte, rank int) {
	for i := range p {
		p[i] = byte(i*7 + rank)
	}
}

// BMRun is the measuring rank (rank 0): it joins, runs every type and size against the peer
// rank, reports each result, and releases the passive ranks.
func BMRun(ctx context.Context, cfg BMConfig, onResult func(Result)) (err error) {
	if cfg.World < 2 {
		return fmt.Errorf("bm bench: a world of %d ranks: need 2 or more: %w", cfg.World, status.ErrInvalidConfig)
	}
	if cfg.Peer == 0 {
		cfg.Peer = 1
	}
	if cfg.Batch < 1 {
		cfg.Batch = 1
	}
	if cfg.Progress == nil {
		cfg.Progress = func(string) {}
	}
	f, b, err := bmJoin(ctx, cfg, 0)
	if err != nil {
		return err
	}
	defer func() {
		_ = f.Store().Set(context.Background(), bmDoneKey, []byte("done")) // releases the passive ranks
		err = errors.Join(err, f.Close())
	}()
	fill(b.Local(), 0)
	if err := b.Barrier(ctx); err != nil {
		return err
	}
	third := cfg.Peer
	if cfg.World >= 3 {
		third = (cfg.Peer + 1) % cfg.World
		if third == 0 {
			third = 2
		}
	}
	for _, typ := range cfg.Types {
		if typ == "batch" {
			for _, contiguous := range []bool{false, true} {
				r, err := bmMeasure(ctx, b, cfg, typ, 0, third, contiguous)
				if err != nil {
					return err
				}
				onResult(r)
			}
			continue
		}
		for _, size := range cfg.Sizes {
			cfg.Progress(fmt.Sprintf("%s %s", typ, FormatSize(size)))
			r, err := bmMeasure(ctx, b, cfg, typ, size, third, false)
			if err != nil {
				return err
			}
			onResult(r)
		}
	}
	return nil
}

// bmMeasure times one type at one block size.
func bmMeasure(ctx context.Context, b *bm.BigMemory, cfg BMConfig, typ string, size uint64, third int, contiguous bool) (Result, error) {
	host := func(r int) uint64 { p, _ := b.PtrByMemType(bm.Host, r); return p }
	dev := func(r int) uint64 { p, _ := b.PtrByMemType(bm.Device, r); return p }
	var sizes []uint64
	if typ == "batch" {
		for range 61 {
			sizes = append(sizes, 128<<10)
		}
		for range 61 {
			sizes = append(sizes, 16<<10)
		}
	} else {
		for range cfg.Batch {
			sizes = append(sizes, size)
		}
	}
	var total uint64
	for _, s := range sizes {
		total += s
	}
	// Discrete blocks: each at twice its size from the last (no two contiguous), on both sides.
	span := 2 * total
	if contiguous {
		span = total
	}
	local := make([]byte, span)
	// Big Memory is handed local's address, not the slice: without this the collector may
	// free local in the middle of the copies (the runtime then finds the copier's views of it
	// pointing into a free span and aborts the process).
	defer runtime.KeepAlive(local)
	fill(local, 0)
	var src, dst uint64
	var t bm.CopyType
	var limit uint64
	switch typ {
	case "h2rh", "batch":
		src, dst, t, limit = memory.AddrOf(local), host(cfg.Peer), bm.H2G, cfg.Slice
	case "rh2h":
		src, dst, t, limit = host(cfg.Peer), memory.AddrOf(local), bm.G2H, cfg.Slice
	case "rh2rh":
		src, dst, t, limit = host(cfg.Peer), host(third), bm.G2G, cfg.Slice
		if third == cfg.Peer {
			dst += cfg.Slice / 2
			limit = cfg.Slice / 2
		}
	case "h2rd":
		src, dst, t, limit = memory.AddrOf(local), dev(cfg.Peer), bm.H2G, cfg.HBM
	case "rd2h":
		src, dst, t, limit = dev(cfg.Peer), memory.AddrOf(local), bm.G2H, cfg.HBM
	default:
		return Result{}, fmt.Errorf("bm bench: type %q (want one of %v): %w", typ, BMTypes, status.ErrInvalidConfig)
	}
	if span > limit {
		return Result{}, fmt.Errorf("bm bench: %s of %d × %s needs %s of the slice, which has %s (--slice, --hbm): %w",
			typ, len(sizes), FormatSize(size), FormatSize(span), FormatSize(limit), status.ErrInvalidConfig)
	}
	var ps []bm.CopyParams
	off := uint64(0)
	for _, s := range sizes {
		ps = append(ps, bm.CopyParams{Src: src + off, Dst: dst + off, Size: s})
		if contiguous {
			off += s
		} else {
			off += 2 * s
		}
	}
	if contiguous {
		ps = []bm.CopyParams{{Src: src, Dst: dst, Size: total}}
	}
	iters := cfg.Iters
	if iters == 0 {
		iters = int(min(max((256<<20)/total, 10), 5000))
	}
	run := func() error {
		if len(ps) == 1 {
			return b.Copy(ctx, ps[0].Src, ps[0].Dst, ps[0].Size, t, 0)
		}
		return b.CopyBatch(ctx, ps, t, 0)
	}
	for range cfg.Warm {
		if err := run(); err != nil {
			return Result{}, fmt.Errorf("bm bench: %s: %w", typ, err)
		}
	}
	lats := make([]time.Duration, 0, iters)
	start := time.Now()
	last := start
	for range iters {
		if err := run(); err != nil {
			return Result{}, fmt.Errorf("bm bench: %s: %w", typ, err)
		}
		now := time.Now()
		lats = append(lats, now.Sub(last))
		last = now
	}
	el := last.Sub(start)
	var sum time.Duration
	for _, l := range lats {
		sum += l
	}
	p50, p99 := pct(slices.Clone(lats))
	op := typ
	if typ == "batch" {
		op = "batch"
		if contiguous {
			op = "contig"
		}
		size = total
	}
	return Result{Transport: cfg.Ops.String(), Op: op, Mem: "cpu", Size: size, Iters: iters,
		GBps: float64(total) * float64(iters) / el.Seconds() / 1e9, P50us: p50, P99us: p99,
		MeanUs: float64(sum) / float64(iters) / 1e3, Window: len(ps)}, nil
}
