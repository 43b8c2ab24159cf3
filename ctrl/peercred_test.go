package ctrl

import (
	"context"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hmc-go/hmc/status"
)

// TestUDSOtherUserIsRefused: a process of another user that reaches the Unix control socket
// (its file made world-writable here, so that only the credential check stands in the way)
// sends a HELLO and a message; the Manager closes the connection without reading them, and
// the message never arrives. Needs root and runuser (skipped otherwise, unless
// HMC_REQUIRE_ROOT=1).
func TestUDSOtherUserIsRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("HMC_REQUIRE_ROOT") == "1" {
			t.Fatal("HMC_REQUIRE_ROOT=1 but not running as root")
		}
		t.Skip("needs root to run a process as another user (HMC_REQUIRE_ROOT=1 makes this a failure)")
	}
	runuser, err := exec.LookPath("runuser")
	if err != nil {
		t.Skipf("runuser (util-linux) not found: %v", err)
	}
	srv := newManager(t, 0)
	dir, err := os.MkdirTemp("", "hmc-ctrl-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "ctrl.sock")
	if err := srv.Listen("", -1, path); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o777); err != nil {
		t.Fatal(err)
	}
	frames := AppendHello(nil, 7)
	msg := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	h := MakeHeader(TypeInt, 0, uint32(len(msg)))
	frames = append(append(frames, h[:]...), msg...)
	script := `import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
try:
    s.sendall(bytes.fromhex(sys.argv[2]))
    s.settimeout(5)
    print("CLOSED" if s.recv(1) == b"" else "ANSWERED")
except OSError as e:
    print("CLOSED", e)
`
	out, err := exec.Command(runuser, "-u", "nobody", "--", "/usr/bin/python3", "-c", script, path, hex.EncodeToString(frames)).CombinedOutput()
	if err != nil {
		t.Fatalf("attacker: %v: %s", err, out)
	}
	if !strings.HasPrefix(string(out), "CLOSED") {
		t.Fatalf("attacker as nobody: %s", out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if m, err := srv.Recv(ctx, 7); !errors.Is(err, status.ErrTimeout) {
		t.Fatalf("a refused peer's message arrived: %+v, %v", m, err)
	}
}
