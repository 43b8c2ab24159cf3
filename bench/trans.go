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

// TransRun is the initiator: Threads goroutines each submit batches of Batch requests of Block
// bytes to the target's first buffer for Duration; the result's GB/s is all bytes over the
// wall time, its percentiles those of one batch.
func TransRun(ctx context.Context, c TransConfig) (Result, error) {
	if c.Batch < 1 || c.Threads < 1 || c.Block == 0 {
		return Result{}, fmt.Errorf("trans bench: batch %d, threads %d, block %d: %w", c.Batch, c.Threads, c.Block, status.ErrInvalidConfig)
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
	per := c.Block * uint64(c.Batch)
	if per*uint64(c.Threads) > min(remote.Size, c.Buffer) {
		return Result{}, fmt.Errorf("trans bench: %d threads × %d × %s need %s; the buffers have %s: %w",
			c.Threads, c.Batch, FormatSize(c.Block), FormatSize(per*uint64(c.Threads)), FormatSize(min(remote.Size, c.Buffer)), status.ErrInvalidConfig)
	}
	local, free, err := c.transBuffer(e, c.Buffer)
	if err != nil {
		return Result{}, err
	}
	defer free()
	lb := make([]byte, per*uint64(c.Threads))
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
	type out struct {
		lats  []time.Duration
		bytes uint64
		err   error
	}
	results := make([]out, c.Threads)
	var wg sync.WaitGroup
	start := time.Now()
	stop := start.Add(c.Duration)
	for th := range c.Threads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reqs := make([]trans.Request, c.Batch)
			for i := range reqs {
				// Neighbours are swapped pairwise below, so no request continues the one
				// before it: none merges, every request moves on its own, as a KV layout's
				// scattered blocks do.
				off := uint64(th)*per + uint64(i)*c.Block
				reqs[i] = trans.Request{Op: op, Local: local + off, Remote: remote.Addr + off, Size: c.Block}
			}
			if c.Batch > 1 {
				for i := 1; i < len(reqs); i += 2 {
					reqs[i], reqs[i-1] = reqs[i-1], reqs[i] // out of order: not contiguous neighbours
				}
			}
			r := &results[th]
			for time.Now().Before(stop) {
				t0 := time.Now()
				if err := e.Transfer(ctx, c.Target, reqs, nil); err != nil {
					r.err = err
					return
				}
				r.lats = append(r.lats, time.Since(t0))
				r.bytes += per
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	var all []time.Duration
	var bytes uint64
	for _, r := range results {
		if r.err != nil {
			return Result{}, r.err
		}
		all = append(all, r.lats...)
		bytes += r.bytes
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
	res := Result{Transport: kindsName(c.Kinds), Op: "write", Mem: mem, Size: c.Block, Iters: len(all),
		GBps: float64(bytes) / el.Seconds() / 1e9, P50us: p50, P99us: p99, Window: c.Batch, Lanes: c.Threads}
	if !c.Write {
		res.Op = "read"
	}
	if len(all) > 0 {
		res.MeanUs = float64(sum) / float64(len(all)) / 1e3
	}
	if c.Verify && c.Write {
		back := make([]byte, per*uint64(c.Threads))
		if err := e.Read(ctx, c.Target, memory.AddrOf(back), remote.Addr, uint64(len(back))); err != nil {
			return res, err
		}
		if string(back) != string(lb) {
			return res, fmt.Errorf("trans bench: the target's bytes differ from what was written: %w", status.ErrFailed)
		}
		res.Verified = true
	}
	return res, nil
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
