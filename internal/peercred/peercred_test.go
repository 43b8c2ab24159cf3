package peercred

import (
	"net"
	"os"
	"path/filepath"
	"testing"
)

// Over a real Unix socket pair, the kernel's record names this process; the zero Policy
// admits this user and no other unless listed.
func TestOfAndPolicy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := l.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cred, err := Of(s)
	if err != nil {
		t.Fatal(err)
	}
	me := uint32(os.Geteuid())
	if cred.PID != os.Getpid() || cred.UID != me {
		t.Fatalf("cred %+v, want pid %d uid %d", cred, os.Getpid(), me)
	}
	if _, err := (Policy{}).Check(s); err != nil {
		t.Fatalf("own user refused: %v", err)
	}
	other := me + 1
	if (Policy{}).Admits(other) || !(Policy{UIDs: []uint32{other}}).Admits(other) {
		t.Fatal("allow-list not honoured")
	}
}
