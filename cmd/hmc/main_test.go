package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	root := newRoot()
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

func TestInfoAndVersion(t *testing.T) {
	out, err := run(t, "info")
	if err != nil || !strings.Contains(out, "CPU                1      available") || !strings.Contains(out, "tcp") {
		t.Fatalf("%v\n%s", err, out)
	}
	if out, err := run(t, "version"); err != nil || !strings.HasPrefix(out, "hmc ") {
		t.Fatal(out, err)
	}
}

func TestBenchFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "--transport", "carrier-pigeon"},
		{"bench", "--sizes", "0"},
		{"bench", "--mem", "tpu"},
		{"bench", "server", "--buffer", "x"},
	} {
		if _, err := run(t, args...); err == nil {
			t.Errorf("%v: accepted", args)
		}
	}
}

func TestStoreBench(t *testing.T) {
	out, err := run(t, "store", "bench", "--clients", "2", "--ranks", "4", "--duration", "50ms", "--rounds", "2")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"embedded   set", "embedded   cas", "embedded   barrier", "embedded   allgather"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q row:\n%s", want, out)
		}
	}
	if _, err := run(t, "store", "bench", "--clients", "x"); err == nil {
		t.Error("bad --clients accepted")
	}
	if _, err := run(t, "store", "serve", "--listen", "udp://1.2.3.4:5"); err == nil {
		t.Error("bad --listen accepted")
	}
}

// HMC_CPUPROFILE, HMC_TRACE and HMC_MEMPROFILE write a CPU profile, an execution trace and an
// allocation profile when the command ends; without them nothing is written.
func TestProfile(t *testing.T) {
	for name, start := range map[string]func(string) func(){"cpu.prof": profile, "trace.out": traceTo, "allocs.prof": allocsTo} {
		start("")()
		path := filepath.Join(t.TempDir(), name)
		stop := start(path)
		stop()
		if fi, err := os.Stat(path); err != nil || fi.Size() == 0 {
			t.Fatalf("%s: %v", name, err)
		}
	}
}

// `hmc version` built from this checkout with VCS stamping names the module's pseudo-version
// and so the commit; the commit is the checkout's HEAD.
func TestVersionNamesTheCommit(t *testing.T) {
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skip("not a git checkout:", err)
	}
	bin := filepath.Join(t.TempDir(), "hmc")
	if out, err := exec.Command("go", "build", "-buildvcs=true", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if rev := strings.TrimSpace(string(head))[:12]; !strings.Contains(string(out), rev) || !strings.Contains(string(out), "v0.0.0-") {
		t.Fatalf("version %q does not name module version and commit %s", out, rev)
	}
}

// hmc kv bench runs a master, a lending client in a child process and puts and gets against
// it, beside the transfer engine's own write and read, and prints every column.
func TestKVBench(t *testing.T) {
	t.Setenv("HMC_TEST_AS_HMC", "1") // the lending child is this binary, standing in for hmc
	out, err := run(t, "kv", "bench", "--sizes", "64KiB,1MiB", "--duration", "200ms", "--clients", "2", "--batch", "4")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"put GB/s", "trans read GB/s", "get/read", "64KiB", "1MiB", "exist calls/s", "2 clients", "\n4 "} {
		if !strings.Contains(out, want) {
			t.Fatalf("no %q in\n%s", want, out)
		}
	}
	// The master as a process of its own.
	out, err = run(t, "kv", "bench", "--sizes", "64KiB", "--duration", "200ms", "--master-process")
	if err != nil || !strings.Contains(out, "64KiB") || !strings.Contains(out, "exist calls/s") {
		t.Fatalf("--master-process: %v\n%s", err, out)
	}
}
