package shm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// nobody is the user the attacker runs as.
const nobody = 65534

// attackChild, run when HMC_SHM_ATTACK names a socket, is a process of another user: as
// "steal" it connects to a server's socket, says hello and, if handed the region's memfd, maps
// it read-write and writes 8 bytes into it; as "squat" it listens on the socket's name first.
// It prints what happened on one line.
func attackChild(role, addr string) {
	switch role {
	case "steal":
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: addr, Net: "unix"})
		if err != nil {
			fmt.Println("NOCONNECT", err)
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write(hello{rank: 9}.encode()); err != nil {
			fmt.Println("REFUSED write:", err)
			return
		}
		b := make([]byte, offerSize)
		oob := make([]byte, unix.CmsgSpace(4))
		_, oobn, _, _, err := c.ReadMsgUnix(b, oob)
		if err != nil || oobn == 0 {
			fmt.Println("REFUSED read:", err, "oob", oobn)
			return
		}
		msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
		fds, _ := unix.ParseUnixRights(&msgs[0])
		m, err := unix.Mmap(fds[0], 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			fmt.Println("GOTFD but mmap:", err)
			return
		}
		copy(m, "pwned!!!")
		fmt.Println("GOTFD wrote 8 bytes")
	case "squat":
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: addr, Net: "unix"})
		if err != nil {
			fmt.Println("NOLISTEN", err)
			return
		}
		fmt.Println("LISTENING")
		c, err := l.AcceptUnix()
		if err != nil {
			return
		}
		b, _ := io.ReadAll(io.LimitReader(c, helloSize))
		fmt.Fprintln(os.Stderr, "squatter read", len(b), "bytes")
	}
}

// asOtherUser starts this test binary as user nobody in role role against addr. It needs root
// (to switch users); without it the test is skipped, unless HMC_REQUIRE_ROOT=1.
func asOtherUser(t *testing.T, role, addr string) (*exec.Cmd, io.Reader) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("HMC_REQUIRE_ROOT") == "1" {
			t.Fatal("HMC_REQUIRE_ROOT=1 but not running as root: cannot start a process of another user")
		}
		t.Skip("needs root to run a process as another user (HMC_REQUIRE_ROOT=1 makes this a failure)")
	}
	// The test binary may sit in a directory only root can enter: copy it where nobody can run it.
	dir, err := os.MkdirTemp("", "hmc-attack-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	exe := filepath.Join(dir, "attacker")
	src, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(exe, src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), "HMC_SHM_ATTACK="+role+":"+addr)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, out
}

func line(t *testing.T, r io.Reader) string {
	t.Helper()
	var b []byte
	one := make([]byte, 1)
	for {
		if _, err := r.Read(one); err != nil || one[0] == '\n' {
			return string(b)
		}
		b = append(b, one[0])
	}
}

// TestOtherUserIsRefused runs the attack of hardening issue item 0: a process of another user
// connects to the abstract socket a server listens on. It gets nothing (no descriptor, no
// offer), the region is untouched, and a server that allows that user explicitly does hand it
// over (so it is the credential check that refuses).
func TestOtherUserIsRefused(t *testing.T) {
	for _, allow := range []bool{false, true} {
		t.Run(fmt.Sprintf("allowed=%v", allow), func(t *testing.T) {
			cfg := Config{}
			if allow {
				cfg.AllowUIDs = []uint32{nobody}
			}
			tr, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			region, err := buffer.New(0, 1<<20, memory.CPU)
			if err != nil {
				t.Fatal(err)
			}
			defer region.Close()
			copy(region.Bytes(), "original")
			addr := abstractName(t)
			srv, err := tr.Listen(transport.ServerConfig{BindAddr: addr, Region: region})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			cmd, out := asOtherUser(t, "steal", addr)
			got := line(t, out)
			_ = cmd.Wait()
			head := string(region.Bytes()[:8])
			if !allow {
				if !strings.HasPrefix(got, "REFUSED") || head != "original" {
					t.Fatalf("attacker as uid %d: %q, region starts %q", nobody, got, head)
				}
				return
			}
			if !strings.HasPrefix(got, "GOTFD") || head != "pwned!!!" {
				t.Fatalf("allowed uid %d: %q, region starts %q", nobody, got, head)
			}
		})
	}
}

// TestSquatterIsRefused: a process of another user that took the socket's name first gets no
// hello from an initiator, whose Dial fails with ErrPermission.
func TestSquatterIsRefused(t *testing.T) {
	addr := abstractName(t)
	_, out := asOtherUser(t, "squat", addr)
	if got := line(t, out); got != "LISTENING" {
		t.Fatalf("squatter: %q", got)
	}
	tr, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	local, err := buffer.New(0, 4096, memory.CPU)
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ep, err := tr.Dial(ctx, transport.DialConfig{Addr: addr, Local: local})
	if err == nil {
		ep.Close()
		t.Fatal("dialled a server of another user")
	}
	if !errors.Is(err, status.ErrPermission) {
		t.Fatalf("dial a squatter: %v", err)
	}
}
