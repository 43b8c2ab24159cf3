package etcdproc

import (
	"context"
	"net"
	"os/exec"
	"testing"
	"time"
)

// A port taken between picking it and etcd binding it (another test package's listener) makes
// the member exit; Start tries again with other ports instead of waiting out its ready time.
func TestStartRetriesTakenPort(t *testing.T) {
	if _, err := exec.LookPath("etcd"); err != nil {
		t.Skip("etcd not installed")
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	calls := 0
	pickPort = func() (int, error) {
		if calls++; calls == 1 {
			return taken.Addr().(*net.TCPAddr).Port, nil // the first member's client port
		}
		return freePort()
	}
	defer func() { pickPort = freePort }()
	c, err := Start(context.Background(), 1, t.TempDir(), 20*time.Second)
	if err != nil {
		t.Fatalf("Start with the first port taken: %v", err)
	}
	defer c.Stop()
	if calls < 4 {
		t.Fatalf("%d ports picked: want a second attempt (4 or more)", calls)
	}
}
