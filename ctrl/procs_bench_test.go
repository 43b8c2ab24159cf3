package ctrl

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

// roleEnv makes a re-executed test binary one side of the two-process round trip:
// "echo:tcp", "echo:<uds path>", "ping:<iters>:tcp:<port>" or "ping:<iters>:uds:<path>".
const roleEnv = "HMC_CTRL_BENCH"

// runChild runs the side roleEnv names, if any, and exits. It is called from TestMain, not
// from an init function: during initialisation the main goroutine is locked to the main
// thread, and every wake-up becomes a hand-off between threads (90 µs round trips, not 9).
func runChild() {
	role := os.Getenv(roleEnv)
	if role == "" {
		return
	}
	if err := benchChild(role); err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// benchChild runs one side. The echo (rank 0) answers every u64 from rank 1 with the same
// u64 until rank 1 hangs up; the pinger (rank 1) sends u64s one at a time, checks each answer
// and prints the median and mean round trip in microseconds.
func benchChild(role string) error {
	m, err := New(Config{})
	if err != nil {
		return err
	}
	defer m.Close()
	ctx := context.Background()
	if where, ok := strings.CutPrefix(role, "echo:"); ok {
		if where == "tcp" {
			err = m.Listen("127.0.0.1", 0, "")
		} else {
			err = m.Listen("", -1, where)
		}
		if err != nil {
			return err
		}
		port := 0
		if a := m.TCPAddr(); a != nil {
			port = a.Port
		}
		fmt.Println("READY", port)
		for {
			v, err := m.RecvU64(ctx, 1)
			if err != nil {
				return nil // the pinger hung up
			}
			if err := m.SendU64(ctx, 1, v); err != nil {
				return nil
			}
		}
	}
	var iters int
	var kind, where string
	parts := strings.SplitN(role, ":", 4)
	if len(parts) != 4 || parts[0] != "ping" {
		return fmt.Errorf("bad role %q", role)
	}
	_, _ = fmt.Sscan(parts[1], &iters)
	kind, where = parts[2], parts[3]
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if kind == "tcp" {
		err = m.DialTCP(dctx, 0, 1, "127.0.0.1:"+where)
	} else {
		err = m.DialUDS(dctx, 0, 1, where)
	}
	if err != nil {
		return err
	}
	lat := make([]time.Duration, 0, iters)
	start := time.Now()
	for i := -200; i < iters; i++ { // 200 warm-up rounds
		t0 := time.Now()
		if err := m.SendU64(dctx, 0, uint64(i)); err != nil {
			return err
		}
		v, err := m.RecvU64(dctx, 0)
		if err != nil || v != uint64(i) {
			return fmt.Errorf("echo %d: %d %v", i, v, err)
		}
		if i >= 0 {
			lat = append(lat, time.Since(t0))
		} else {
			start = time.Now()
		}
	}
	mean := time.Since(start) / time.Duration(max(iters, 1))
	slices.Sort(lat)
	fmt.Printf("RESULT %.2f %.2f\n", float64(lat[len(lat)/2].Nanoseconds())/1e3, float64(mean.Nanoseconds())/1e3)
	return nil
}

// cpusEnv places the two sides on CPUs: "E,P" runs the echo under taskset -c E and the
// pinger under taskset -c P (bench/compare-ctrl.sh's one and two placements); unset: where
// the scheduler puts them.
const cpusEnv = "HMC_CTRL_BENCH_CPUS"

// childCmd re-executes this test binary as side 0 (echo) or 1 (pinger), under taskset when
// cpusEnv names CPUs.
func childCmd(side int) *exec.Cmd {
	if cpus := strings.Split(os.Getenv(cpusEnv), ","); len(cpus) == 2 {
		return exec.Command("taskset", "-c", cpus[side], os.Args[0], "-test.run=^$")
	}
	return exec.Command(os.Args[0], "-test.run=^$")
}

// BenchmarkRoundTripProcesses is the control-plane round trip as users run it: a u64 from one
// process to another that sends it back (upstream HMC's tag exchange), over TCP and UDS. Both
// sides are fresh processes (the test binary re-executed); b.N round trips are timed by the
// pinger, which reports the median as p50-us. Compare with bench/peers/ctrl_pingpong.c, the
// same exchange in C.
func BenchmarkRoundTripProcesses(b *testing.B) {
	for _, tr := range []Transport{TCP, UDS} {
		b.Run(tr.String(), func(b *testing.B) {
			where := "tcp"
			if tr == UDS {
				where = UDSPathFor(b.TempDir(), 0)
			}
			echo := childCmd(0)
			echo.Env = append(os.Environ(), roleEnv+"=echo:"+where)
			echo.Stderr = os.Stderr
			out, err := echo.StdoutPipe()
			if err != nil {
				b.Fatal(err)
			}
			if err := echo.Start(); err != nil {
				b.Fatal(err)
			}
			defer func() { _ = echo.Process.Kill(); _ = echo.Wait() }()
			line, err := bufio.NewReader(out).ReadString('\n')
			if err != nil || !strings.HasPrefix(line, "READY ") {
				b.Fatalf("echo child: %q %v", line, err)
			}
			target := "uds:" + where
			if tr == TCP {
				target = "tcp:" + strings.TrimSpace(strings.TrimPrefix(line, "READY "))
			}
			ping := childCmd(1)
			ping.Env = append(os.Environ(), fmt.Sprintf("%s=ping:%d:%s", roleEnv, b.N, target))
			ping.Stderr = os.Stderr
			b.ResetTimer()
			res, err := ping.Output()
			b.StopTimer()
			var p50, mean float64
			if _, serr := fmt.Sscanf(string(res), "RESULT %f %f", &p50, &mean); err != nil || serr != nil {
				b.Fatalf("pinger: %q %v", res, err)
			}
			b.ReportMetric(p50, "p50-us")
			b.ReportMetric(mean*1e3, "ns/op")
		})
	}
}
