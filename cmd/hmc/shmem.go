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
	"github.com/hmc-go/hmc/transport"
)

func shmemCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "shmem", Short: "Share Memory: a symmetric heap with OpenSHMEM-grade host operations"}
	cmd.AddCommand(shmemBenchCmd(false), shmemBenchCmd(true))
	return cmd
}

func shmemBenchCmd(serve bool) *cobra.Command {
	var (
		storeURL, ops, sizes, plot string
		world, rank, iters, local  int
		jsonOut                    bool
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "put/get bandwidth by size, 8-byte put and fetch-add latency, barrier latency by team size",
		Long: `Runs rank 0 here (it measures against rank 1 and reports) and the other ranks as child
processes, unless --local-ranks says fewer (start the rest with "hmc shmem serve", same flags).`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			cfg := bench.ShmemConfig{Store: storeURL, World: world, Iters: iters}
			var err error
			if cfg.Sizes, err = bench.ParseSizes(sizes); err != nil {
				return err
			}
			if ops != "auto" {
				for _, o := range strings.Split(ops, ",") {
					k, err := transport.ParseConnType(o)
					if err != nil {
						return err
					}
					cfg.Kinds = append(cfg.Kinds, k)
				}
			}
			if serve {
				if storeURL == "" {
					return fmt.Errorf("--store is required")
				}
				return bench.ShmemRun(ctx, cfg, rank, func(bench.Result) {})
			}
			if cfg.Store == "" {
				srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{WorldSize: world})
				if err != nil {
					return err
				}
				defer srv.Close()
				cfg.Store = srv.URL()
			}
			if local < 0 {
				local = world
			}
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			cctx, cancel := context.WithCancel(ctx)
			var wg sync.WaitGroup
			defer func() { cancel(); wg.Wait() }()
			for r := 1; r < local; r++ {
				c := childCommand(cctx, exe, "shmem", "serve", "--store", cfg.Store, "--world", strconv.Itoa(world),
					"--rank", strconv.Itoa(r), "--ops", ops, "--sizes", sizes, "--iters", strconv.Itoa(iters))
				c.Stdout, c.Stderr = os.Stderr, os.Stderr
				if err := c.Start(); err != nil {
					return err
				}
				wg.Add(1)
				go func() { defer wg.Done(); _ = c.Wait() }()
			}
			table := bench.NewTable(cmd.OutOrStdout())
			var results []bench.Result
			cfg.Progress = func(s string) {
				if !jsonOut {
					fmt.Fprintln(cmd.ErrOrStderr(), "shmem bench:", s)
				}
			}
			rctx, rcancel := context.WithTimeout(ctx, 30*time.Minute)
			defer rcancel()
			err = bench.ShmemRun(rctx, cfg, 0, func(r bench.Result) {
				results = append(results, r)
				if jsonOut {
					_ = bench.WriteJSON(cmd.OutOrStdout(), r)
				} else {
					table.Add(r)
				}
			})
			if err != nil {
				return err
			}
			if plot != "" {
				var bw []bench.Result
				for _, r := range results {
					if r.Op == "put" {
						bw = append(bw, r)
					}
				}
				return bench.Plot(plot, "hmc shmem bench: put", bw)
			}
			return nil
		},
	}
	if serve {
		cmd.Use, cmd.Short, cmd.Long = "serve", "be a rank of `hmc shmem bench` (same flags, its --store)", ""
		cmd.Flags().IntVar(&rank, "rank", 1, "this process's rank (1..world-1)")
	} else {
		cmd.Flags().IntVar(&local, "local-ranks", -1, "ranks started on this host (default: all of --world)")
		cmd.Flags().BoolVar(&jsonOut, "json", false, "one JSON object per line instead of a table")
		cmd.Flags().StringVar(&plot, "plot", "", "write a put bandwidth-vs-size PNG chart to this file")
	}
	fl := cmd.Flags()
	fl.StringVar(&storeURL, "store", "", "config store URL (default: serve one on a free loopback port)")
	fl.IntVar(&world, "world", 2, "ranks")
	fl.StringVar(&ops, "ops", "shm,tcp", "transports in order: shm (co-located blocks mapped), tcp, ucx; auto = shm,tcp")
	fl.StringVar(&sizes, "sizes", "8,4KiB,64KiB,1MiB,4MiB", "put/get sizes")
	fl.IntVar(&iters, "iters", 0, "operations per measurement (0: up to 2000, about 1 GiB per size)")
	return cmd
}
