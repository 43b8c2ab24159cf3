package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/hmc-go/hmc/bench"
	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/fabric/bm"
	"github.com/hmc-go/hmc/memory"
)

func bmCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bm",
		Short: "Big Memory: one global address space over many processes",
	}
	cmd.AddCommand(bmBenchCmd(), bmServeCmd())
	return cmd
}

type bmFlags struct {
	store, ops, types, sizes, slice, hbm, plot string
	world, localRanks, batch, iters, warm, id  int
	jsonOut, emulateGPU                        bool
}

func (f *bmFlags) add(cmd *cobra.Command, measuring bool) {
	fl := cmd.Flags()
	fl.StringVar(&f.store, "store", "", "config store URL (default: serve one on a free loopback port)")
	fl.IntVar(&f.world, "world", 2, "ranks in the object")
	fl.StringVar(&f.ops, "ops", "tcp", "data ops, comma-separated: tcp, shm (co-located ranks map each other's slices), rdma (UCX)")
	fl.StringVar(&f.slice, "slice", "256MiB", "DRAM slice per rank")
	fl.StringVar(&f.hbm, "hbm", "0", "HBM slice per rank (GPU memory; h2rd and rd2h need it)")
	fl.IntVar(&f.id, "id", 0, "object id")
	fl.BoolVar(&f.emulateGPU, "emulate-gpu", false, "emulate GPU memory in host memory when no CUDA device exists ("+memory.EmulateGPUEnv+"=1)")
	if !measuring {
		return
	}
	fl.IntVar(&f.localRanks, "local-ranks", -1, "ranks this command starts on this host (default: all of --world); start the others with `hmc bm serve`")
	fl.StringVar(&f.types, "types", "h2rh,rh2h,rh2rh,batch", "copy types: "+strings.Join(bench.BMTypes, ","))
	fl.StringVar(&f.sizes, "sizes", "4KiB,64KiB,1MiB,4MiB,16MiB", "block sizes")
	fl.IntVar(&f.batch, "batch", 1, "blocks per copy (more than 1: one CopyBatch of discrete blocks)")
	fl.IntVar(&f.iters, "iters", 0, "timed copies per size (0: about 256 MiB per size)")
	fl.IntVar(&f.warm, "warmup", 3, "untimed copies per size")
	fl.BoolVar(&f.jsonOut, "json", false, "one JSON object per line instead of a table")
	fl.StringVar(&f.plot, "plot", "", "write a bandwidth-vs-size PNG chart to this file")
}

func (f *bmFlags) config() (bench.BMConfig, error) {
	cfg := bench.BMConfig{Store: f.store, World: f.world, ID: f.id, Batch: f.batch, Iters: f.iters, Warm: f.warm}
	for _, o := range strings.Split(f.ops, ",") {
		switch strings.TrimSpace(strings.ToLower(o)) {
		case "tcp":
			cfg.Ops |= bm.OpHostTCP
		case "shm":
			cfg.Ops |= bm.OpHostSHM
		case "rdma", "ucx":
			cfg.Ops |= bm.OpHostRDMA
		default:
			return cfg, fmt.Errorf("--ops: %q (want tcp, shm, rdma)", o)
		}
	}
	var err error
	if cfg.Slice, err = bench.ParseSize(f.slice); err != nil {
		return cfg, err
	}
	if f.hbm != "0" && f.hbm != "" {
		if cfg.HBM, err = bench.ParseSize(f.hbm); err != nil {
			return cfg, err
		}
	}
	if f.sizes != "" {
		if cfg.Sizes, err = bench.ParseSizes(f.sizes); err != nil {
			return cfg, err
		}
	}
	if f.types != "" {
		cfg.Types = strings.Split(f.types, ",")
	}
	if f.emulateGPU {
		memory.SetEmulateGPU(true)
		os.Setenv(memory.EmulateGPUEnv, "1") // the rank children read it at start
	}
	return cfg, nil
}

func (f *bmFlags) args() []string {
	return []string{"--store", f.store, "--world", strconv.Itoa(f.world), "--ops", f.ops, "--slice", f.slice, "--hbm", f.hbm,
		"--id", strconv.Itoa(f.id), "--emulate-gpu=" + strconv.FormatBool(f.emulateGPU)}
}

func bmBenchCmd() *cobra.Command {
	var f bmFlags
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "measure Big Memory copies between ranks (upstream BmBenchmark's types)",
		Long: `Runs rank 0 here and measures copies against rank 1 (rh2rh: from rank 1 to rank 2 when the
world has three ranks): h2rh (H2G into a remote DRAM slice), rh2h (G2H), rh2rh (G2G between two
other ranks, forwarded to the source's owner), h2rd / rd2h (to and from remote HBM; --hbm), and
batch (a KV block of 61 x 128 KiB + 61 x 16 KiB discrete pieces as one CopyBatch, and the same
bytes as one contiguous copy). Ranks 1.. are started here as child processes unless
--local-ranks says fewer (start the rest with "hmc bm serve" on other hosts, same flags).`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			if f.store == "" {
				srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{WorldSize: f.world})
				if err != nil {
					return err
				}
				defer srv.Close()
				f.store = srv.URL()
			}
			cfg, err := f.config()
			if err != nil {
				return err
			}
			local := f.localRanks
			if local < 0 {
				local = f.world
			}
			var wg sync.WaitGroup
			errs := make(chan error, f.world)
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			cctx, cancel := context.WithCancel(ctx)
			defer func() { cancel(); wg.Wait() }()
			for r := 1; r < local; r++ {
				c := childCommand(cctx, exe, append([]string{"bm", "serve", "--rank", strconv.Itoa(r)}, f.args()...)...)
				c.Stdout, c.Stderr = os.Stderr, os.Stderr
				if err := c.Start(); err != nil {
					return err
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := c.Wait(); err != nil && cctx.Err() == nil {
						errs <- fmt.Errorf("rank %d: %w", r, err)
					}
				}()
			}
			cfg.Progress = func(s string) {
				if !f.jsonOut {
					fmt.Fprintln(cmd.ErrOrStderr(), "bm bench:", s)
				}
			}
			table := bench.NewTable(cmd.OutOrStdout())
			var results []bench.Result
			rctx, rcancel := context.WithTimeout(ctx, 30*time.Minute)
			defer rcancel()
			err = bench.BMRun(rctx, cfg, func(r bench.Result) {
				results = append(results, r)
				if f.jsonOut {
					_ = bench.WriteJSON(cmd.OutOrStdout(), r)
				} else {
					table.Add(r)
				}
			})
			if err != nil {
				return err
			}
			select {
			case err := <-errs:
				return err
			default:
			}
			if f.plot != "" {
				return bench.Plot(f.plot, "hmc bm bench ("+cfg.Ops.String()+")", results)
			}
			return nil
		},
	}
	f.add(cmd, true)
	return cmd
}

func bmServeCmd() *cobra.Command {
	var f bmFlags
	var rank int
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "be a passive rank of `hmc bm bench` (same flags, its --store)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.store == "" {
				return fmt.Errorf("--store is required")
			}
			cfg, err := f.config()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			return bench.BMServe(ctx, cfg, rank)
		},
	}
	f.add(cmd, false)
	cmd.Flags().IntVar(&rank, "rank", 1, "this process's rank (1..world-1)")
	return cmd
}
