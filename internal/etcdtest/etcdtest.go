// Package etcdtest starts local etcd clusters (Debian's etcd-server binary) on loopback ports
// for tests of the etcd store backend.
package etcdtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
)

// Cluster is a local etcd cluster.
type Cluster struct {
	Members []*Member
}

// Member is one etcd process.
type Member struct {
	Name, Client, Peer, Dir string
	cmd                     *exec.Cmd
}

// IgnoreGoroutines returns goleak options for the process-wide goroutines of grpc and the etcd
// client, which outlive every client.
func IgnoreGoroutines() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		goleak.IgnoreTopFunction("google.golang.org/grpc/internal/resolver/dns.(*dnsResolver).watcher"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc.(*addrConn).resetTransportAndUnlock"),
	}
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Start starts an n-member cluster and waits until it serves writes. It skips the test when
// etcd is not installed, and fails it instead when HMC_REQUIRE_ETCD=1 (as CI sets).
func Start(t testing.TB, n int) *Cluster {
	bin, err := exec.LookPath("etcd")
	if err != nil {
		if os.Getenv("HMC_REQUIRE_ETCD") == "1" {
			t.Fatalf("HMC_REQUIRE_ETCD=1 but no etcd binary: %v", err)
		}
		t.Skip("etcd not installed (apt-get install etcd-server); skipping the etcd backend")
	}
	c := &Cluster{}
	var initial []string
	for i := range n {
		m := &Member{Name: fmt.Sprintf("m%d", i), Dir: t.TempDir(),
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
		logf, err := os.Create(filepath.Join(m.Dir, "etcd.log"))
		if err != nil {
			t.Fatal(err)
		}
		m.cmd.Stdout, m.cmd.Stderr = logf, logf
		if err := m.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Kill(); _ = logf.Close() })
	}
	cli := c.client(t)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		if _, err := cli.Put(ctx, "/etcdtest/up", "1"); err == nil {
			return c
		} else if ctx.Err() != nil {
			t.Fatalf("etcd did not come up: %v (logs in %s)", err, c.Members[0].Dir)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *Cluster) client(t testing.TB) *clientv3.Client {
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	return cli
}

// Endpoints returns the members' client addresses.
func (c *Cluster) Endpoints() []string {
	var eps []string
	for _, m := range c.Members {
		eps = append(eps, m.Client)
	}
	return eps
}

// URL returns an etcd:// store URL for all members with namespace ns.
func (c *Cluster) URL(ns string) string {
	return "etcd://" + strings.Join(c.Endpoints(), ",") + "/" + ns
}

// Leader returns the member that leads now.
func (c *Cluster) Leader(t testing.TB) *Member {
	cli := c.client(t)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, m := range c.Members {
		st, err := cli.Status(ctx, m.Client)
		if err == nil && st.Leader == st.Header.MemberId {
			return m
		}
	}
	t.Fatal("no etcd leader")
	return nil
}

// Kill kills the member (SIGKILL) and waits for it.
func (m *Member) Kill() {
	if m.cmd != nil && m.cmd.Process != nil && m.cmd.ProcessState == nil {
		_ = m.cmd.Process.Kill()
		_ = m.cmd.Wait()
	}
}
