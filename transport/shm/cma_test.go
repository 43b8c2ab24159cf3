package shm

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"unsafe"

	"github.com/hmc-go/hmc/status"
)

// cmaChild, run when HMC_SHM_CMA_CHILD=1, exposes an ordinary Go slice (no memfd, never
// registered) and checks what a peer wrote into it.
func cmaChild() {
	if err := AllowPeerAccess(os.Getppid()); err != nil { // the test process, and nobody else
		fmt.Println("ERR", err)
		return
	}
	buf := make([]byte, 3<<20)
	for i := range buf {
		buf[i] = byte(i % 251)
	}
	fmt.Printf("ADDR %d %d\n", os.Getpid(), uintptr(unsafe.Pointer(&buf[0])))
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() { // "check N": are the first N bytes 0x77?
		var n int
		fmt.Sscanf(in.Text(), "check %d", &n)
		fmt.Println(bytes.Equal(buf[:n], bytes.Repeat([]byte{0x77}, n)))
	}
}

func TestCrossMemoryAttach(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "HMC_SHM_CMA_CHILD=1")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); _ = cmd.Wait() }()
	out := bufio.NewScanner(stdout)
	if !out.Scan() || !strings.HasPrefix(out.Text(), "ADDR ") {
		t.Fatalf("child said %q", out.Text())
	}
	var pid int
	var addr uintptr
	fmt.Sscanf(out.Text(), "ADDR %d %d", &pid, &addr)
	p, err := OpenProcess(pid)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 1000)
	if err := p.Read(got, addr+500); err != nil {
		if errors.Is(err, status.ErrUnsupported) {
			t.Skipf("the kernel refuses CMA here: %v", err)
		}
		t.Fatal(err)
	}
	for i, b := range got {
		if b != byte((500+i)%251) {
			t.Fatalf("byte %d = %d", i, b)
		}
	}
	const n = 2<<20 + 3
	if err := p.Write(addr, bytes.Repeat([]byte{0x77}, n)); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(stdin, "check %d\n", n)
	if !out.Scan() || out.Text() != "true" {
		t.Fatalf("child saw %q", out.Text())
	}
	// A bad remote address is a typed error, not a crash.
	if err := p.Write(1<<46, []byte{1}); !errors.Is(err, status.ErrOutOfRange) {
		t.Fatalf("bad address: %v", err)
	}
	if _, err := OpenProcess(0); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatal(err)
	}
}
