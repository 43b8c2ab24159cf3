// Package etcdproc starts local etcd clusters (Debian's etcd-server binary) on loopback ports,
// for `hmc store bench --start-etcd` and, through internal/etcdtest, the tests of the etcd
// store backend.
package etcdproc

import (
	"context"
	"errors"
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
	exited                  chan struct{} // closed when the process has exited (and been waited for)
	log                     *os.File
}

// pickPort picks a free port (a variable for the test that hands out a taken one).
var pickPort = freePort

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
//
// Ports are picked free just before etcd binds them, so another program can take one in
// between (parallel test packages do): a member that exits before the cluster serves makes
// Start try again with other ports, three times at most, within the same ready time.
func Start(ctx context.Context, n int, dir string, ready time.Duration) (*Cluster, error) {
	bin, err := exec.LookPath("etcd")
	if err != nil {
		return nil, fmt.Errorf("etcd not installed (apt-get install etcd-server): %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, ready)
	defer cancel()
	for attempt := 1; ; attempt++ {
		c, err := start(wctx, bin, n, filepath.Join(dir, fmt.Sprintf("try%d", attempt)))
		if err == nil || !errors.Is(err, errExited) || attempt == 3 {
			return c, err
		}
	}
}

// errExited is a member that exited before the cluster served (a port taken meanwhile).
var errExited = errors.New("etcd exited")

func start(wctx context.Context, bin string, n int, dir string) (*Cluster, error) {
	c := &Cluster{}
	var initial []string
	for i := range n {
		cp, err1 := pickPort()
		pp, err2 := pickPort()
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
	for {
		pctx, cancel := context.WithTimeout(wctx, time.Second)
		_, err := cli.Put(pctx, "/etcdproc/up", "1")
		cancel()
		if err == nil {
			return c, nil
		}
		for _, m := range c.Members {
			select {
			case <-m.exited:
				c.Stop()
				return nil, fmt.Errorf("%w: member %s (log %s)", errExited, m.Name, filepath.Join(m.Dir, "etcd.log"))
			default:
			}
		}
		if wctx.Err() != nil {
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
	if err := m.cmd.Start(); err != nil {
		return err
	}
	m.exited = make(chan struct{})
	go func() { _ = m.cmd.Wait(); close(m.exited) }() // ends when the process does (Kill)
	return nil
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
	if m.exited != nil {
		_ = m.cmd.Process.Kill() // an error: it exited already
		<-m.exited
	}
	if m.log != nil {
		_ = m.log.Close()
		m.log = nil
	}
}
