package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/hmc-go/hmc/bench"
	"github.com/hmc-go/hmc/coord/httpmeta"
	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/internal/etcdproc"
)

func storeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "store",
		Short: "The config store: serve it, or benchmark it and the group engine",
	}
	cmd.AddCommand(storeServeCmd(), storeBenchCmd())
	return cmd
}

func storeServeCmd() *cobra.Command {
	var listen, httpAddr, secretFile, cert, key, ca, metricsAddr string
	var world int
	var linkTimeout time.Duration
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run an embedded config store, or Mooncake's HTTP metadata server, until interrupted",
		Example: `  hmc store serve --listen tcp://127.0.0.1:7000 --world 8
  hmc store serve --http 127.0.0.1:8080      # Mooncake's HTTP metadata at http://127.0.0.1:8080/metadata
  hmc store serve --listen tcp://[::1]:7000 --secret-file job.secret
  hmc store serve --listen tcp://127.0.0.1:7000 --tls-cert store.pem --tls-key store.key --tls-ca ca.pem`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg := store.ServerConfig{WorldSize: world, LinkTimeout: linkTimeout,
				Logger: slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))}
			if secretFile != "" {
				var err error
				if cfg.Secret, err = readSecretFile(secretFile); err != nil {
					return err
				}
			}
			tcfg, err := store.TLSFromFiles(cert, key, ca, true)
			if err != nil {
				return err
			}
			cfg.TLS = tcfg
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if httpAddr != "" {
				web, err := httpmeta.Listen(httpAddr, "/metadata")
				if err != nil {
					return err
				}
				defer web.Close()
				fmt.Fprintln(cmd.OutOrStdout(), "serving", web.URL())
				if !cmd.Flags().Changed("listen") {
					<-ctx.Done() // the HTTP metadata server alone
					return nil
				}
			}
			m, stopMetrics, err := startMetrics(ctx, metricsAddr, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			defer stopMetrics()
			if m != nil {
				cfg.OnEvent = m.StoreEvent
			}
			srv, err := store.Listen(listen, cfg)
			if err != nil {
				return err
			}
			defer srv.Close()
			fmt.Fprintln(cmd.OutOrStdout(), "serving", srv.URL())
			<-ctx.Done()
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&listen, "listen", "tcp://127.0.0.1:7000", "tcp://ip:port (IPv6 in brackets; port 0 picks one)")
	fl.StringVar(&httpAddr, "http", "", "serve Mooncake's HTTP metadata protocol at http://ADDR/metadata (ip:port, port 0 picks one); alone unless --listen is given too")
	fl.IntVar(&world, "world", 0, "world size for ranks (0: the first ranked client's)")
	fl.StringVar(&metricsAddr, "metrics", "", "serve Prometheus metrics (rank events) at http://ADDR/metrics, e.g. 127.0.0.1:9100")
	fl.StringVar(&secretFile, "secret-file", "", "demand this shared secret from every client (HMAC challenge)")
	fl.StringVar(&cert, "tls-cert", "", "serve TLS 1.3 with this certificate (PEM)")
	fl.StringVar(&key, "tls-key", "", "the certificate's private key (PEM)")
	fl.StringVar(&ca, "tls-ca", "", "require client certificates signed by this CA (mutual TLS)")
	fl.DurationVar(&linkTimeout, "link-timeout", 8*time.Second, "drop a client silent this long (its rank is reported down)")
	return cmd
}

func storeBenchCmd() *cobra.Command {
	var etcdURL, clients, ranks string
	var startEtcd, noEmbedded, jsonOut bool
	var dur time.Duration
	var rounds int
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure store ops/s and barrier/allgather latency (embedded server and etcd, same run)",
		Example: `  hmc store bench --start-etcd
  hmc store bench --etcd etcd://127.0.0.1:2379 --ranks 8,64 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			cfg := bench.StoreConfig{Duration: dur, Rounds: rounds,
				Progress: func(what string) { fmt.Fprintln(cmd.ErrOrStderr(), "store bench:", what) }}
			var err error
			if cfg.Clients, err = ints(clients); err != nil {
				return err
			}
			if cfg.Ranks, err = ints(ranks); err != nil {
				return err
			}
			if !noEmbedded {
				cfg.Backends = append(cfg.Backends, bench.EmbeddedBackend())
			}
			if startEtcd {
				fmt.Fprintln(cmd.ErrOrStderr(), "store bench: starting a local etcd")
				url, stopEtcd, err := runLocalEtcd(ctx)
				if err != nil {
					return err
				}
				defer stopEtcd()
				etcdURL = url
			}
			if etcdURL != "" {
				cfg.Backends = append(cfg.Backends, bench.EtcdBackend(etcdURL))
			}
			if len(cfg.Backends) == 0 {
				return fmt.Errorf("nothing to measure: --no-embedded without --etcd or --start-etcd")
			}
			var rows []bench.StoreResult
			err = bench.StoreRun(ctx, cfg, func(r bench.StoreResult) {
				if jsonOut {
					_ = bench.WriteStoreJSON(cmd.OutOrStdout(), r)
				} else {
					fmt.Fprintf(cmd.ErrOrStderr(), "  %s %s done\n", r.Backend, r.Op)
				}
				rows = append(rows, r)
			})
			if !jsonOut {
				bench.WriteStoreTable(cmd.OutOrStdout(), rows)
			}
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&etcdURL, "etcd", "", "also measure this etcd cluster (etcd://host:port[,host:port]); a fresh namespace is used")
	fl.BoolVar(&startEtcd, "start-etcd", false, "start a one-member etcd (the etcd binary, loopback, temporary directory) and measure it")
	fl.BoolVar(&noEmbedded, "no-embedded", false, "do not measure the embedded server")
	fl.StringVar(&clients, "clients", "1,16", "concurrent clients for Set/Get/Add/CAS")
	fl.StringVar(&ranks, "ranks", "8,64,256", "group sizes for barrier/allgather (goroutine members)")
	fl.DurationVar(&dur, "duration", time.Second, "time per primitive op")
	fl.IntVar(&rounds, "rounds", 20, "timed barriers and allgathers per group size")
	fl.BoolVar(&jsonOut, "json", false, "one JSON object per line instead of a table")
	return cmd
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("bad count %q in %q", f, s)
		}
		out = append(out, n)
	}
	return out, nil
}

// runLocalEtcd starts a one-member etcd on free loopback ports in a temporary directory.
func runLocalEtcd(ctx context.Context) (string, func(), error) {
	dir, err := os.MkdirTemp("", "hmc-etcd-")
	if err != nil {
		return "", nil, err
	}
	c, err := etcdproc.Start(ctx, 1, dir, 30*time.Second)
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, fmt.Errorf("--start-etcd: %w", err)
	}
	return "etcd://" + c.Members[0].Client, func() { c.Stop(); _ = os.RemoveAll(dir) }, nil
}
