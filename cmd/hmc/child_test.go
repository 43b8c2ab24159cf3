package main

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hmc-go/hmc/internal/childtest"
)

// A bench killed by a signal it cannot catch takes its target child with it: `hmc trans bench`
// (the initiator, here the test binary standing in for hmc) starts `trans bench --mode
// target`; SIGKILL the initiator and the target must exit within seconds rather than live on
// holding its port and the caller's output pipe.
func TestChildDiesWithParent(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	c := exec.Command(exe, "trans", "bench", "--protocol", "tcp", "--block-size", "4KiB", "--duration", "60s", "--buffer-size", "8MiB", "--contiguous-peer=false")
	childtest.Start(t, c, 64, "HMC_TEST_AS_HMC=1")
	var child int
	for deadline := time.Now().Add(30 * time.Second); child == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the bench started no target child within 30 s")
		}
		time.Sleep(50 * time.Millisecond)
		child = childOf(c.Process.Pid)
	}
	if err := c.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = c.Wait()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if err := syscall.Kill(child, 0); err == syscall.ESRCH || zombie(child) {
			return
		}
		if time.Now().After(deadline) {
			_ = syscall.Kill(child, syscall.SIGKILL)
			t.Fatalf("the target child %d outlived its killed initiator by 10 s", child)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// childOf returns a child process of pid (from /proc), or 0.
func childOf(pid int) int {
	p := strconv.Itoa(pid)
	tasks, _ := os.ReadDir("/proc/" + p + "/task")
	for _, task := range tasks {
		b, _ := os.ReadFile("/proc/" + p + "/task/" + task.Name() + "/children")
		if f := strings.Fields(string(b)); len(f) > 0 {
			n, _ := strconv.Atoi(f[0])
			return n
		}
	}
	return 0
}

// zombie reports whether pid has exited and awaits its reaper.
func zombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] == 'Z'
	}
	return false
}
