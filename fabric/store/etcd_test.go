package store_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hmc-go/hmc/fabric/store"
	"github.com/hmc-go/hmc/fabric/store/storetest"
	"go.uber.org/goleak"
)

func etcdIgnores() []goleak.Option {
	return []goleak.Option{
		// grpc's and etcd client's process-wide goroutines outlive every client.
		goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		goleak.IgnoreTopFunction("google.golang.org/grpc/internal/resolver/dns.(*dnsResolver).watcher"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc.(*addrConn).resetTransportAndUnlock"),
	}
}

// EtcdCluster is a local etcd cluster of etcd processes on loopback ports (Debian's etcd-server).
type EtcdCluster struct {
	Members []*EtcdMember
}

// EtcdMember is one etcd process.
type EtcdMember struct {
	Name, Client, Peer, Dir string
	cmd                     *exec.Cmd
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startEtcd starts an n-member cluster, or skips when etcd is missing (fails if HMC_REQUIRE_ETCD=1).
func startEtcd(t testing.TB, n int) *EtcdCluster {
	bin, err := exec.LookPath("etcd")
	if err != nil {
		if os.Getenv("HMC_REQUIRE_ETCD") == "1" {
			t.Fatalf("HMC_REQUIRE_ETCD=1 but no etcd binary: %v", err)
		}
		t.Skip("etcd not installed (apt-get install etcd-server); skipping the etcd backend")
	}
	c := &EtcdCluster{}
	var initial []string
	for i := range n {
		m := &EtcdMember{Name: fmt.Sprintf("m%d", i), Dir: t.TempDir(),
			Client: fmt.Sprintf("127.0.0.1:%d", freePort(t)), Peer: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
		c.Members = append(c.Members, m)
		initial = append(initial, m.Name+"=http://"+m.Peer)
	}
	for _, m := range c.Members {
		m.cmd = exec.Command(bin, "--name", m.Name, "--data-dir", filepath.Join(m.Dir, "data"),
			"--listen-client-urls", "http://"+m.Client, "--advertise-client-urls", "http://"+m.Client,
			"--listen-peer-urls", "http://"+m.Peer, "--initial-advertise-peer-urls", "http://"+m.Peer,
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--heartbeat-interval", "50", "--election-timeout", "500")
		logf, _ := os.Create(filepath.Join(m.Dir, "etcd.log"))
		m.cmd.Stdout, m.cmd.Stderr = logf, logf
		if err := m.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Kill(); _ = logf.Close() })
	}
	// Ready when a client can write.
	cl, err := store.Open(context.Background(), c.URL("ready"), store.Config{DialTimeout: 30 * time.Second})
	if err != nil {
		t.Fatalf("etcd did not come up: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.Set(ctx, "up", []byte("1")); err != nil {
		t.Fatalf("etcd did not come up: %v", err)
	}
	_ = cl.Close()
	return c
}

// URL returns an etcd:// URL for all members with namespace ns.
func (c *EtcdCluster) URL(ns string) string {
	var eps []string
	for _, m := range c.Members {
		eps = append(eps, m.Client)
	}
	return "etcd://" + strings.Join(eps, ",") + "/" + ns
}

// Kill kills the member (SIGKILL) and waits for it.
func (m *EtcdMember) Kill() {
	if m.cmd != nil && m.cmd.Process != nil && m.cmd.ProcessState == nil {
		_ = m.cmd.Process.Kill()
		_ = m.cmd.Wait()
	}
}

var nsSeq atomic.Int64

func etcdBackend(c *EtcdCluster) storetest.Backend {
	return func(t *testing.T) storetest.Opener {
		url := c.URL(fmt.Sprintf("test%d", nsSeq.Add(1)))
		return func(cfg store.Config) (store.Client, error) {
			cfg.Heartbeat = time.Second
			return store.Open(context.Background(), url, cfg)
		}
	}
}

func TestEtcd(t *testing.T) {
	c := startEtcd(t, 1)
	storetest.Run(t, etcdBackend(c))
}
