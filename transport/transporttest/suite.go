package transporttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// Options describe the transport under test.
type Options struct {
	// New returns a fresh transport.
	New func(t testing.TB) transport.Transport
	// ChunkSize is the transport's chunk size, for the chunk±1 sizes (0: 1 MiB).
	ChunkSize uint64
	// Lanes is the lane count to dial with (0: the transport's default).
	Lanes int
	// Addr returns a fresh address for a server to listen on (nil: "127.0.0.1:0").
	Addr func(t testing.TB) string
	// Alloc returns a host ConnBuffer of size bytes, closed by t.Cleanup (nil: buffer.New's
	// memfd-backed CPU memory). A transport with its own allocator (ucx.NewHostBuffer) runs the
	// suite on both.
	Alloc func(t testing.TB, size uint64) *buffer.ConnBuffer
}

func (o Options) buf(t testing.TB, size uint64) *buffer.ConnBuffer {
	if o.Alloc == nil {
		return newBuf(t, size)
	}
	return o.Alloc(t, size)
}

// pair is NewPairAt with the options' transport, address, buffers and lanes.
func (o Options) pair(t testing.TB, targetSize, localSize uint64) *Pair {
	t.Helper()
	return NewPairOf(t, o.New(t), o.addr(t), o.buf(t, targetSize), o.buf(t, localSize), o.Lanes)
}

func (o Options) addr(t testing.TB) string {
	if o.Addr == nil {
		return "127.0.0.1:0"
	}
	return o.Addr(t)
}

// Run runs the whole suite against o.New.
func Run(t *testing.T, o Options) {
	if o.ChunkSize == 0 {
		o.ChunkSize = 1 << 20
	}
	t.Run("PutGetSizes", func(t *testing.T) { testSizes(t, o) })
	t.Run("OutOfRange", func(t *testing.T) { testOutOfRange(t, o) })
	t.Run("Concurrent", func(t *testing.T) { testConcurrent(t, o) })
	t.Run("AsyncWaitAnyOrder", func(t *testing.T) { testAsyncOrder(t, o) })
	t.Run("Cancel", func(t *testing.T) { testCancel(t, o) })
	t.Run("CloseWithOpsInFlight", func(t *testing.T) { testCloseInFlight(t, o) })
	t.Run("TargetGone", func(t *testing.T) { testTargetGone(t, o) })
	t.Run("CloseUnderLoad", func(t *testing.T) { testCloseUnderLoad(t, o) })
	t.Run("AcceptedBeforeDialReturns", func(t *testing.T) { testAcceptedFirst(t, o) })
	t.Run("DialRefused", func(t *testing.T) { testDialRefused(t, o) })
}

// testDialRefused: dialling an address where nothing listens fails at once with ErrFailed
// itself (the same sentinel on every transport), not a closed-peer error.
func testDialRefused(t *testing.T, o Options) {
	tr := o.New(t)
	srv, err := tr.Listen(transport.ServerConfig{BindAddr: o.addr(t), Region: o.buf(t, 4096)})
	if err != nil {
		t.Fatal(err)
	}
	addr := srv.Addr()
	_ = srv.Close() // nothing listens there now
	start := time.Now()
	ep, err := tr.Dial(ctx10(t), transport.DialConfig{Addr: addr, Local: o.buf(t, 4096), Rank: 1, Lanes: o.Lanes})
	if err == nil {
		ep.Close()
		t.Fatal("dialled a closed server")
	}
	if !errors.Is(err, status.ErrFailed) || errors.Is(err, status.ErrPeerClosed) || errors.Is(err, status.ErrClosed) {
		t.Fatalf("refused dial: %v (want ErrFailed itself)", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("refused dial took %v", d)
	}
}

// Pair is a target region served by a transport and an initiator endpoint to it.
type Pair struct {
	Target, Local *buffer.ConnBuffer
	Server        transport.Server
	EP            transport.Endpoint
}

// NewPair serves a region of targetSize bytes on 127.0.0.1 and dials it with a local region of
// localSize bytes. Everything is closed by t.Cleanup.
func NewPair(t testing.TB, tr transport.Transport, targetSize, localSize uint64, lanes int) *Pair {
	return NewPairAt(t, tr, "127.0.0.1:0", targetSize, localSize, lanes)
}

// NewPairAt is NewPair with the server listening on addr.
func NewPairAt(t testing.TB, tr transport.Transport, addr string, targetSize, localSize uint64, lanes int) *Pair {
	t.Helper()
	return NewPairOf(t, tr, addr, newBuf(t, targetSize), newBuf(t, localSize), lanes)
}

// NewPairOf serves target on addr and dials it with local; the buffers are the caller's.
func NewPairOf(t testing.TB, tr transport.Transport, addr string, target, local *buffer.ConnBuffer, lanes int) *Pair {
	t.Helper()
	p := &Pair{Target: target, Local: local}
	targetSize := target.Size()
	srv, err := tr.Listen(transport.ServerConfig{BindAddr: addr, Region: p.Target, Rank: 0})
	if err != nil {
		t.Fatal(err)
	}
	p.Server = srv
	t.Cleanup(func() { srv.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ep, err := tr.Dial(ctx, transport.DialConfig{Addr: srv.Addr(), Local: p.Local, Rank: 1, Lanes: lanes})
	if err != nil {
		t.Fatal(err)
	}
	p.EP = ep
	t.Cleanup(func() { ep.Close() })
	if ep.RemoteSize() != targetSize {
		t.Fatalf("RemoteSize %d, want %d", ep.RemoteSize(), targetSize)
	}
	return p
}

func newBuf(t testing.TB, size uint64) *buffer.ConnBuffer {
	t.Helper()
	b, err := buffer.New(0, size, memory.CPU)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func ctx10(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Fill writes a pattern derived from seed into b.
func Fill(b []byte, seed uint32) {
	x := seed*2654435761 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
}

func testSizes(t *testing.T, o Options) {
	c := o.ChunkSize
	lanes := uint64(max(o.Lanes, 4))
	sizes := []uint64{0, 1, 7, 4097, c - 1, c, c + 1, lanes*c + 3}
	maxSize := sizes[len(sizes)-1]
	p := o.pair(t, 2*maxSize+64, 2*maxSize+64)
	ctx := ctx10(t)
	for i, n := range sizes {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			localOff, remoteOff := uint64(i), maxSize+uint64(3*i)
			src := p.Local.Bytes()[localOff : localOff+n]
			Fill(src, uint32(i+1))
			guardLo, guardHi := byteAt(p.Target, remoteOff, -1), byteAt(p.Target, remoteOff+n, 0)
			if err := transport.Put(ctx, p.EP, localOff, remoteOff, n); err != nil {
				t.Fatal(err)
			}
			// Visible on return: no wait, no notification.
			if got := p.Target.Bytes()[remoteOff : remoteOff+n]; !bytes.Equal(got, src) {
				t.Fatalf("put of %d bytes: target differs", n)
			}
			if byteAt(p.Target, remoteOff, -1) != guardLo || byteAt(p.Target, remoteOff+n, 0) != guardHi {
				t.Fatal("put wrote outside its range")
			}
			// Get it back into another local place.
			back := maxSize + 32
			clear(p.Local.Bytes()[back : back+n])
			if err := transport.Get(ctx, p.EP, back, remoteOff, n); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(p.Local.Bytes()[back:back+n], src) {
				t.Fatalf("get of %d bytes differs", n)
			}
		})
	}
}

func byteAt(b *buffer.ConnBuffer, off uint64, delta int) byte {
	i := int(off) + delta
	if i < 0 || i >= len(b.Bytes()) {
		return 0
	}
	return b.Bytes()[i]
}

func testOutOfRange(t *testing.T, o Options) {
	const size = 1 << 16
	p := o.pair(t, size, 2*size)
	ctx := ctx10(t)
	Fill(p.Target.Bytes(), 99)
	before := bytes.Clone(p.Target.Bytes())
	Fill(p.Local.Bytes(), 5)
	cases := []struct{ lo, ro, n uint64 }{
		{0, size - 10, 11},          // remote past end
		{0, size + 1, 0},            // remote offset past end
		{2*size - 1, 0, 2},          // local past end
		{0, ^uint64(0) - 3, 8},      // remote wraps
		{^uint64(0) - 3, 0, 8},      // local wraps
		{0, 0, size + 1},            // longer than the remote region
		{0, 1 << 62, 1<<63 + 1<<62}, // sum overflows
	}
	for _, c := range cases {
		for _, put := range []bool{true, false} {
			var err error
			if put {
				err = transport.Put(ctx, p.EP, c.lo, c.ro, c.n)
			} else {
				err = transport.Get(ctx, p.EP, c.lo, c.ro, c.n)
			}
			if !errors.Is(err, status.ErrOutOfRange) || status.CodeOf(err) != status.InvalidConfig {
				t.Errorf("put=%v %+v: err = %v", put, c, err)
			}
		}
	}
	if !bytes.Equal(p.Target.Bytes(), before) {
		t.Fatal("a refused transfer changed the target")
	}
	// The endpoint still works afterwards.
	if err := transport.Put(ctx, p.EP, 0, 0, size); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(p.Target.Bytes(), p.Local.Bytes()[:size]) {
		t.Fatal("put after refusals differs")
	}
}

func testConcurrent(t *testing.T, o Options) {
	const workers, slot = 8, 300_000
	p := o.pair(t, workers*slot, workers*slot)
	ctx := ctx10(t)
	Fill(p.Local.Bytes(), 3)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			off := uint64(w * slot)
			for i := range 10 {
				n := uint64(1 + (i*37171)%slot)
				if err := transport.Put(ctx, p.EP, off, off, n); err != nil {
					t.Error(err)
					return
				}
				if !bytes.Equal(p.Target.Bytes()[off:off+n], p.Local.Bytes()[off:off+n]) {
					t.Errorf("worker %d: target differs", w)
					return
				}
			}
		})
	}
	wg.Wait()
}

func testAsyncOrder(t *testing.T, o Options) {
	const n, size = 32, 100_003
	p := o.pair(t, n*size, n*size)
	ctx := ctx10(t)
	Fill(p.Local.Bytes(), 11)
	ops := make([]*transport.Op, n)
	for i := range n {
		op, err := p.EP.PutAsync(ctx, uint64(i*size), uint64(i*size), size)
		if err != nil {
			t.Fatal(err)
		}
		ops[i] = op
	}
	for i := n - 1; i >= 0; i-- { // reverse order: upstream hangs here
		if err := ops[i].Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(p.Target.Bytes(), p.Local.Bytes()) {
		t.Fatal("async puts: target differs")
	}
	// Gets, waited in a shuffled order.
	clear(p.Local.Bytes())
	for i := range n {
		op, err := p.EP.GetAsync(ctx, uint64(i*size), uint64(i*size), size)
		if err != nil {
			t.Fatal(err)
		}
		ops[i] = op
	}
	for i := range n {
		if err := ops[(i*7)%n].Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(p.Target.Bytes(), p.Local.Bytes()) {
		t.Fatal("async gets: local differs")
	}
}

func testCancel(t *testing.T, o Options) {
	const size = 32 << 20
	p := o.pair(t, size, size)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := transport.Put(ctx, p.EP, 0, 0, size)
	if err != nil && !errors.Is(err, status.ErrCanceled) {
		t.Fatalf("cancelled put: %v", err)
	}
	short, cancel2 := context.WithTimeout(context.Background(), time.Microsecond)
	defer cancel2()
	err = transport.Put(short, p.EP, 0, 0, size)
	if err != nil && !errors.Is(err, status.ErrTimeout) {
		t.Fatalf("timed-out put: %v", err)
	}
	// The endpoint is still usable, and the next put is whole.
	Fill(p.Local.Bytes(), 77)
	if err := transport.Put(ctx10(t), p.EP, 0, 0, size); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(p.Target.Bytes(), p.Local.Bytes()) {
		t.Fatal("put after cancel differs")
	}
}

func testCloseInFlight(t *testing.T, o Options) {
	const size = 64 << 20
	p := o.pair(t, size, size)
	ctx := ctx10(t)
	var ops []*transport.Op
	for range 4 {
		op, err := p.EP.PutAsync(ctx, 0, 0, size)
		if err != nil {
			t.Fatal(err)
		}
		ops = append(ops, op)
	}
	if err := p.EP.Close(); err != nil {
		t.Fatal(err)
	}
	for _, op := range ops {
		// Each op either finished before Close or fails; none hangs.
		if err := op.Wait(ctx); err != nil && status.CodeOf(err) != status.Error {
			t.Fatalf("op after Close: %v", err)
		}
	}
	if _, err := p.EP.PutAsync(ctx, 0, 0, 1); !errors.Is(err, status.ErrFailed) {
		t.Fatalf("put on a closed endpoint: %v", err)
	}
}

func testTargetGone(t *testing.T, o Options) {
	const size = 64 << 20
	p := o.pair(t, size, size)
	ctx := ctx10(t)
	op, err := p.EP.PutAsync(ctx, 0, 0, size)
	if err != nil {
		t.Fatal(err)
	}
	p.Server.Close()
	start := time.Now()
	_ = op.Wait(ctx) // may have finished first
	// The initiator learns of the closure asynchronously; within the deadline every put fails.
	for err = transport.Put(ctx, p.EP, 0, 0, size); err == nil && time.Since(start) < 10*time.Second; err = transport.Put(ctx, p.EP, 0, 0, size) {
		time.Sleep(time.Millisecond)
	}
	if err == nil {
		t.Fatal("put to a closed target kept succeeding")
	}
	if status.CodeOf(err) != status.Error {
		t.Fatalf("put to a closed target: %v", err)
	}
	if time.Since(start) > 10*time.Second {
		t.Fatal("took too long to notice")
	}
}

// SizeName names a benchmark size ("8B", "64KiB", "4MiB").
func SizeName(n uint64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// testAcceptedFirst: when Dial returns, the server has already reported the initiator through
// OnAccept (a control message sent right after may be answered by a put back to it).
func testAcceptedFirst(t *testing.T, o Options) {
	tr := o.New(t)
	for i := range 20 {
		var accepted atomic.Bool
		srv, err := tr.Listen(transport.ServerConfig{BindAddr: o.addr(t), Region: o.buf(t, 4096),
			OnAccept: func(transport.PeerInfo) { accepted.Store(true) }})
		if err != nil {
			t.Fatal(err)
		}
		ep, err := tr.Dial(ctx10(t), transport.DialConfig{Addr: srv.Addr(), Local: o.buf(t, 4096), Rank: 1, ListenPort: 1234, Lanes: o.Lanes})
		if err != nil {
			t.Fatal(err)
		}
		ok := accepted.Load()
		_ = ep.Close()
		_ = srv.Close()
		if !ok {
			t.Fatalf("dial %d returned before the server's OnAccept", i)
		}
	}
}

// closeLoadWorkers is how many goroutines keep transfers of every kind in flight while
// testCloseUnderLoad closes things under them.
const closeLoadWorkers = 4

// testCloseUnderLoad closes the endpoint, the server, or both at once, while several goroutines
// keep puts and gets of every kind (blocking, async waited in order, async waited out of
// order, sizes from 1 byte to several chunks) in flight. Every operation must end — with a
// result, or with ErrClosed / ErrPeerClosed — well within the deadline, and no byte outside the
// ranges the transfers named may change on either side.
func testCloseUnderLoad(t *testing.T, o Options) {
	for _, what := range []string{"endpoint", "server", "both"} {
		t.Run(what, func(t *testing.T) {
			for round := range 3 {
				closeUnderLoad(t, o, what, round)
			}
		})
	}
}

func closeUnderLoad(t *testing.T, o Options, what string, round int) {
	const (
		size  = 8 << 20
		guard = 4096 // the last guard bytes of both regions are never named by a transfer
		span  = size - guard
	)
	p := o.pair(t, size, size)
	Fill(p.Local.Bytes()[:span], uint32(round)+1)
	lg := append([]byte(nil), p.Local.Bytes()[span:]...)
	tg := append([]byte(nil), p.Target.Bytes()[span:]...)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var (
		wg       sync.WaitGroup
		ops      atomic.Int64
		firstErr = make(chan error, closeLoadWorkers)
	)
	fail := func(err error) {
		select {
		case firstErr <- err:
		default:
		}
	}
	// ok reports whether err is an allowed outcome: none, or the endpoint's or peer's closure.
	ok := func(err error) bool {
		return err == nil || errors.Is(err, status.ErrClosed) || errors.Is(err, status.ErrPeerClosed)
	}
	for g := range closeLoadWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := uint64(g*7919 + round*104729 + 1)
			next := func(n uint64) uint64 { // xorshift: a fixed sequence per worker and round
				x ^= x << 13
				x ^= x >> 7
				x ^= x << 17
				return x % n
			}
			for {
				n := 1 + next(3<<20)
				if next(4) == 0 {
					n = 1 + next(64)
				}
				off := next(span - n + 1)
				var err error
				switch next(4) {
				case 0:
					err = transport.Put(ctx, p.EP, off, off, n)
				case 1:
					err = transport.Get(ctx, p.EP, off, off, n)
				case 2, 3:
					var batch []*transport.Op
					for range 4 {
						var op *transport.Op
						if next(2) == 0 {
							op, err = p.EP.PutAsync(ctx, off, off, n)
						} else {
							op, err = p.EP.GetAsync(ctx, off, off, n)
						}
						if err != nil {
							break
						}
						batch = append(batch, op)
					}
					for i := range batch { // half of the rounds wait last-posted first
						op := batch[i]
						if next(2) == 0 {
							op = batch[len(batch)-1-i]
						}
						if werr := op.Wait(ctx); err == nil {
							err = werr
						}
					}
				}
				ops.Add(1)
				if !ok(err) {
					fail(fmt.Errorf("%s %d after close: %w", what, n, err))
					return
				}
				if err != nil {
					return // the closure reached this worker
				}
			}
		}()
	}
	time.Sleep(time.Duration(5+5*round) * time.Millisecond) // let transfers of every kind start
	switch what {
	case "endpoint":
		_ = p.EP.Close()
	case "server":
		_ = p.Server.Close()
	case "both":
		var cw sync.WaitGroup
		for _, c := range []func() error{p.EP.Close, p.Server.Close} {
			cw.Add(1)
			go func() { defer cw.Done(); _ = c() }()
		}
		cw.Wait()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatalf("close %s under load: transfers still running 15 s later (%d done)", what, ops.Load())
	}
	select {
	case err := <-firstErr:
		t.Fatal(err)
	default:
	}
	_ = p.EP.Close()
	_ = p.Server.Close()
	if !bytes.Equal(p.Local.Bytes()[span:], lg) || !bytes.Equal(p.Target.Bytes()[span:], tg) {
		t.Fatalf("close %s under load: bytes outside every transfer's range changed", what)
	}
}

// BenchPut times blocking puts of size bytes from p's local buffer to its target (bytes per
// second and allocations per put).
func BenchPut(b *testing.B, p *Pair, size uint64) {
	ctx := context.Background()
	b.SetBytes(int64(size))
	b.ReportAllocs()
	for b.Loop() {
		if err := transport.Put(ctx, p.EP, 0, 0, size); err != nil {
			b.Fatal(err)
		}
	}
}
