//go:build ucx && cgo

package ucx

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/transporttest"
)

func TestMain(m *testing.M) {
	if err := ExecWithoutErrorSignals(); err != nil {
		panic(err)
	}
	transporttest.MaybeAtomicChild(func() (transport.Transport, error) { return New(Config{}) }) // UCX_TLS from the parent
	maybeVectorTarget()
	if os.Getenv("UCX_NET_DEVICES") == "" {
		os.Setenv("UCX_NET_DEVICES", "lo") // tests talk over loopback only
	}
	goleak.VerifyTestMain(m)
}

// conformance runs the transport suite on HMC's memfd buffers and on buffers UCX allocated.
func conformance(t *testing.T, tls string) {
	cfg := Config{TLS: tls}
	o := transporttest.Options{
		New: func(t testing.TB) transport.Transport {
			tr, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			return tr
		},
	}
	t.Run("memfd", func(t *testing.T) { transporttest.Run(t, o) })
	o.Alloc = func(t testing.TB, size uint64) *buffer.ConnBuffer { return hostBuf(t, size, cfg) }
	t.Run("ucx-allocated", func(t *testing.T) { transporttest.Run(t, o) })
}

func hostBuf(t testing.TB, size uint64, cfg Config) *buffer.ConnBuffer {
	t.Helper()
	b, err := NewHostBuffer(size, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func TestConformanceTCP(t *testing.T) { conformance(t, "tcp") }

func TestConformanceSharedMemory(t *testing.T) { conformance(t, "posix,cma,self") }

// NewHostBuffer's memory is zeroed host memory without a memfd, served with the handle it was
// allocated with: a Transport of the same transports shares its context and registers nothing;
// one of other transports registers it like any memory. Both move its bytes.
func TestHostBuffer(t *testing.T) {
	cfg := Config{TLS: "posix,cma,self"}
	if _, err := NewHostBuffer(0, cfg); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatalf("size 0: %v", err)
	}
	const size = 3<<20 + 5
	target := hostBuf(t, size, cfg)
	if target.FD() != -1 || target.Type() != memory.CPU || target.Size() != size {
		t.Fatalf("fd %d type %v size %d", target.FD(), target.Type(), target.Size())
	}
	for i, b := range target.Bytes() {
		if b != 0 {
			t.Fatalf("byte %d is %d, want zeroed memory", i, b)
		}
	}
	for _, tls := range []string{"posix,cma,self", "tcp"} {
		t.Run(tls, func(t *testing.T) {
			tr, err := New(Config{TLS: tls})
			if err != nil {
				t.Fatal(err)
			}
			local := hostBuf(t, size, Config{TLS: tls})
			if shared := contextKey(Config{TLS: tls}) == contextKey(cfg); shared {
				w, err := tr.(*Transport).acquire()
				if err != nil {
					t.Fatal(err)
				}
				if _, ok := w.uctx.allocated(target.Bytes()[100:200]); !ok {
					t.Error("the Transport's context does not know the buffer's allocation")
				}
				tr.(*Transport).release()
			}
			p := transporttest.NewPairOf(t, tr, "127.0.0.1:0", target, local, 0)
			src := local.Bytes()
			for i := range src {
				src[i] = byte(i*7 + len(tls))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := transport.Put(ctx, p.EP, 0, 0, size); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(target.Bytes(), src) {
				t.Fatal("put: target differs")
			}
			clear(src)
			if err := transport.Get(ctx, p.EP, 1, 1, size-1); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(src[1:], target.Bytes()[1:]) || src[0] != 0 {
				t.Fatal("get: local differs")
			}
		})
	}
}

func TestResources(t *testing.T) {
	rs, err := Resources()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range rs {
		t.Logf("%s/%s: %s on %s", r.Component, r.MD, r.Transport, r.Device)
		if r.Transport == "tcp" {
			found = true
		}
	}
	if !found {
		t.Fatal("UCX lists no tcp transport")
	}
}

// A GPU local region goes through the registered staging ring (this UCX has no CUDA support);
// a GPU target region is refused, saying why. With no CUDA device the emulation stands in.
func TestDeviceInitiatorStaged(t *testing.T) {
	for _, tls := range []string{"tcp", "posix,cma,self"} {
		t.Run(tls, func(t *testing.T) {
			tr, _ := New(Config{TLS: tls})
			const size = 5<<20 + 7
			dev := transporttest.DeviceBuf(t, size)
			if !hasCUDA() {
				if _, err := tr.Listen(transport.ServerConfig{BindAddr: "127.0.0.1:0", Region: dev}); !errors.Is(err, status.ErrUnsupported) {
					t.Fatalf("device target: %v", err)
				}
			}
			transporttest.DeviceRoundTrip(t, tr, "127.0.0.1:0", transporttest.HostBuf(t, size), dev)
		})
	}
}

// Progress before any use, and through a worker that has gone with the last Close, does
// nothing; it never touches a destroyed worker.
func TestProgressAfterClose(t *testing.T) {
	tr, err := New(Config{TLS: "tcp"})
	if err != nil {
		t.Fatal(err)
	}
	u := tr.(*Transport)
	u.Progress() // no worker yet
	p := transporttest.NewPair(t, tr, 4096, 4096, 0)
	w := u.live.Load()
	u.Progress()
	if err := p.EP.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Server.Close(); err != nil {
		t.Fatal(err)
	}
	if u.live.Load() != nil {
		t.Fatal("worker still live after the last Close")
	}
	u.Progress()
	w.Poll() // a poller that loaded the worker before it went
}

// Operations nobody waits for still complete once the last waiter left with its own done: the
// loop takes progress back (after userActive) without being kicked, and the target's share of
// a tcp put is progressed too.
func TestUnwaitedCompleteAfterWaiterLeaves(t *testing.T) {
	tr, err := New(Config{TLS: "tcp"})
	if err != nil {
		t.Fatal(err)
	}
	const n, chunk = 8, 256 << 10
	p := transporttest.NewPair(t, tr, n*chunk, n*chunk, 0)
	src := p.Local.Bytes()
	for i := range src {
		src[i] = byte(i*7 + i/chunk)
	}
	ctx := context.Background()
	ops := make([]*transport.Op, n)
	for i := range ops {
		if ops[i], err = p.EP.PutAsync(ctx, uint64(i*chunk), uint64(i*chunk), chunk); err != nil {
			t.Fatal(err)
		}
	}
	if err := ops[0].Wait(ctx); err != nil {
		t.Fatal(err)
	}
	for i, op := range ops[1:] {
		select {
		case <-op.Done(): // no Wait: nobody polls for these
		case <-time.After(10 * time.Second):
			t.Fatalf("put %d not complete 10 s after the waiter left", i+1)
		}
		if err := op.Err(); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(p.Target.Bytes(), src) {
		t.Fatal("target differs from the source")
	}
}

// Closing the last user stops the worker while its loop stands aside: stop must not touch
// the worker once the loop may have destroyed it (ucp_worker_signal on a destroyed worker
// crashed ~1 % of `hmc bench` runs at exit).
func TestStopWhileStandingAside(t *testing.T) {
	n := 300
	if testing.Short() {
		n = 50
	}
	for i := range n {
		tr, err := New(Config{TLS: "posix,cma,self"})
		if err != nil {
			t.Fatal(err)
		}
		p := transporttest.NewPair(t, tr, 4096, 4096, 0)
		if err := transport.Put(context.Background(), p.EP, 0, 0, 4096); err != nil {
			t.Fatal(i, err)
		}
		// The loop has seen a post: it stands aside now, waiting for a kick or userActive.
		if err := p.EP.Close(); err != nil {
			t.Fatal(err)
		}
		if err := p.Server.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRMA(t *testing.T) {
	for _, tls := range []string{"tcp", "posix,cma,self"} {
		t.Run(tls, func(t *testing.T) {
			cfg := Config{TLS: tls}
			transporttest.RunRMA(t, transporttest.Options{New: func(t testing.TB) transport.Transport {
				tr, err := New(cfg)
				if err != nil {
					t.Fatal(err)
				}
				return tr
			}})
		})
	}
}

// Eight processes add to one word of this process's memory at once with UCX atomics; the sum is
// exact.
func TestAtomicSumProcesses(t *testing.T) {
	each := 10000
	if testing.Short() {
		each = 1000
	}
	for _, tls := range []string{"tcp", "posix,cma,self"} {
		t.Run(tls, func(t *testing.T) {
			t.Setenv("UCX_TLS", tls) // the children's transports read it
			transporttest.AtomicSumProcesses(t, transporttest.Options{New: func(t testing.TB) transport.Transport {
				tr, err := New(Config{TLS: tls})
				if err != nil {
					t.Fatal(err)
				}
				return tr
			}}, 8, each)
		})
	}
}

// An endpoint whose requests neither complete nor fail within CloseTimeout is abandoned, not
// closed by force (which would purge them and crash UCX 1.13): Close says so with ErrTimeout,
// and nothing crashes afterwards. 256 MiB over tcp cannot drain in a millisecond.
func TestCloseAbandonsAStuckEndpoint(t *testing.T) {
	tr, err := New(Config{TLS: "tcp", CloseTimeout: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	p := transporttest.NewPair(t, tr, 64<<20, 64<<20, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 4 {
		if _, err := p.EP.PutAsync(ctx, 0, 0, 64<<20); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.EP.Close(); !errors.Is(err, status.ErrTimeout) {
		t.Skipf("the puts drained within 1 ms after all (Close: %v): nothing to abandon", err)
	}
	if _, err := p.EP.PutAsync(ctx, 0, 0, 8); !errors.Is(err, status.ErrClosed) {
		t.Fatalf("put after an abandoning Close: %v", err)
	}
}

// TestMallocThresholds: once a UCX context is open, a 4 MiB malloc (as UCX's buffer for an
// assembled PUTV, up to 2 MiB) comes from the heap, not a mapping of its own faulted in page by
// page; a process that set malloc tunables itself, or HMC_UCX_MALLOC=default, keeps glibc's.
func TestMallocThresholds(t *testing.T) {
	hostBuf(t, 4096, Config{TLS: "tcp"}) // opens a UCX context
	if !tuneMallocHere(os.Getenv) {
		t.Skip("this process's environment sets malloc's thresholds")
	}
	for range 3 { // a freed chunk is reused, not unmapped and mapped again
		if mallocMapped(4 << 20) {
			t.Fatal("a 4 MiB malloc got a mapping of its own after a UCX context opened")
		}
	}
	for env, want := range map[string]bool{
		"":                       true,
		"HMC_UCX_MALLOC=default": false,
		"HMC_UCX_MALLOC=tuned":   true,
		"GLIBC_TUNABLES=glibc.malloc.arena_max=2":  false,
		"GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX512F": true,
		"MALLOC_MMAP_THRESHOLD_=1048576":           false,
		"MALLOC_TRIM_THRESHOLD_=1048576":           false,
	} {
		k, v, _ := strings.Cut(env, "=")
		if got := tuneMallocHere(func(s string) string {
			if s == k {
				return v
			}
			return ""
		}); got != want {
			t.Errorf("environment %q: tunes malloc %v, want %v", env, got, want)
		}
	}
}
