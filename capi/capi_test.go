//go:build cgo

package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hmc-go/hmc/internal/childtest"
)

// cExample builds libhmc.so and examples/<name>.c against include/hmc.h with cc (skipping
// without one) and returns the program and a context bounding the test.
func cExample(t *testing.T, name string) (string, context.Context) {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skipf("no C compiler (cc) to build the C test: %v", err)
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	build := exec.CommandContext(ctx, "go", "build", "-buildmode=c-shared", "-o", filepath.Join(dir, "libhmc.so"), ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build -buildmode=c-shared: %v\n%s", err, out)
	}
	bin := filepath.Join(dir, name)
	compile := exec.CommandContext(ctx, cc, "-O1", "-Wall", "-Wextra", "-Werror", "-o", bin, "examples/"+name+".c",
		"-I", "include", "-L", dir, "-lhmc", "-Wl,-rpath,"+dir)
	if out, err := compile.CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	return bin, ctx
}

// TestCLibraryTwoProcesses builds libhmc.so, compiles the C example against include/hmc.h with cc, and
// runs it as two processes that exchange data and check every byte and error code.
func TestCLibraryTwoProcesses(t *testing.T) {
	bin, ctx := cExample(t, "pingpong")
	srv := exec.CommandContext(ctx, bin, "server")
	srv.Stderr = os.Stderr
	out, _ := srv.StdoutPipe()
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "READY ") {
		_ = srv.Process.Kill()
		_ = srv.Wait()
		t.Fatalf("server said %q", sc.Text())
	}
	f := strings.Fields(sc.Text())
	cli := exec.CommandContext(ctx, bin, "client", f[1], f[2])
	cliOut, err := cli.CombinedOutput()
	if err != nil {
		_ = srv.Process.Kill()
		_ = srv.Wait()
		t.Fatalf("client: %v\n%s", err, cliOut)
	}
	if err := srv.Wait(); err != nil {
		t.Fatalf("server: %v", err)
	}
	if !strings.Contains(string(cliOut), "all checks passed") {
		t.Fatalf("client output: %s", cliOut)
	}
}

// smemLib builds the library as libmf_smem.so (name and soname) in a temporary directory and
// returns the C compiler, the directory, the library and a context bounding the test.
func smemLib(t *testing.T) (cc, dir, lib string, ctx context.Context) {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skipf("no C compiler (cc): %v", err)
	}
	dir = t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	lib = filepath.Join(dir, "libmf_smem.so")
	build := exec.CommandContext(ctx, "go", "build", "-buildmode=c-shared", "-ldflags=-extldflags=-Wl,-soname,libmf_smem.so", "-o", lib, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return cc, dir, lib, ctx
}

// freeAddr returns a loopback address no one listens on now, for a rank process to bind.
func freeAddr(t *testing.T) string { return childtest.FreeAddr(t) }

// runRanks runs one command per rank (after the first, pausing first for it to serve the
// store) and fails unless every one exits 0 having printed "OK ".
func runRanks(t *testing.T, cmds []*exec.Cmd, first time.Duration) {
	t.Helper()
	type res struct {
		out []byte
		err error
	}
	results := make(chan res, len(cmds))
	for i, cmd := range cmds {
		go func() {
			out, err := cmd.CombinedOutput()
			results <- res{out, err}
		}()
		if i == 0 {
			time.Sleep(first)
		}
	}
	for range cmds {
		r := <-results
		if r.err != nil || !strings.Contains(string(r.out), "OK ") {
			t.Errorf("rank: %v\n%s", r.err, r.out)
		}
	}
}

// TestMemCacheDlopenFourProcesses builds the library as libmf_smem.so (name and soname), and
// runs MemCache's calls (capi/examples/memcache_bm.c, through dlopen and dlsym exactly as
// MemCache does) as 4 processes that write into, read from and check each other's slices.
func TestMemCacheDlopenFourProcesses(t *testing.T) {
	cc, dir, lib, ctx := smemLib(t)
	if out, err := exec.Command("readelf", "-d", lib).Output(); err == nil && !strings.Contains(string(out), "[libmf_smem.so]") {
		t.Errorf("soname: %s", out)
	}
	bin := filepath.Join(dir, "memcache_bm")
	compile := exec.CommandContext(ctx, cc, "-O1", "-Wall", "-Wextra", "-Werror", "-o", bin, "examples/memcache_bm.c", "-I", "include", "-ldl")
	if out, err := compile.CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	url := "tcp://" + freeAddr(t)
	const world = 4
	var cmds []*exec.Cmd
	for r := range world {
		cmd := exec.CommandContext(ctx, bin, url, strconv.Itoa(world), strconv.Itoa(r))
		cmd.Env = append(os.Environ(), "MF_SMEM_LIB="+lib)
		cmds = append(cmds, cmd)
	}
	runRanks(t, cmds, 200*time.Millisecond) // rank 0 serves the store; the others retry anyway
}

// TestSmemShmAndTransTwoProcesses links capi/examples/smem_faces.c against libmf_smem.so and
// runs Share Memory's set-up and control plane and the transfer engine across two processes.
func TestSmemShmAndTransTwoProcesses(t *testing.T) {
	cc, dir, _, ctx := smemLib(t)
	bin := filepath.Join(dir, "smem_faces")
	if out, err := exec.CommandContext(ctx, cc, "-O1", "-Wall", "-Wextra", "-Werror", "-o", bin, "examples/smem_faces.c", "-I", "include",
		"-L", dir, "-l:libmf_smem.so", "-Wl,-rpath,"+dir).CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	url, id0, id1 := "tcp://"+freeAddr(t), freeAddr(t), freeAddr(t)
	var cmds []*exec.Cmd
	for r := range 2 {
		cmds = append(cmds, exec.CommandContext(ctx, bin, url, strconv.Itoa(r), id0, id1))
	}
	runRanks(t, cmds, 0)
}

// TestKVPoolCTwoProcesses runs the pool's C face (examples/kv_pool.c) as two processes: one
// serves a master and lends a segment holding objects it put from gathered parts, the other
// reads them scattered, puts and reads its own, and checks Mooncake's codes.
func TestKVPoolCTwoProcesses(t *testing.T) {
	bin, ctx := cExample(t, "kv_pool")
	lender := exec.CommandContext(ctx, bin, "lend")
	lender.Stderr = os.Stderr
	in, _ := lender.StdinPipe()
	out, _ := lender.StdoutPipe()
	if err := lender.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lender.Process.Kill(); _ = lender.Wait() }()
	sc := bufio.NewScanner(out)
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "READY ") {
		t.Fatalf("lender said %q", sc.Text())
	}
	user := exec.CommandContext(ctx, bin, "use", strings.Fields(sc.Text())[1])
	userOut, err := user.CombinedOutput()
	if err != nil || !strings.Contains(string(userOut), "all checks passed") {
		t.Fatalf("user: %v\n%s", err, userOut)
	}
	_ = in.Close()
	if err := lender.Wait(); err != nil {
		t.Fatalf("lender: %v", err)
	}
}
