package bench

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/transporttest"
	"github.com/hmc-go/hmc/transport/ucx"
)

func TestParseSizes(t *testing.T) {
	got, err := ParseSizes("8, 4KiB,64k,1MiB,2MB,1GiB")
	want := []uint64{8, 4096, 65536, 1 << 20, 2e6, 1 << 30}
	if err != nil || len(got) != len(want) {
		t.Fatal(got, err)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%d: %d want %d", i, got[i], want[i])
		}
	}
	for _, bad := range []string{"", "0", "-1", "1TiB2", "x", "99999999999999GiB"} {
		if _, err := ParseSizes(bad); !errors.Is(err, status.ErrInvalidConfig) {
			t.Errorf("%q: %v", bad, err)
		}
	}
	if FormatSize(4<<20) != "4MiB" || FormatSize(1000) != "1000B" {
		t.Fatal("FormatSize")
	}
}

// TestServeAndRun runs the whole engine in one process: every op and mode, with --verify.
func TestServeAndRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cases := []Config{
		{Op: "put", Window: 1},
		{Op: "put", Window: 4},
		{Op: "get", Window: 3},
		{Op: "lat"},
		{Op: "pingpong"},
		{Op: "pingpong", Notify: true},
		{Op: "put", Mode: ModeUHM},
		{Op: "put", Mode: ModeRDMACPU},
		{Op: "put", Mode: ModeG2H2G},
		{Op: "put", Mode: ModeSerial},
	}
	for _, tr := range []transport.ConnType{transport.TCP, transport.AUTO} {
		for _, cfg := range cases {
			cfg.Transport = tr
			runCase(ctx, t, cfg)
		}
	}
	if err := Run(ctx, Config{Op: "put", Mode: "warp", Sizes: []uint64{1}}, nil); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatal(err)
	}
	if err := Run(ctx, Config{Op: "get", Mode: ModeUHM, Sizes: []uint64{1}}, nil); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatal(err)
	}
}

// The four uhm_app modes with the source in GPU memory (the emulation without a CUDA device:
// every access through the device copy functions), every transfer checksummed at the server.
func TestModesWithGPUSource(t *testing.T) {
	if memory.Probe(memory.NvidiaGPU) != nil {
		transporttest.EmulateGPU(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, mode := range []string{ModeUHM, ModeRDMACPU, ModeG2H2G, ModeSerial} {
		runCase(ctx, t, Config{Op: "put", Mode: mode, Transport: transport.AUTO, Mem: memory.NvidiaGPU})
	}
}

func runCase(ctx context.Context, t *testing.T, cfg Config) {
	name := cfg.Transport.String() + "-" + cfg.Op + "-" + cfg.Mode + "-" + cfg.Mem.String() + "-" + cfg.BufferMem.String()
	if cfg.UCXAlloc {
		name += "-ucxalloc"
	}
	if cfg.Notify {
		name += "-notify"
	}
	t.Run(name, func(t *testing.T) {
		ready := make(chan [2]any, 1)
		done := make(chan error, 1)
		go func() {
			done <- Serve(ctx, ServerConfig{BindIP: "127.0.0.1", BufferSize: 3 << 20, Transport: cfg.Transport, UCXAlloc: cfg.UCXAlloc},
				func(addr string, cp int) { ready <- [2]any{addr, cp} })
		}()
		r := <-ready
		cfg.PeerIP, cfg.DataPort, cfg.CtrlPort = "127.0.0.1", portOf(r[0].(string)), r[1].(int)
		cfg.Sizes, cfg.Iters, cfg.Warmup, cfg.Verify = []uint64{8, 4097, 3 << 20}, 5, 1, true
		if cfg.Mem == memory.Default {
			cfg.Mem = memory.CPU
		}
		var results []Result
		if err := Run(ctx, cfg, func(r Result) { results = append(results, r) }); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if len(results) != 3 || !results[2].Verified || results[2].GBps <= 0 || results[2].P99us < results[2].P50us {
			t.Fatalf("%+v", results)
		}
		if cfg.Op == "put" && cfg.Mode == ModeNone && cfg.Window == 4 {
			if err := Plot(filepath.Join(t.TempDir(), "p.png"), "t", results); err != nil {
				t.Fatal(err)
			}
		}
	})
}

func TestMain(m *testing.M) {
	if err := ucx.ExecWithoutErrorSignals(); err != nil { // a fault in UCX shows the Go stacks
		panic(err)
	}
	goleak.VerifyTestMain(m)
}

// Plain puts and gets of a GPU ConnBuffer (the emulation without a CUDA device), moved by the
// transport's own device path: TCP stages through its ring, SHM copies the device memory into the
// peer's mapping. Every transfer is checksummed.
func TestDeviceBuffer(t *testing.T) {
	if memory.Probe(memory.NvidiaGPU) != nil {
		transporttest.EmulateGPU(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, ct := range []transport.ConnType{transport.TCP, transport.SHM} {
		for _, op := range []string{"put", "get"} {
			runCase(ctx, t, Config{Op: op, Transport: ct, BufferMem: memory.NvidiaGPU, Window: 4})
		}
	}
	if err := Run(ctx, Config{Op: "put", Mode: ModeG2H2G, BufferMem: memory.NvidiaGPU, Sizes: []uint64{1}}, nil); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatal(err)
	}
}

// Bad flags are refused by Validate, before anything starts, with the flag named.
func TestConfigValidate(t *testing.T) {
	good := Config{Op: "put", Sizes: []uint64{8}}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	cases := map[string]func(*Config){
		"--iters":    func(c *Config) { c.Iters = -1 },
		"--duration": func(c *Config) { c.Duration = -1 },
		"--warmup":   func(c *Config) { c.Warmup = -1 },
		"--window":   func(c *Config) { c.Window = -1 },
		"--lanes":    func(c *Config) { c.Lanes = 1000 },
		"--sizes":    func(c *Config) { c.Sizes = []uint64{1 << 60} },
		"op":         func(c *Config) { c.Op = "puut" },
	}
	for flag, f := range cases {
		c := good
		f(&c)
		err := c.Validate()
		if !errors.Is(err, status.ErrInvalidConfig) || !strings.Contains(err.Error(), flag) {
			t.Errorf("%s: %v", flag, err)
		}
	}
	for _, s := range []string{"0", "-1", "1XB", ""} {
		if _, err := ParseSize(s); !errors.Is(err, status.ErrInvalidConfig) {
			t.Errorf("size %q: %v", s, err)
		}
	}
	if n, err := ParseSize("1TiB"); err != nil || n != 1<<40 {
		t.Errorf("1TiB: %d %v", n, err)
	}
}

// Latency results print no bandwidth (a note says what the times are) and plot p50/p99 by size.
func TestLatencyOutput(t *testing.T) {
	rs := []Result{{Transport: "tcp", Route: "tcp", Op: "lat", Size: 8, Iters: 10, P50us: 7, P99us: 20},
		{Transport: "tcp", Route: "tcp", Op: "lat", Size: 4096, Iters: 10, P50us: 9, P99us: 30}}
	var b strings.Builder
	tb := NewTable(&b)
	for _, r := range rs {
		tb.Add(r)
	}
	out := b.String()
	if !strings.HasPrefix(out, "# lat:") || strings.Contains(out, "0.000") {
		t.Fatalf("latency table:\n%s", out)
	}
	path := filepath.Join(t.TempDir(), "lat.png")
	if err := Plot(path, "lat", rs); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() == 0 {
		t.Fatalf("plot: %v", err)
	}
}

// A run says when it is too short to be steady: too little timed, too few steps, or early
// steps much slower than later ones; a long flat run is steady.
func TestUnsteady(t *testing.T) {
	flat := make([]time.Duration, 1000)
	for i := range flat {
		flat[i] = time.Millisecond
	}
	if why := unsteady(flat, time.Second); why != "" {
		t.Fatalf("flat 1 s run: %q", why)
	}
	if why := unsteady(flat[:100], 100*time.Millisecond); !strings.Contains(why, "under") {
		t.Fatalf("100 ms run: %q", why)
	}
	if why := unsteady(flat[:10], time.Second); !strings.Contains(why, "10 steps") {
		t.Fatalf("10 steps: %q", why)
	}
	ramp := slices.Clone(flat)
	for i := range 100 {
		ramp[i] = 3 * time.Millisecond
	}
	if why := unsteady(ramp, 1200*time.Millisecond); !strings.Contains(why, "ramp-up") {
		t.Fatalf("ramp-up: %q", why)
	}
}
