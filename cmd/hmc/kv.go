package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"runtime"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/hmc-go/hmc/bench"
	"github.com/hmc-go/hmc/fabric/kv"
	"github.com/hmc-go/hmc/fabric/trans"
	"github.com/hmc-go/hmc/memory"
)

func kvCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "kv", Short: "the KV-cache pool (Mooncake Store's model): its master, a lending client, a benchmark"}
	cmd.AddCommand(kvMasterCmd(), kvLendCmd(), kvBenchCmd())
	return cmd
}

func kvMasterCmd() *cobra.Command {
	var (
		addr, storeURL, pool string
		lease, clientTTL     time.Duration
		high, evict          float64
	)
	cmd := &cobra.Command{
		Use:   "master",
		Short: "serve the pool's master (clients mount segments, put and get through it)",
		Long: `Serves the pool's master on --addr. With --store (tcp://… or etcd://…), the master keeps the
pool's state in that config store and joins the pool's other masters there: one leads (its
address is in the store, where clients given the store's URL as their master find it), the
others stand by and take over, with every segment and object, when the leader's rank goes down.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			mc := kv.MasterConfig{LeaseTTL: lease, HighWatermark: high, EvictRatio: evict}
			sc := kv.ServerConfig{Addr: addr, ClientTTL: clientTTL}
			if storeURL != "" {
				h, err := kv.StartHA(ctx, kv.HAConfig{Store: storeURL, Pool: pool, Master: mc, Server: sc})
				if err != nil {
					return err
				}
				defer h.Close()
				fmt.Fprintln(cmd.OutOrStdout(), "READY", storeURL, pool)
				<-ctx.Done()
				return nil
			}
			m := kv.NewMaster(mc)
			srv, err := kv.Serve(m, sc)
			if err != nil {
				return err
			}
			defer srv.Close()
			fmt.Fprintln(cmd.OutOrStdout(), "READY", srv.Addr())
			<-ctx.Done()
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&addr, "addr", "127.0.0.1:50051", "address clients reach the master at (port 0: any)")
	fl.StringVar(&storeURL, "store", "", "keep the pool's state in this config store and lead or stand by there (tcp://… or etcd://…)")
	fl.StringVar(&pool, "pool", "default", "the pool's name in the store")
	fl.DurationVar(&lease, "lease-ttl", 5*time.Second, "how long a get pins an object against removal and eviction")
	fl.DurationVar(&clientTTL, "client-ttl", 10*time.Second, "a client silent this long is dead: its segments leave the pool")
	fl.Float64Var(&high, "high-watermark", 0.95, "fraction of the pool's space above which puts evict")
	fl.Float64Var(&evict, "evict-ratio", 0.05, "fraction of the pool's space an eviction frees")
	return cmd
}

func kvLendCmd() *cobra.Command {
	var master, segment, host, mem string
	var device int
	cmd := &cobra.Command{
		Use:   "lend",
		Short: "join the pool as a client that lends a segment of its memory, and stay",
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			size, err := bench.ParseSize(segment)
			if err != nil {
				return err
			}
			mt, err := memory.ParseType(mem)
			if err != nil {
				return err
			}
			c, err := kv.NewClient(ctx, kv.ClientConfig{Master: master, SegmentSize: size, UniqueID: hostPort(host), SegmentMemory: mt, SegmentDevice: device})
			if err != nil {
				return err
			}
			defer c.Close()
			fmt.Fprintln(cmd.OutOrStdout(), "READY", c.ID())
			_ = os.Stdout.Sync()
			<-ctx.Done()
			return nil
		},
	}
	cmd.Flags().StringVar(&master, "master", "127.0.0.1:50051", "the master's address, or the masters' store (tcp://…, etcd://…)")
	cmd.Flags().StringVar(&segment, "segment-size", "1GiB", "memory lent to the pool")
	cmd.Flags().StringVar(&host, "local-hostname", "127.0.0.1", "the address peers reach this client's segment at (ip or ip:port)")
	cmd.Flags().StringVar(&mem, "segment-mem", "cpu", "where the segment lives: cpu, or a device's memory (cuda, hip)")
	cmd.Flags().IntVar(&device, "device", 0, "the device of a device segment")
	return cmd
}

// hostPort is h with port 0 when it has none.
func hostPort(h string) string {
	if _, _, err := net.SplitHostPort(h); err == nil {
		return h
	}
	return net.JoinHostPort(h, "0")
}

func kvBenchCmd() *cobra.Command {
	var (
		sizes, host string
		duration    time.Duration
		batch       int
		external    bool
		clients     int
		masterProc  bool
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "put and get against a lending client in another process, beside the transfer engine's write and read of the same bytes",
		Long: `A master runs here and a lending client ("hmc kv lend") as a child process; this process, a
client without a segment, puts objects (one replica, in the child's segment) and gets them,
then writes and reads the same bytes at one replica with the transfer engine alone, and times
metadata operations (exist) on the master. With --clients N, N clients (each with its own
transfer engine) put, get and call the master at once, and the rows sum them. With --batch N,
a second table puts and gets N objects per call (batch_put_from / batch_get_into: one master
call and one transfer batch) beside the transfer engine's batch write and read of the same
replicas.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			list, err := bench.ParseSizes(sizes)
			if err != nil {
				return err
			}
			var m *kv.Master
			var masterAddr string
			if masterProc { // the master in a process of its own, as deployments run it
				if external {
					return fmt.Errorf("kv bench: --master-process and --external-lender together")
				}
				mp, addr, err := startReadyChild(ctx, "kv bench: the master", "kv", "master", "--addr", hostPort(host), "--lease-ttl", benchLease.String())
				if err != nil {
					return err
				}
				defer func() { _ = mp.Process.Kill(); _ = mp.Wait() }()
				masterAddr = addr
			} else {
				m = kv.NewMaster(kv.MasterConfig{LeaseTTL: benchLease})
				srv, err := kv.Serve(m, kv.ServerConfig{Addr: hostPort(host)})
				if err != nil {
					return err
				}
				defer srv.Close()
				masterAddr = srv.Addr()
			}
			if external {
				fmt.Fprintln(cmd.OutOrStdout(), "MASTER", masterAddr) // start: hmc kv lend --master <addr>
				_ = os.Stdout.Sync()
				deadline := time.Now().Add(60 * time.Second)
				for m.Stats().Segments == 0 {
					if time.Now().After(deadline) {
						return fmt.Errorf("kv bench: no client lent a segment to %s within 60 s", masterAddr)
					}
					time.Sleep(50 * time.Millisecond)
				}
			} else {
				child, _, err := startReadyChild(ctx, "kv bench: the lending client", "kv", "lend", "--master", masterAddr, "--segment-size", "1GiB", "--local-hostname", host)
				if err != nil {
					return err
				}
				defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
			}
			if clients < 1 {
				return fmt.Errorf("kv bench: --clients %d (at least 1)", clients)
			}
			var cs []*kv.Client
			for range clients {
				c, err := kv.NewClient(ctx, kv.ClientConfig{Master: masterAddr, UniqueID: hostPort(host)})
				if err != nil {
					return err
				}
				defer c.Close()
				cs = append(cs, c)
			}
			c := cs[0]
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 4, 0, 2, ' ', 0)
			fmt.Fprintln(w, "size\tput GB/s\ttrans write GB/s\tput/write\tget GB/s\ttrans read GB/s\tget/read")
			for _, size := range list {
				r, err := kvBenchSize(ctx, cs, size, duration)
				if err != nil {
					return err
				}
				fmt.Fprintf(w, "%s\t%.3f\t%.3f\t%.2f\t%.3f\t%.3f\t%.2f\n", bench.FormatSize(size), r[0], r[1], r[0]/r[1], r[2], r[3], r[2]/r[3])
			}
			_ = w.Flush()
			if batch > 0 {
				fmt.Fprintf(w, "\nbatch\tsize\tput GB/s\ttrans write GB/s\tput/write\tget GB/s\ttrans read GB/s\tget/read\n")
				for _, size := range list {
					r, err := kvBenchBatch(ctx, c, size, batch, duration)
					if err != nil {
						return err
					}
					fmt.Fprintf(w, "%d\t%s\t%.3f\t%.3f\t%.2f\t%.3f\t%.3f\t%.2f\n", batch, bench.FormatSize(size), r[0], r[1], r[0]/r[1], r[2], r[3], r[2]/r[3])
				}
				_ = w.Flush()
			}
			ops, err := kvPar(cs, func(_ int, c *kv.Client) (int, error) { return kvMetaOps(ctx, c, duration) })
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "metadata: %.0f exist calls/s (%d clients at once, each one call at a time)\n", ops, len(cs))
			return nil
		},
	}
	cmd.Flags().StringVar(&sizes, "sizes", "4KiB,64KiB,4MiB", "object sizes (a list)")
	cmd.Flags().DurationVar(&duration, "duration", 2*time.Second, "time per measurement")
	cmd.Flags().IntVar(&batch, "batch", 0, "objects per batch call in a second table (0: none)")
	cmd.Flags().BoolVar(&masterProc, "master-process", false, "run the master as a process of its own (as deployments do) instead of in this one")
	cmd.Flags().IntVar(&clients, "clients", 1, "clients putting and getting at once in the first table (each with its own engine and objects; the rows sum them)")
	cmd.Flags().StringVar(&host, "local-hostname", "127.0.0.1", "the address of the master and this client (and the child's)")
	cmd.Flags().BoolVar(&external, "external-lender", false, `print "MASTER <addr>" and wait for a lending client started elsewhere (another namespace or host) instead of a child`)
	return cmd
}

// kvBenchBatch returns put, trans write, get and trans read GB/s for batches of count objects of
// size bytes, each batch one call (its objects scattered over one local buffer).
func kvBenchBatch(ctx context.Context, c *kv.Client, size uint64, count int, d time.Duration) ([4]float64, error) {
	var r [4]float64
	if uint64(count)*size > 256<<20 {
		return r, fmt.Errorf("kv bench: a batch of %d objects of %s is over 256 MiB (the lent segment is 1 GiB)", count, bench.FormatSize(size))
	}
	stride := size + 4096 // the objects are not adjacent in local memory
	local := make([]byte, stride*uint64(count))
	for i := range local {
		local[i] = byte(i * 13)
	}
	items := func(round int) []kv.Item {
		it := make([]kv.Item, count)
		for i := range it {
			off := uint64(i) * stride
			it[i] = kv.Item{Key: fmt.Sprintf("batch-%d-%d-%d", size, round, i), Parts: []kv.Span{kv.SpanOf(local[off : off+size])}}
		}
		return it
	}
	rate := func(n int, el time.Duration) float64 { return float64(uint64(n*count)*size) / el.Seconds() / 1e9 }
	var rounds [][]kv.Item
	start := time.Now()
	for len(rounds) == 0 || time.Since(start) < d && uint64(len(rounds)+1)*uint64(count)*size <= 512<<20 {
		it := items(len(rounds))
		for _, err := range c.BatchPut(ctx, it, kv.PutOptions{Replicas: 1}) {
			if err != nil {
				return r, err
			}
		}
		rounds = append(rounds, it)
	}
	r[0] = rate(len(rounds), time.Since(start))
	// The same replicas, moved by the transfer engine alone: one batch per round.
	peer, reqs := "", make([][]trans.Request, len(rounds))
	for k, it := range rounds {
		for _, x := range it {
			reps, err := c.Replicas(ctx, x.Key)
			if err != nil {
				return r, err
			}
			peer = reps[0].Client
			reqs[k] = append(reqs[k], trans.Request{Op: trans.Write, Local: x.Parts[0].Addr, Remote: reps[0].Addr, Size: size})
		}
	}
	e := c.Engine()
	move := func(op trans.Opcode) (float64, error) {
		n := 0
		start := time.Now()
		for ; time.Since(start) < d; n++ {
			q := reqs[n%len(reqs)]
			for i := range q {
				q[i].Op = op
			}
			if err := e.Transfer(ctx, peer, q, nil); err != nil {
				return 0, err
			}
		}
		return rate(n, time.Since(start)), nil
	}
	var err error
	if r[1], err = move(trans.Write); err != nil {
		return r, err
	}
	n := 0
	for start = time.Now(); time.Since(start) < d; n++ {
		_, errs := c.BatchGet(ctx, rounds[n%len(rounds)])
		for _, err := range errs {
			if err != nil {
				return r, err
			}
		}
	}
	r[2] = rate(n, time.Since(start))
	if r[3], err = move(trans.Read); err != nil {
		return r, err
	}
	runtime.KeepAlive(local)
	_, err = c.RemoveAll(ctx, true)
	return r, err
}

// benchLease is the bench master's lease: short, so that the objects of one size can be
// removed soon after their gets.
const benchLease = 200 * time.Millisecond

// kvBenchSize returns put, trans write, get and trans read GB/s for objects of size bytes, the
// clients all at once (each on its own objects), summed.
func kvBenchSize(ctx context.Context, cs []*kv.Client, size uint64, d time.Duration) ([4]float64, error) {
	var r [4]float64
	val := make([]byte, size)
	for i := range val {
		val[i] = byte(i * 7)
	}
	quota := (512 << 20) / uint64(len(cs))                                   // bytes of objects per client
	par := func(f func(i int, c *kv.Client) (int, error)) (float64, error) { // GB/s of the objects counted
		n, err := kvPar(cs, f)
		return n * float64(size) / 1e9, err
	}
	// An untimed pass first: the first write into a peer's page takes a page fault in the
	// writer (3 GB/s first touch against 25 warm, in C on the 2-vCPU VM), and the engine's rows
	// below write pages the puts touched. Both sides are timed on the same, warm, memory; the
	// second pass's puts land where the first's did (the allocator is first fit).
	if _, err := par(func(i int, c *kv.Client) (int, error) {
		for j := 0; uint64(j+1)*size <= quota; j++ {
			if err := c.Put(ctx, fmt.Sprintf("warm-%d-%d-%d", size, i, j), val, 1); err != nil {
				return j, err
			}
		}
		return 0, nil
	}); err != nil {
		return r, err
	}
	if _, err := cs[0].RemoveAll(ctx, true); err != nil {
		return r, err
	}
	keys := make([][]string, len(cs))
	var err error
	if r[0], err = par(func(i int, c *kv.Client) (int, error) {
		start := time.Now()
		for time.Since(start) < d && uint64(len(keys[i])+1)*size <= quota {
			k := fmt.Sprintf("bench-%d-%d-%d", size, i, len(keys[i]))
			if err := c.Put(ctx, k, val, 1); err != nil {
				return len(keys[i]), err
			}
			keys[i] = append(keys[i], k)
		}
		return len(keys[i]), nil
	}); err != nil {
		return r, err
	}
	// The transfer engine's peer rows write and read the same replicas, in the same order: the
	// same memory, so that neither side is timed on hotter caches than the other.
	at := make([][]kv.Buffer, len(cs))
	for i, c := range cs {
		for _, k := range keys[i] {
			reps, err := c.Replicas(ctx, k)
			if err != nil {
				return r, err
			}
			at[i] = append(at[i], reps[0])
		}
	}
	cycle := func(do func(i int, c *kv.Client, n int) error) func(int, *kv.Client) (int, error) {
		return func(i int, c *kv.Client) (int, error) {
			n := 0
			for start := time.Now(); time.Since(start) < d; n++ {
				if err := do(i, c, n); err != nil {
					return n, err
				}
			}
			return n, nil
		}
	}
	if r[1], err = par(cycle(func(i int, c *kv.Client, n int) error {
		b := at[i][n%len(at[i])]
		return c.Engine().Write(ctx, b.Client, memory.AddrOf(val), b.Addr, size)
	})); err != nil {
		return r, err
	}
	dsts := make([][]byte, len(cs))
	for i := range dsts {
		dsts[i] = make([]byte, size)
	}
	if r[2], err = par(cycle(func(i int, c *kv.Client, n int) error {
		_, err := c.GetInto(ctx, keys[i][n%len(keys[i])], dsts[i])
		return err
	})); err != nil {
		return r, err
	}
	if r[3], err = par(cycle(func(i int, c *kv.Client, n int) error {
		b := at[i][n%len(at[i])]
		return c.Engine().Read(ctx, b.Client, memory.AddrOf(dsts[i]), b.Addr, size)
	})); err != nil {
		return r, err
	}
	runtime.KeepAlive(dsts)
	time.Sleep(benchLease + 50*time.Millisecond) // the gets' leases end
	_, err = cs[0].RemoveAll(ctx, false)
	return r, err
}

// kvPar runs f for every client at once and returns how many per second they counted, over the
// time the slowest took.
func kvPar(cs []*kv.Client, f func(i int, c *kv.Client) (int, error)) (float64, error) {
	counts, errs := make([]int, len(cs)), make([]error, len(cs))
	var wg sync.WaitGroup
	start := time.Now()
	for i, c := range cs {
		wg.Add(1)
		go func() { // waited for below
			defer wg.Done()
			counts[i], errs[i] = f(i, c)
		}()
	}
	wg.Wait()
	el := time.Since(start)
	total := 0
	for _, n := range counts {
		total += n
	}
	return float64(total) / el.Seconds(), errors.Join(errs...)
}

// kvMetaOps makes exist calls on the master for d and returns how many.
func kvMetaOps(ctx context.Context, c *kv.Client, d time.Duration) (int, error) {
	n := 0
	for start := time.Now(); time.Since(start) < d; n++ {
		if _, err := c.Exist(ctx, "nothing"); err != nil {
			return n, err
		}
	}
	return n, nil
}
