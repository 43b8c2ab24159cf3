package hmc

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/hmc-go/hmc/ctrl"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSessionRoundTrip(t *testing.T) {
	for _, force := range []string{"", "tcp", "uds"} {
		t.Run("ctrl="+force, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			dir := t.TempDir()
			srv, err := NewSession(0, 1<<20, CPU, 1, "127.0.0.1")
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			if err := srv.InitServer("127.0.0.1", 0, 0, 0, dir, TCP); err != nil {
				t.Fatal(err)
			}
			dataPort := srv.DataPort()
			cli, err := NewSession(0, 1<<20, CPU, 2, "127.0.0.1")
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			switch force {
			case "tcp":
				cli.ForceCtrlTransport(ctrl.TCP)
			case "uds":
				cli.ForceCtrlTransport(ctrl.UDS)
			}
			peer, err := cli.Connect(ctx, 0, 1, "127.0.0.1", dataPort, srv.Comm().CtrlAddr().Port, dir, AUTO)
			if err != nil {
				t.Fatal(err)
			}
			if again, err := cli.Connect(ctx, 0, 1, "127.0.0.1", dataPort, srv.Comm().CtrlAddr().Port, dir, AUTO); err != nil || again.String() != peer.String() {
				t.Fatalf("connecting again: %v, %v", again, err)
			}
			n, err := cli.Put([]byte("hello hmc"), 0)
			if err != nil || n != 9 {
				t.Fatal(n, err)
			}
			if err := peer.Put(ctx, 0, 100, n); err != nil {
				t.Fatal(err)
			}
			if err := peer.CtrlSend(ctx, 1); err != nil {
				t.Fatal(err)
			}
			if tag, err := srv.CtrlRecv(ctx, 1); err != nil || tag != 1 {
				t.Fatal(tag, err)
			}
			got := make([]byte, 9)
			if err := srv.GetInto(got, 100); err != nil || string(got) != "hello hmc" {
				t.Fatalf("%q %v", got, err)
			}
			// NB get back into another offset, then CopyWithin.
			byRank, err := cli.Peer(0)
			if err != nil {
				t.Fatal(err)
			}
			id, err := byRank.GetNB(ctx, 500, 100, 9)
			if err != nil {
				t.Fatal(err)
			}
			if err := cli.Wait(ctx, id); err != nil {
				t.Fatal(err)
			}
			if err := cli.CopyWithin(1000, 500, 9); err != nil {
				t.Fatal(err)
			}
			_ = cli.GetInto(got, 1000)
			if string(got) != "hello hmc" {
				t.Fatalf("%q", got)
			}
			// Buffer overflow is INVALID_CONFIG.
			if _, err := cli.Put(make([]byte, 10), 1<<20-5); CodeOf(err) != InvalidConfig || !errors.Is(err, ErrOutOfRange) {
				t.Fatal(err)
			}
			if err := peer.Disconnect(); err != nil {
				t.Fatal(err)
			}
			if err := peer.Put(ctx, 0, 0, 1); CodeOf(err) != NotFound {
				t.Fatalf("not connected: %v", err)
			}
			if err := srv.CloseServer(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestSessionErrors(t *testing.T) {
	if _, err := NewSession(0, 0, CPU, 1, ""); CodeOf(err) != InvalidConfig {
		t.Fatal(err)
	}
	if _, err := NewSession(0, 10, MooreGPU, 1, ""); CodeOf(err) != Unsupported {
		t.Fatal(err)
	}
	if _, err := NewSession(0, 10, CPU, -1, ""); CodeOf(err) != InvalidConfig {
		t.Fatal(err)
	}
	s, _ := NewSession(0, 10, CPU, 1, "")
	defer s.Close()
	s.ForceCtrlTransport(ctrl.UDS)
	if _, err := s.Connect(context.Background(), 0, 1, "127.0.0.1", 1, 1, "", TCP); CodeOf(err) != InvalidConfig {
		t.Fatal(err)
	}
}

// A Session's InitServer and Connect may run at once (a peer that serves and dials in
// parallel): under -race this is clean, and both work.
func TestSessionInitServerAndConnectConcurrently(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dir := t.TempDir()
	srv := newSession(t, "")
	if err := srv.InitServer("127.0.0.1", 0, 0, 0, dir, TCP); err != nil {
		t.Fatal(err)
	}
	dataPort := srv.DataPort()
	cli := newSession(t, "")
	errs := make(chan error, 2)
	peers := make(chan *Peer, 1)
	go func() { errs <- cli.InitServer("127.0.0.1", 0, 0, 1, dir, TCP) }()
	go func() {
		p, err := cli.Connect(ctx, 0, 1, "127.0.0.1", dataPort, srv.Comm().CtrlAddr().Port, dir, TCP)
		peers <- p
		errs <- err
	}()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Put([]byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	if err := (<-peers).Put(ctx, 0, 0, 1); err != nil {
		t.Fatal(err)
	}
}

// newSession makes a 1 MiB CPU Session closed by t.Cleanup.
func newSession(t *testing.T, localIP string) *Session {
	t.Helper()
	s, err := NewSession(0, 1<<20, CPU, 1, localIP)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
