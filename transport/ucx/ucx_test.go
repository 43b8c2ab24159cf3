//go:build ucx && cgo

package ucx

import (
	"errors"
	"os"
	"testing"

	"go.uber.org/goleak"

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
