package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hmc-go/hmc/fabric/trans"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// TransConfig configures a transfer-engine benchmark (Mooncake's transfer_engine_bench).
type TransConfig struct {
	Metadata string // metadata URL, or trans.P2P
	LocalID  string // this engine's unique id ("127.0.0.1:0": any port)
	Target   string // the target's unique id (initiator)
	Write    bool   // write (else read)
	Block    uint64 // bytes per request
	Batch    int    // requests per batch
	Threads  int    // batches in flight, one per goroutine
	Duration time.Duration
	Buffer   uint64               // the target's (and initiator's) buffer
	Kinds    []transport.ConnType // transports, in order
	Verify   bool                 // check the bytes once at the end
	Ready    func(id string)      // told the target's id once it serves
	// Pattern is the batch's layout: PatternScattered (the default), PatternContiguous or
	// PatternKV (which ignores Batch).
	Pattern string
	// Peer, when set, also measures the same bytes per batch as one contiguous transfer, right
	// after, and reports the ratio.
	Peer bool
	// Mem is the memory of both sides' buffers: CPU (Malloc'ed, shareable host memory) or a
	// device type (allocated on device 0 and registered, as a serving stack registers its GPU
	// KV cache).
	Mem memory.Type
}

// transBuffer allocates the benchmark's buffer of size bytes in c.Mem and registers it.
func (c TransConfig) transBuffer(e *trans.Engine, size uint64) (uint64, func(), error) {
	if !c.Mem.IsDevice() {
		a, err := e.Malloc(size)
		return a, func() {}, err
	}
	m, err := memory.New(0, c.Mem)
	if err != nil {
		return 0, nil, err
	}
	b, err := m.Alloc(size)
	if err != nil {
		_ = m.Close()
		return 0, nil, err
	}
	if err := e.Register(uint64(b.Ptr()), size); err != nil {
		_ = m.Close()
		return 0, nil, err
	}
	return uint64(b.Ptr()), func() {
		_ = e.Deregister(context.Background(), uint64(b.Ptr()))
		_ = m.Close()
	}, nil
}

func (c TransConfig) engineConfig() trans.Config {
	cfg := trans.DefaultConfig()
	cfg.UniqueID = c.LocalID
	if c.Kinds != nil {
		cfg.Kinds = c.Kinds
	}
	return cfg
}

// TransServe is the target: it allocates and registers the buffer and serves until ctx ends.
func TransServe(ctx context.Context, c TransConfig) error {
	e, err := trans.Create(ctx, c.Metadata, c.engineConfig())
	if err != nil {
		return err
	}
	defer e.Close()
	_, free, err := c.transBuffer(e, c.Buffer)
	if err != nil {
		return err
	}
	defer free()
	if c.Ready != nil {
		c.Ready(e.UniqueID())
	}
	<-ctx.Done()
	return nil
}

// Transfer patterns of TransRun (--pattern).
const (
	PatternScattered  = "scattered"  // Batch blocks, no two adjacent (neighbours swapped pairwise)
	PatternContiguous = "contiguous" // Batch adjacent blocks: the engine merges them into one transfer
	PatternKV         = "kv"         // a KV cache's layout: KVLayers layers × a K and a V block, two pools
)

// KVLayers is the layer count of PatternKV (a 61-layer model, as DeepSeek-V3's).
const KVLayers = 61

// transLayout is the requests of one thread's batch (th) for a pattern, and the memory a thread
// spans and moves per batch.
func (c TransConfig) transLayout(th int, local, remote uint64, op trans.Opcode) (reqs []trans.Request, span, moved uint64) {
	b := c.Block
	switch c.Pattern {
	case PatternKV:
		// Each pool holds a block per layer with a block's hole after it (layers are separate
		// tensors); a batch moves layer l's K block then its V block, for every layer.
		pool := 2 * b * KVLayers
		span = 2 * pool
		base := uint64(th) * span
		for l := range uint64(KVLayers) {
			for _, pb := range []uint64{0, pool} {
				off := base + pb + 2*l*b
				reqs = append(reqs, trans.Request{Op: op, Local: local + off, Remote: remote + off, Size: b})
			}
		}
		return reqs, span, 2 * KVLayers * b
	}
	span = b * uint64(c.Batch)
	base := uint64(th) * span
	reqs = make([]trans.Request, c.Batch)
	for i := range reqs {
		off := base + uint64(i)*b
		reqs[i] = trans.Request{Op: op, Local: local + off, Remote: remote + off, Size: b}
	}
	if c.Pattern != PatternContiguous && c.Batch > 1 {
		for i := 1; i < len(reqs); i += 2 {
			reqs[i], reqs[i-1] = reqs[i-1], reqs[i] // out of order: no request continues the one before it
		}
	}
	return reqs, span, span
}

// TransRun is the initiator: Threads goroutines each submit batches (Pattern: Batch blocks of
// Block bytes, or a KV layout) to the target's first buffer for Duration; the result's GB/s is
// all bytes over the wall time, its percentiles those of one batch, BlockUs the median batch
// over its blocks. With Peer set it then moves the same bytes per batch as one contiguous
// transfer for as long (PeerGBps, Ratio): the scattered layout's cost, measured in the same run.
func TransRun(ctx context.Context, c TransConfig) (Result, error) {
	if c.Batch < 1 || c.Threads < 1 || c.Block == 0 {
		return Result{}, fmt.Errorf("trans bench: batch %d, threads %d, block %d: %w", c.Batch, c.Threads, c.Block, status.ErrInvalidConfig)
	}
	switch c.Pattern {
	case "":
		c.Pattern = PatternScattered
	case PatternScattered, PatternContiguous, PatternKV:
	default:
		return Result{}, fmt.Errorf("trans bench: pattern %q (want scattered, contiguous or kv): %w", c.Pattern, status.ErrInvalidConfig)
	}
	e, err := trans.Create(ctx, c.Metadata, c.engineConfig())
	if err != nil {
		return Result{}, err
	}
	defer e.Close()
	bufs, err := e.PeerBuffers(ctx, c.Target)
	if err != nil {
		return Result{}, err
	}
	if len(bufs) == 0 {
		return Result{}, fmt.Errorf("trans bench: target %s registered nothing: %w", c.Target, status.ErrNotFound)
	}
	remote := bufs[0]
	_, span, moved := c.transLayout(0, 0, 0, trans.Write)
	if span*uint64(c.Threads) > min(remote.Size, c.Buffer) {
		return Result{}, fmt.Errorf("trans bench: %d threads × %s (%s pattern of %s blocks) need %s; the buffers have %s: %w",
			c.Threads, FormatSize(span), c.Pattern, FormatSize(c.Block), FormatSize(span*uint64(c.Threads)), FormatSize(min(remote.Size, c.Buffer)), status.ErrInvalidConfig)
	}
	local, free, err := c.transBuffer(e, c.Buffer)
	if err != nil {
		return Result{}, err
	}
	defer free()
	lb := make([]byte, span*uint64(c.Threads))
	for i := range lb {
		lb[i] = byte(i*7 + i>>12)
	}
	if err := memory.Copy(memory.Ptr(local), memory.Ptr(memory.AddrOf(lb)), uint64(len(lb))); err != nil {
		return Result{}, err
	}
	op := trans.Read
	if c.Write {
		op = trans.Write
	}
	batches := make([][]trans.Request, c.Threads)
	for th := range batches {
		batches[th], _, _ = c.transLayout(th, local, remote.Addr, op)
	}
	all, bytes, el, err := transLoop(ctx, e, c, batches, moved)
	if err != nil {
		return Result{}, err
	}
	var sum time.Duration
	for _, l := range all {
		sum += l
	}
	p50, p99 := pct(slices.Clone(all))
	mem := "cpu"
	if c.Mem.IsDevice() {
		mem = strings.ToLower(c.Mem.String())
	}
	blocks := len(batches[0])
	res := Result{Transport: kindsName(c.Kinds), Op: "write", Mode: c.Pattern, Mem: mem, Size: c.Block, Iters: len(all),
		GBps: float64(bytes) / el.Seconds() / 1e9, P50us: p50, P99us: p99, Window: blocks, Threads: c.Threads,
		BlockUs: p50 / float64(blocks)}
	if !c.Write {
		res.Op = "read"
	}
	if len(all) > 0 {
		res.MeanUs = float64(sum) / float64(len(all)) / 1e3
	}
	if c.Peer {
		// The same bytes per batch as one contiguous transfer, from each thread's own span.
		peer := make([][]trans.Request, c.Threads)
		for th := range peer {
			off := uint64(th) * span
			peer[th] = []trans.Request{{Op: op, Local: local + off, Remote: remote.Addr + off, Size: moved}}
		}
		_, pb, pel, err := transLoop(ctx, e, c, peer, moved)
		if err != nil {
			return res, err
		}
		res.PeerGBps = float64(pb) / pel.Seconds() / 1e9
		if res.PeerGBps > 0 {
			res.Ratio = res.GBps / res.PeerGBps
		}
	}
	if c.Verify && c.Write {
		back := make([]byte, span*uint64(c.Threads))
		if err := e.Read(ctx, c.Target, memory.AddrOf(back), remote.Addr, uint64(len(back))); err != nil {
			return res, err
		}
		for th := range batches {
			for _, q := range batches[th] {
				lo := q.Local - local
				if string(back[lo:lo+q.Size]) != string(lb[lo:lo+q.Size]) {
					return res, fmt.Errorf("trans bench: the target's bytes at %d differ from what was written: %w", lo, status.ErrFailed)
				}
			}
		}
		res.Verified = true
	}
	return res, nil
}

// transLoop runs each thread's batch (batches[th], moved bytes each) over and over for
// c.Duration and returns every batch's latency, the bytes moved and the wall time.
func transLoop(ctx context.Context, e *trans.Engine, c TransConfig, batches [][]trans.Request, moved uint64) ([]time.Duration, uint64, time.Duration, error) {
	type out struct {
		lats  []time.Duration
		bytes uint64
		err   error
	}
	results := make([]out, len(batches))
	var wg sync.WaitGroup
	start := time.Now()
	stop := start.Add(c.Duration)
	for th, reqs := range batches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &results[th]
			for time.Now().Before(stop) {
				t0 := time.Now()
				if err := e.Transfer(ctx, c.Target, reqs, nil); err != nil {
					r.err = err
					return
				}
				r.lats = append(r.lats, time.Since(t0))
				r.bytes += moved
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	var all []time.Duration
	var bytes uint64
	for _, r := range results {
		if r.err != nil {
			return nil, 0, 0, r.err
		}
		all = append(all, r.lats...)
		bytes += r.bytes
	}
	return all, bytes, el, nil
}

func kindsName(ks []transport.ConnType) string {
	if len(ks) == 0 {
		return "auto"
	}
	s := ks[0].String()
	for _, k := range ks[1:] {
		s += "+" + k.String()
	}
	return s
}
