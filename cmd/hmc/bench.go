package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/hmc-go/hmc/bench"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/transport"
)

type benchFlags struct {
	transport, op, sizes, mem, bufMem, mode, plot, chunk string
	iters, warmup, lanes, window, shmWorkers             int
	duration, busyPoll                                   time.Duration
	verify, jsonOut, quiet, ucxAlloc, notify             bool
	serverIP, metrics                                    string
	dataPort, ctrlPort                                   int
	auth                                                 authFlags
}

func (f *benchFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.transport, "transport", "auto", "tcp|shm|ucx|rdma|auto")
	fl.StringVar(&f.op, "op", "put", "put|get|lat|pingpong (lat: blocking put round trips; pingpong: half round trip of puts answered by puts, as ucp_put_lat; both 8 bytes unless --sizes is given)")
	fl.StringVar(&f.sizes, "sizes", "8,4KiB,64KiB,1MiB,4MiB,16MiB", "transfer sizes (KiB/MiB/GiB or k/m/g = 1024-based, KB/MB/GB = 1000-based)")
	fl.IntVar(&f.iters, "iters", 0, "iterations per size (0: about 1 GiB per size, 20..20000, or --duration)")
	fl.DurationVar(&f.duration, "duration", 0, "time per size instead of --iters")
	fl.IntVar(&f.warmup, "warmup", 5, "untimed iterations per size")
	fl.IntVar(&f.lanes, "lanes", 0, "connections per peer (HMC num_chs; 0: transport default)")
	fl.StringVar(&f.chunk, "chunk", "", "transport chunk size: larger transfers are split across lanes (default: the transport's)")
	fl.IntVar(&f.shmWorkers, "shm-workers", 0, "copy goroutines per shared-memory endpoint (0: one per core, at most 8; 1: the caller alone)")
	fl.IntVar(&f.window, "window", 1, "transfers in flight for put/get (1: blocking)")
	fl.StringVar(&f.mem, "mem", "cpu", "where the source data lives: cpu|cuda|rocm")
	fl.StringVar(&f.bufMem, "buffer-mem", "cpu", "where the client's ConnBuffer lives: cpu|cuda|rocm (a device buffer: plain put/get, moved or staged by the transport)")
	fl.BoolVar(&f.notify, "notify", false, "with --op pingpong over tcp, wait for the peer's answer through the transport's write notification instead of polling memory (ucp_put_lat polls)")
	fl.BoolVar(&f.ucxAlloc, "ucx-alloc", true, "with --transport ucx, UCX allocates both ConnBuffers (ucp_mem_map ALLOCATE), as ucx_perftest does, so its shared-memory transports write straight into the target's; false: HMC's memfd buffers, registered")
	fl.StringVar(&f.mode, "mode", "", "uhm_app mode: uhm|rdma_cpu|g2h2g|serial (default: plain buffer-to-buffer op)")
	fl.BoolVar(&f.verify, "verify", false, "checksum every transfer at the target (untimed)")
	fl.BoolVar(&f.jsonOut, "json", false, "one JSON object per line instead of a table")
	fl.StringVar(&f.plot, "plot", "", "write a bandwidth-vs-size PNG chart to this file")
	fl.StringVar(&f.metrics, "metrics", "", "serve Prometheus metrics of the run's operations at http://ADDR/metrics, e.g. 127.0.0.1:9100")
	fl.BoolVar(&f.quiet, "quiet", false, "no progress bar (it is shown only when stderr is a terminal)")
	fl.DurationVar(&f.busyPoll, "busy-poll", 0, "spin on socket reads this long before parking, on both sides: lower latency, one busy core per lane (default 0; 100us with --op lat and pingpong)")
	f.auth.add(cmd)
}

func (f *benchFlags) config(cmd *cobra.Command) (bench.Config, error) {
	ct, err := transport.ParseConnType(f.transport)
	if err != nil {
		return bench.Config{}, err
	}
	sizes := f.sizes
	if (f.op == "lat" || f.op == "pingpong") && !cmd.Flags().Changed("sizes") {
		sizes = "8"
	}
	if (f.op == "lat" || f.op == "pingpong") && !cmd.Flags().Changed("busy-poll") {
		f.busyPoll = 100 * time.Microsecond // latency is measured polling, as ucx_perftest does
	}
	sz, err := bench.ParseSizes(sizes)
	if err != nil {
		return bench.Config{}, err
	}
	mt, err := memory.ParseType(f.mem)
	if err != nil {
		return bench.Config{}, err
	}
	bt, err := memory.ParseType(f.bufMem)
	if err != nil {
		return bench.Config{}, err
	}
	var chunk uint64
	if f.chunk != "" {
		if chunk, err = bench.ParseSize(f.chunk); err != nil {
			return bench.Config{}, err
		}
	}
	a, err := f.auth.config()
	if err != nil {
		return bench.Config{}, err
	}
	cfg := bench.Config{Transport: ct, Op: f.op, Mode: f.mode, Sizes: sz, Iters: f.iters, Duration: f.duration,
		Warmup: f.warmup, Lanes: f.lanes, Chunk: chunk, BusyPoll: f.busyPoll, SHMWorkers: f.shmWorkers, Window: f.window, Mem: mt, BufferMem: bt, UCXAlloc: f.ucxAlloc, UCXSpin: ucxSpinFromEnv(), Verify: f.verify, Notify: f.notify, Auth: a}
	// Everything is checked before a server child starts or a byte is allocated.
	if err := cfg.Validate(); err != nil {
		return bench.Config{}, err
	}
	if f.plot != "" {
		if err := writable(f.plot); err != nil {
			return bench.Config{}, fmt.Errorf("--plot %s: %w", f.plot, err)
		}
	}
	return cfg, nil
}

// writable checks, before a run, that a file can be written at path (its directory exists and
// lets us create files), without leaving anything behind.
func writable(path string) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, ".hmc-write-check-*")
	if err != nil {
		return fmt.Errorf("cannot write in %s: %w", dir, err)
	}
	name := f.Name()
	_ = f.Close()
	return os.Remove(name)
}

// clientRunE builds a client command's RunE: parse the flags, let peer point the config at a
// server (and return what stops it), run the client until done or interrupted.
func (f *benchFlags) clientRunE(peer func(context.Context, *bench.Config) (func(), error)) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, _ []string) error {
		cfg, err := f.config(cmd)
		if err != nil {
			return err
		}
		ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
		defer stop()
		m, stopMetrics, err := startMetrics(ctx, f.metrics, cmd.ErrOrStderr())
		if err != nil {
			return err
		}
		defer stopMetrics()
		if m != nil {
			cfg.Observer = m
		}
		done, err := peer(ctx, &cfg)
		if err != nil {
			return err
		}
		defer done()
		return runClient(ctx, cmd.OutOrStdout(), cfg, f)
	}
}

func benchCmd() *cobra.Command {
	var f benchFlags
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure transfers: with no role, starts a server child and runs the client against it on 127.0.0.1",
		RunE: f.clientRunE(func(ctx context.Context, cfg *bench.Config) (func(), error) {
			srv, err := startServerChild(ctx, f.transport, slices.Max(cfg.Sizes), f.busyPoll, f.ucxAlloc, f.auth.args())
			if err != nil {
				return nil, err
			}
			cfg.PeerIP, cfg.DataPort, cfg.CtrlPort = "127.0.0.1", srv.dataPort, srv.ctrlPort
			return srv.stop, nil
		}),
	}
	f.add(cmd)
	cmd.AddCommand(serverCmd(), clientCmd())
	return cmd
}

func clientCmd() *cobra.Command {
	var f benchFlags
	cmd := &cobra.Command{
		Use:   "client",
		Short: "Run the benchmark client against `hmc bench server` on another host",
		RunE: f.clientRunE(func(_ context.Context, cfg *bench.Config) (func(), error) {
			cfg.PeerIP, cfg.DataPort, cfg.CtrlPort = f.serverIP, f.dataPort, f.ctrlPort
			return func() {}, nil
		}),
	}
	f.add(cmd)
	cmd.Flags().StringVar(&f.serverIP, "server-ip", "127.0.0.1", "the server's IP")
	cmd.Flags().IntVar(&f.dataPort, "data-port", 2025, "the server's data port")
	cmd.Flags().IntVar(&f.ctrlPort, "ctrl-port", 2028, "the server's control port")
	return cmd
}

func serverCmd() *cobra.Command {
	var (
		bind, tr, bufSize  string
		dataPort, ctrlPort int
		busyPoll           time.Duration
		ucxAlloc, keep     bool
		child              bool // started by `hmc bench` itself: its parent reports, not it
		af                 authFlags
	)
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Serve a buffer for `hmc bench client` (prints READY <data-addr> <ctrl-port> when listening); one client, then exit, unless --keep-serving",
		RunE: func(cmd *cobra.Command, _ []string) error {
			ct, err := transport.ParseConnType(tr)
			if err != nil {
				return err
			}
			size, err := bench.ParseSize(bufSize)
			if err != nil {
				return err
			}
			a, err := af.config()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			out := cmd.OutOrStdout()
			for {
				err := bench.Serve(ctx, bench.ServerConfig{BindIP: bind, DataPort: dataPort, CtrlPort: ctrlPort, BufferSize: size, Transport: ct, BusyPoll: busyPoll, UCXAlloc: ucxAlloc, UCXSpin: ucxSpinFromEnv(), Auth: a},
					func(addr string, cp int) { fmt.Fprintf(out, "READY %s %d\n", addr, cp) })
				if err != nil || !keep || ctx.Err() != nil {
					if err == nil && ctx.Err() == nil && !child {
						fmt.Fprintln(cmd.ErrOrStderr(), "hmc bench server: the client is done; exiting (--keep-serving serves the next one)")
					}
					return err
				}
				fmt.Fprintln(cmd.ErrOrStderr(), "hmc bench server: the client is done; serving the next (Ctrl-C stops)")
			}
		},
	}
	cmd.Flags().BoolVar(&child, "child", false, "started by `hmc bench` (no messages of its own)")
	_ = cmd.Flags().MarkHidden("child")
	cmd.Flags().BoolVar(&keep, "keep-serving", false, "serve clients one after another until interrupted (default: exit after the first)")
	cmd.Flags().StringVar(&bind, "bind", "127.0.0.1", "address to listen on")
	cmd.Flags().IntVar(&dataPort, "data-port", 2025, "data port (0: any)")
	cmd.Flags().IntVar(&ctrlPort, "ctrl-port", 2028, "control port (0: any)")
	cmd.Flags().StringVar(&tr, "transport", "auto", "tcp|shm|ucx|rdma|auto")
	cmd.Flags().StringVar(&bufSize, "buffer", "256MiB", "buffer size (at least the largest transfer)")
	cmd.Flags().DurationVar(&busyPoll, "busy-poll", 0, "spin on socket reads this long before parking")
	cmd.Flags().BoolVar(&ucxAlloc, "ucx-alloc", true, "with --transport ucx, UCX allocates the buffer (as the client's --ucx-alloc)")
	af.add(cmd)
	return cmd
}

type serverChild struct {
	cmd                *exec.Cmd
	dataPort, ctrlPort int
	done               chan error
}

// startServerChild runs `hmc bench server` as a child process on free loopback ports.
func startServerChild(ctx context.Context, tr string, maxSize uint64, busyPoll time.Duration, ucxAlloc bool, authArgs []string) (*serverChild, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	bufSize := max(maxSize, 1<<20)
	cmd := childCommand(ctx, exe, "bench", "server", "--bind", "127.0.0.1", "--data-port", "0", "--ctrl-port", "0",
		"--transport", tr, "--buffer", strconv.FormatUint(bufSize, 10), "--busy-poll", busyPoll.String(), "--ucx-alloc="+strconv.FormatBool(ucxAlloc), "--child")
	cmd.Args = append(cmd.Args, authArgs...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &serverChild{cmd: cmd, done: make(chan error, 1)}
	ready := make(chan string, 1)
	go func() { // owned by s: ends when the child's stdout closes, before Wait returns
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "READY ") {
				ready <- sc.Text()
			}
		}
		_, _ = io.Copy(io.Discard, out)
		s.done <- cmd.Wait()
	}()
	select {
	case line := <-ready:
		var addr string
		if _, err := fmt.Sscanf(line, "READY %s %d", &addr, &s.ctrlPort); err != nil {
			s.stop()
			return nil, fmt.Errorf("bench: server said %q: %w", line, err)
		}
		_, p, _ := net.SplitHostPort(addr)
		s.dataPort, _ = strconv.Atoi(p)
		return s, nil
	case err := <-s.done:
		return nil, fmt.Errorf("bench: server child exited before listening: %v", err)
	case <-time.After(30 * time.Second):
		s.stop()
		return nil, fmt.Errorf("bench: server child did not start within 30 s")
	}
}

func (s *serverChild) stop() {
	select {
	case <-s.done:
		return
	case <-time.After(5 * time.Second): // it exits by itself after the client's exit command
	}
	_ = s.cmd.Process.Kill()
	<-s.done
}

func runClient(ctx context.Context, out io.Writer, cfg bench.Config, f *benchFlags) error {
	var bar *progressbar.ProgressBar
	// The bar redraws itself with \r: only on a terminal, never into a log file or a pipe.
	if !f.quiet && !f.jsonOut && term.IsTerminal(int(os.Stderr.Fd())) {
		cfg.Progress = func(size uint64, i, n int) {
			if i == 1 {
				if bar != nil {
					_ = bar.Finish()
				}
				total := int64(n)
				if n == 0 {
					total = -1
				}
				bar = progressbar.NewOptions64(total, progressbar.OptionSetWriter(os.Stderr),
					progressbar.OptionSetDescription(bench.FormatSize(size)), progressbar.OptionClearOnFinish(),
					progressbar.OptionThrottle(100*time.Millisecond))
			}
			_ = bar.Add(1)
		}
	}
	table := bench.NewTable(out)
	var results []bench.Result
	err := bench.Run(ctx, cfg, func(r bench.Result) {
		if bar != nil {
			_ = bar.Finish()
			bar = nil
		}
		results = append(results, r)
		if r.Unsteady != "" {
			fmt.Fprintf(os.Stderr, "hmc bench: %s %s: not steady: %s\n", r.Op, bench.FormatSize(r.Size), r.Unsteady)
		}
		if f.jsonOut {
			_ = bench.WriteJSON(out, r)
		} else {
			table.Add(r)
		}
	})
	if err != nil {
		return err
	}
	if f.plot != "" {
		title := fmt.Sprintf("hmc bench --transport %s --op %s %s", f.transport, cfg.Op, cfg.Mode)
		if err := bench.Plot(f.plot, title, results); err != nil {
			return fmt.Errorf("plot: %w", err)
		}
	}
	return nil
}

// ucxSpinFromEnv is HMC_UCX_SPIN_US, the UCX busy-poll time in µs (0: the transport's default).
func ucxSpinFromEnv() int {
	v, err := strconv.Atoi(os.Getenv("HMC_UCX_SPIN_US"))
	if err != nil || v < 0 {
		return 0
	}
	return v
}
