package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/hmc-go/hmc/bench"
	"github.com/hmc-go/hmc/fabric/trans"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/transport"
)

func transCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "trans", Short: "transfer engine: one-sided transfers between named peers"}
	cmd.AddCommand(transBenchCmd())
	return cmd
}

func transBenchCmd() *cobra.Command {
	var (
		mode, op, blocks, meta, target, local, protocol, buffer, plot, mem, pattern string
		peer                                                                        bool
		batch, threads                                                              int
		duration                                                                    time.Duration
		jsonOut, verify                                                             bool
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "measure batched transfers (Mooncake's transfer_engine_bench)",
		Long: `--mode target serves a buffer and prints its unique id; --mode initiator submits batches of
--batch-size requests of --block-size bytes to --segment-id from --threads goroutines for
--duration. Without --mode both run here: a target child process and the initiator.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			cfg := bench.TransConfig{Metadata: meta, LocalID: local, Target: target, Batch: batch, Threads: threads,
				Duration: duration, Verify: verify, Pattern: pattern, Peer: peer}
			switch op {
			case "write":
				cfg.Write = true
			case "read":
			default:
				return fmt.Errorf("--operation %q (want read or write)", op)
			}
			var err error
			if cfg.Buffer, err = bench.ParseSize(buffer); err != nil {
				return err
			}
			if cfg.Mem, err = memory.ParseType(mem); err != nil {
				return err
			}
			if cfg.Mem == memory.Default {
				cfg.Mem = memory.CPU
			}
			for _, p := range strings.Split(protocol, ",") {
				if p == "auto" {
					cfg.Kinds = nil
					break
				}
				k, err := transport.ParseConnType(p)
				if err != nil {
					return err
				}
				cfg.Kinds = append(cfg.Kinds, k)
			}
			sizes, err := bench.ParseSizes(blocks)
			if err != nil {
				return err
			}
			if mode == "target" {
				cfg.Ready = func(id string) { fmt.Fprintln(cmd.OutOrStdout(), "READY", id); os.Stdout.Sync() }
				return bench.TransServe(ctx, cfg)
			}
			if mode == "" && target == "" {
				child, id, err := startTransTarget(ctx, meta, protocol, buffer, mem)
				if err != nil {
					return err
				}
				defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
				cfg.Target = id
			} else if mode != "initiator" && mode != "" {
				return fmt.Errorf("--mode %q (want target or initiator)", mode)
			}
			if cfg.Target == "" {
				return fmt.Errorf("--segment-id (the target's unique id) is required with --mode initiator")
			}
			table := bench.NewTransTable(cmd.OutOrStdout())
			var results []bench.Result
			for _, size := range sizes {
				cfg.Block = size
				r, err := bench.TransRun(ctx, cfg)
				if err != nil {
					return err
				}
				results = append(results, r)
				if jsonOut {
					_ = bench.WriteJSON(cmd.OutOrStdout(), r)
				} else {
					table.Add(r)
				}
			}
			if plot != "" {
				return bench.Plot(plot, fmt.Sprintf("hmc trans bench (%s, batch %d)", op, batch), results)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&mode, "mode", "", "target | initiator (default: both here, the target as a child process)")
	fl.StringVar(&op, "operation", "write", "read | write")
	fl.StringVar(&blocks, "block-size", "64KiB", "bytes per request (a list sweeps)")
	fl.IntVar(&batch, "batch-size", 128, "requests per batch (not with --pattern kv)")
	fl.StringVar(&pattern, "pattern", bench.PatternScattered, "the batch's layout: scattered (no two blocks adjacent), contiguous (adjacent: merged into one transfer), kv (61 layers × a K and a V block, two pools)")
	fl.BoolVar(&peer, "contiguous-peer", true, "after each row, move the same bytes per batch as one contiguous transfer and print the ratio")
	fl.IntVar(&threads, "threads", 1, "batches in flight, one goroutine each")
	fl.DurationVar(&duration, "duration", 3*time.Second, "time per block size")
	fl.StringVar(&buffer, "buffer-size", "256MiB", "each side's buffer")
	fl.StringVar(&mem, "mem", "cpu", "each side's buffer memory: cpu, or cuda (device 0, registered as a GPU KV cache is)")
	fl.StringVar(&meta, "metadata-server", trans.P2P, "P2PHANDSHAKE, a tcp:// or etcd:// store (or host:port: etcd), http://host:port/path (Mooncake's HTTP metadata) or redis://host:port")
	fl.StringVar(&target, "segment-id", "", "the target's unique id (ip:port)")
	fl.StringVar(&local, "local-server-name", "127.0.0.1:0", "this engine's unique id (port 0: any)")
	fl.StringVar(&protocol, "protocol", "shm,tcp", "transports in order of preference: shm, tcp, ucx (auto: the default)")
	fl.BoolVar(&jsonOut, "json", false, "one JSON object per line instead of a table")
	fl.BoolVar(&verify, "verify", false, "read the target's bytes back once and check them (write)")
	fl.StringVar(&plot, "plot", "", "write a bandwidth-vs-block-size PNG chart to this file")
	return cmd
}

// startTransTarget runs `hmc trans bench --mode target` as a child and returns its unique id.
func startTransTarget(ctx context.Context, meta, protocol, buffer, mem string) (*exec.Cmd, string, error) {
	return startReadyChild(ctx, "trans bench: the target", "trans", "bench", "--mode", "target", "--metadata-server", meta,
		"--protocol", protocol, "--buffer-size", buffer, "--mem", mem)
}

// startReadyChild runs this binary with args as a child (stderr on ours) and returns it with
// what follows "READY " on the first such line of its output, waiting at most 30 s; what names
// the child in the error.
func startReadyChild(ctx context.Context, what string, args ...string) (*exec.Cmd, string, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, "", err
	}
	c := childCommand(ctx, exe, args...)
	c.Stderr = os.Stderr
	out, err := c.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	if err := c.Start(); err != nil {
		return nil, "", err
	}
	ready := make(chan string, 1)
	go func() { // ends when the child's stdout closes
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "READY "); ok {
				select {
				case ready <- rest:
				default:
				}
			}
		}
	}()
	select {
	case rest := <-ready:
		return c, rest, nil
	case <-time.After(30 * time.Second):
		_ = c.Process.Kill()
		_ = c.Wait()
		return nil, "", fmt.Errorf("%s did not start within 30 s", what)
	}
}
