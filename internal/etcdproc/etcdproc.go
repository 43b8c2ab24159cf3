// Package etcdproc starts local etcd clusters (Debian's etcd-server binary) on loopback ports,
// for `hmc store bench --start-etcd` and, through internal/etcdtest, the tests of the etcd
// store backend.
package etcdproc

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Cluster is a local etcd cluster.
type Cluster struct {
	Members []*Member
}

// Member is one etcd process, its data and log under Dir.
type Member struct {
	Name, Client, Peer, Dir string
	cmd                     *exec.Cmd
	log                     *os.File
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Start starts an n-member cluster with its members' directories under dir (fast elections:
// 50 ms heartbeats, 500 ms election timeout) and waits up to ready for it to serve writes. On
// error nothing is left running. exec.ErrNotFound (wrapped) means etcd is not installed.
func Start(ctx context.Context, n int, dir string, ready time.Duration) (*Cluster, error) {
	bin, err := exec.LookPath("etcd")
	if err != nil {
		return nil, fmt.Errorf("etcd not installed (apt-get install etcd-server): %w", err)
	}
	c := &Cluster{}
	var initial []string
	for i := range n {
		cp, err1 := freePort()
		pp, err2 := freePort()
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("etcd ports: %v %v", err1, err2)
		}
		m := &Member{Name: fmt.Sprintf("m%d", i), Dir: filepath.Join(dir, fmt.Sprintf("m%d", i)),
			Client: fmt.Sprintf("127.0.0.1:%d", cp), Peer: fmt.Sprintf("127.0.0.1:%d", pp)}
		c.Members = append(c.Members, m)
		initial = append(initial, m.Name+"=http://"+m.Peer)
	}
	for _, m := range c.Members {
		if err := m.start(bin, strings.Join(initial, ",")); err != nil {
			c.Stop()
			return nil, err
		}
	}
	cli, err := c.Client()
	if err != nil {
		c.Stop()
		return nil, err
	}
	defer cli.Close()
	wctx, cancel := context.WithTimeout(ctx, ready)
	defer cancel()
	for {
		if _, err := cli.Put(wctx, "/etcdproc/up", "1"); err == nil {
			return c, nil
		} else if wctx.Err() != nil {
			c.Stop()
			return nil, fmt.Errorf("etcd did not come up (logs under %s): %w", dir, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (m *Member) start(bin, initial string) error {
	if err := os.MkdirAll(m.Dir, 0o700); err != nil {
		return err
	}
	m.cmd = exec.Command(bin, "--name", m.Name, "--data-dir", filepath.Join(m.Dir, "data"),
		"--listen-client-urls", "http://"+m.Client, "--advertise-client-urls", "http://"+m.Client,
		"--listen-peer-urls", "http://"+m.Peer, "--initial-advertise-peer-urls", "http://"+m.Peer,
		"--initial-cluster", initial, "--initial-cluster-state", "new",
		"--heartbeat-interval", "50", "--election-timeout", "500")
	var err error
	if m.log, err = os.Create(filepath.Join(m.Dir, "etcd.log")); err != nil {
		return err
	}
	m.cmd.Stdout, m.cmd.Stderr = m.log, m.log
	return m.cmd.Start()
}

// Client returns an etcd client of all members.
func (c *Cluster) Client() (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
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
func (c *Cluster) Leader(ctx context.Context) (*Member, error) {
	cli, err := c.Client()
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	for _, m := range c.Members {
		st, err := cli.Status(ctx, m.Client)
		if err == nil && st.Leader == st.Header.MemberId {
			return m, nil
		}
	}
	return nil, fmt.Errorf("no etcd leader among %v", c.Endpoints())
}

// KillLeader kills the member that leads now (SIGKILL) and returns its name; it waits at most
// 10 s to find it.
func (c *Cluster) KillLeader() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := c.Leader(ctx)
	if err != nil {
		return "", err
	}
	m.Kill()
	return m.Name, nil
}

// Stop kills every member.
func (c *Cluster) Stop() {
	for _, m := range c.Members {
		m.Kill()
	}
}

// Kill kills the member (SIGKILL) and waits for it.
func (m *Member) Kill() {
	if m.cmd != nil && m.cmd.Process != nil && m.cmd.ProcessState == nil {
		_ = m.cmd.Process.Kill()
		_ = m.cmd.Wait()
	}
	if m.log != nil {
		_ = m.log.Close()
		m.log = nil
	}
}
