// Package etcdtest starts local etcd clusters (internal/etcdproc) for tests of the etcd store
// backend, skipping where etcd is not installed.
package etcdtest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/hmc-go/hmc/internal/etcdproc"
)

// Cluster is a local etcd cluster, stopped when the test ends.
type Cluster = etcdproc.Cluster

// IgnoreGoroutines returns goleak options for the process-wide goroutines of grpc and the etcd
// client, which outlive every client.
func IgnoreGoroutines() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		goleak.IgnoreTopFunction("google.golang.org/grpc/internal/resolver/dns.(*dnsResolver).watcher"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc.(*addrConn).resetTransportAndUnlock"),
	}
}

// Start starts an n-member cluster and waits until it serves writes. It skips the test when
// etcd is not installed, and fails it instead when HMC_REQUIRE_ETCD=1 (as CI sets).
func Start(t testing.TB, n int) *Cluster {
	c, err := etcdproc.Start(context.Background(), n, t.TempDir(), 30*time.Second)
	if errors.Is(err, exec.ErrNotFound) && os.Getenv("HMC_REQUIRE_ETCD") != "1" {
		t.Skip("etcd not installed (apt-get install etcd-server); skipping the etcd backend")
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c
}
