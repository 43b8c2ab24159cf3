//go:build cgo

package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCLibraryTwoProcesses builds libhmc.so, compiles the C example against include/hmc.h with cc, and
// runs it as two processes that exchange data and check every byte and error code.
func TestCLibraryTwoProcesses(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skipf("no C compiler (cc) to build the C test: %v", err)
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "go", "build", "-buildmode=c-shared", "-o", filepath.Join(dir, "libhmc.so"), ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build -buildmode=c-shared: %v\n%s", err, out)
	}
	bin := filepath.Join(dir, "pingpong")
	compile := exec.CommandContext(ctx, cc, "-O1", "-Wall", "-Wextra", "-Werror", "-o", bin, "examples/pingpong.c",
		"-I", "include", "-L", dir, "-lhmc", "-Wl,-rpath,"+dir)
	if out, err := compile.CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
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
