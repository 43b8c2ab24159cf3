//go:build ucx && cgo

package ucx

import (
	"bytes"
	"context"
	"errors"
	"os"
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
	if os.Getenv("UCX_NET_DEVICES") == "" {
		os.Setenv("UCX_NET_DEVICES", "lo") // tests talk over loopback only
	}
	goleak.VerifyTestMain(m)
}

func conformance(t *testing.T, tls string) {
	transporttest.Run(t, transporttest.Options{
		New: func(t testing.TB) transport.Transport {
			tr, err := New(Config{TLS: tls})
			if err != nil {
				t.Fatal(err)
			}
			return tr
		},
	})
}

func TestConformanceTCP(t *testing.T) { conformance(t, "tcp") }

func TestConformanceSharedMemory(t *testing.T) { conformance(t, "posix,cma,self") }

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
	if memory.Probe(memory.NvidiaGPU) != nil {
		t.Setenv(memory.EmulateGPUEnv, "1")
	}
	for _, tls := range []string{"tcp", "posix,cma,self"} {
		t.Run(tls, func(t *testing.T) {
			tr, _ := New(Config{TLS: tls})
			const size = 5<<20 + 7
			dev, err := buffer.New(0, size, memory.NvidiaGPU)
			if err != nil {
				t.Fatal(err)
			}
			defer dev.Close()
			if !hasCUDA() {
				if _, err := tr.Listen(transport.ServerConfig{BindAddr: "127.0.0.1:0", Region: dev}); !errors.Is(err, status.ErrUnsupported) {
					t.Fatalf("device target: %v", err)
				}
			}
			target, _ := buffer.New(0, size, memory.CPU)
			defer target.Close()
			srv, err := tr.Listen(transport.ServerConfig{BindAddr: "127.0.0.1:0", Region: target})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			ep, err := tr.Dial(ctx, transport.DialConfig{Addr: srv.Addr(), Local: dev})
			if err != nil {
				t.Fatal(err)
			}
			defer ep.Close()
			src := make([]byte, size)
			transporttest.Fill(src, 8)
			if err := dev.WriteFromCPU(src, 0); err != nil {
				t.Fatal(err)
			}
			for _, n := range []uint64{1, 1 << 20, 1<<20 + 1, size} {
				if err := transport.Put(ctx, ep, 0, 0, n); err != nil {
					t.Fatalf("put %d: %v", n, err)
				}
				if !bytes.Equal(target.Bytes()[:n], src[:n]) {
					t.Fatalf("put %d differs", n)
				}
			}
			transporttest.Fill(target.Bytes(), 9)
			if err := transport.Get(ctx, ep, 3, 0, size-3); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, size)
			if err := dev.ReadToCPU(got, 0); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got[3:], target.Bytes()[:size-3]) {
				t.Fatal("get into device memory differs")
			}
			if err := transport.Put(ctx, ep, 1, 0, size); !errors.Is(err, status.ErrOutOfRange) {
				t.Fatalf("device local range not checked: %v", err)
			}
		})
	}
}
