package sockpair

import (
	"net"
	"testing"
)

// New returns a dialled connection and the one its listener accepted, over network "tcp"
// (127.0.0.1) or "unix" (a socket in t's temporary directory); both are closed when the test
// ends.
func New(t testing.TB, network string) (dialled, accepted net.Conn) {
	t.Helper()
	addr := "127.0.0.1:0"
	if network == "unix" {
		addr = t.TempDir() + "/s"
	}
	l, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	done := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		done <- c
	}()
	dialled, err = net.Dial(network, l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if accepted = <-done; accepted == nil {
		t.Fatal("sockpair: accept failed")
	}
	t.Cleanup(func() { dialled.Close(); accepted.Close() })
	return dialled, accepted
}
