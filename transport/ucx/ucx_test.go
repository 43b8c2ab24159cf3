//go:build ucx && cgo

package ucx

import (
	"os"
	"testing"

	"go.uber.org/goleak"

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
