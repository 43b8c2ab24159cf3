package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hmc-go/hmc/coord/group"
	"github.com/hmc-go/hmc/coord/store"
)

// StoreConfig configures StoreRun: the config store and group engine benchmark.
type StoreConfig struct {
	// Backends maps a name to a store URL (a fresh namespace or server per run).
	Backends []StoreBackend
	// Clients are the concurrent client counts of the primitive ops (default 1 and 16).
	Clients []int
	// Duration is how long each primitive op runs (default 1 s).
	Duration time.Duration
	// Ranks are the group sizes of the collective rows (default 8, 64, 256).
	Ranks []int
	// Rounds is the number of timed barriers and allgathers per group size (default 20).
	Rounds int
	// Progress, if set, is told what is measured next (the CLI prints it to stderr).
	Progress func(what string)
}

// StoreBackend is a named store. Fresh returns the URL of a store (or namespace) that no
// measurement used before, so that ranks and world sizes of one measurement never meet another's.
type StoreBackend struct {
	Name  string
	Fresh func() (url string, release func(), err error)
}

// EmbeddedBackend starts an in-process embedded server per measurement.
func EmbeddedBackend() StoreBackend {
	return StoreBackend{Name: "embedded", Fresh: func() (string, func(), error) {
		srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{})
		if err != nil {
			return "", nil, err
		}
		return srv.URL(), func() { _ = srv.Close() }, nil
	}}
}

// EtcdBackend uses a new namespace of the etcd cluster at url per measurement.
func EtcdBackend(url string) StoreBackend {
	base := strings.TrimSuffix(url, "/") + "/hmc-bench-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	var n atomic.Int64
	return StoreBackend{Name: "etcd", Fresh: func() (string, func(), error) {
		return base + "-" + strconv.FormatInt(n.Add(1), 10), func() {}, nil
	}}
}

// StoreResult is one row: ops/s of a primitive, or the latency of a collective.
type StoreResult struct {
	Backend string  `json:"backend"`
	Op      string  `json:"op"`                // set, get, add, cas, barrier, allgather
	Clients int     `json:"clients,omitempty"` // primitive rows
	Ranks   int     `json:"ranks,omitempty"`   // collective rows
	OpsPerS float64 `json:"ops_per_s,omitempty"`
	P50us   float64 `json:"p50_us"`
	P99us   float64 `json:"p99_us,omitempty"`
}

func (c *StoreConfig) defaults() {
	if len(c.Clients) == 0 {
		c.Clients = []int{1, 16}
	}
	if c.Duration <= 0 {
		c.Duration = time.Second
	}
	if len(c.Ranks) == 0 {
		c.Ranks = []int{8, 64, 256}
	}
	if c.Rounds <= 0 {
		c.Rounds = 20
	}
}

// StoreRun measures every backend: Set/Get/Add/CAS ops/s with each client count, then barrier
// and allgather (64 B per rank) latency for each group size, with goroutine members each on
// its own store connection. Rows go to onResult as they are measured.
func StoreRun(ctx context.Context, cfg StoreConfig, onResult func(StoreResult)) error {
	cfg.defaults()
	for _, b := range cfg.Backends {
		for _, n := range cfg.Clients {
			if cfg.Progress != nil {
				cfg.Progress(fmt.Sprintf("%s: set/get/add/cas with %d clients, %v each", b.Name, n, cfg.Duration))
			}
			for _, op := range []string{"set", "get", "add", "cas"} {
				r, err := storeOps(ctx, b, op, n, cfg.Duration)
				if err != nil {
					return fmt.Errorf("%s %s ×%d: %w", b.Name, op, n, err)
				}
				onResult(r)
			}
		}
		for _, n := range cfg.Ranks {
			if cfg.Progress != nil {
				cfg.Progress(fmt.Sprintf("%s: barrier and allgather with %d ranks, %d rounds", b.Name, n, cfg.Rounds))
			}
			rs, err := groupLatency(ctx, b, n, cfg.Rounds)
			if err != nil {
				return fmt.Errorf("%s collectives of %d ranks: %w", b.Name, n, err)
			}
			for _, r := range rs {
				onResult(r)
			}
		}
	}
	return nil
}

func openN(ctx context.Context, url string, n int, ranked bool) ([]store.Client, error) {
	cs := make([]store.Client, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := store.Config{}
			if ranked {
				cfg = store.Config{Ranking: store.Explicit, Rank: i, WorldSize: n}
			}
			cs[i], errs[i] = store.Open(ctx, url, cfg)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			closeAll(cs)
			return nil, fmt.Errorf("client %d: %w", i, err)
		}
	}
	return cs, nil
}

func closeAll(cs []store.Client) {
	for _, c := range cs {
		if c != nil {
			_ = c.Close()
		}
	}
}

func storeOps(ctx context.Context, b StoreBackend, op string, n int, d time.Duration) (StoreResult, error) {
	url, release, err := b.Fresh()
	if err != nil {
		return StoreResult{}, err
	}
	defer release()
	cs, err := openN(ctx, url, n, false)
	if err != nil {
		return StoreResult{}, err
	}
	defer closeAll(cs)
	run := "bench/" + strconv.FormatInt(time.Now().UnixNano(), 36) + "/"
	var total atomic.Int64
	lats := make([][]time.Duration, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	val := make([]byte, 64)
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := run + strconv.Itoa(i)
			if err := c.Set(ctx, key, []byte("0")); err != nil {
				errs[i] = err
				return
			}
			cur := []byte("0")
			end := time.Now().Add(d)
			for k := 0; time.Now().Before(end); k++ {
				t0 := time.Now()
				var err error
				switch op {
				case "set":
					err = c.Set(ctx, key, val)
				case "get":
					_, err = c.Get(ctx, key, 0)
				case "add":
					_, err = c.Add(ctx, key, 1)
				case "cas":
					next := []byte(strconv.Itoa(k + 1))
					var prev []byte
					if prev, err = c.CompareAndSwap(ctx, key, cur, next); err == nil && string(prev) != string(cur) {
						err = fmt.Errorf("CAS on a private key lost: %q vs %q", prev, cur)
					}
					cur = next
				}
				if err != nil {
					errs[i] = err
					return
				}
				lats[i] = append(lats[i], time.Since(t0))
				total.Add(1)
			}
		}()
	}
	start := time.Now()
	wg.Wait()
	el := time.Since(start)
	for _, err := range errs {
		if err != nil {
			return StoreResult{}, err
		}
	}
	all := slices.Concat(lats...)
	p50, p99 := pct(all)
	return StoreResult{Backend: b.Name, Op: op, Clients: n, OpsPerS: float64(total.Load()) / el.Seconds(), P50us: p50, P99us: p99}, nil
}

func pct(l []time.Duration) (p50, p99 float64) {
	if len(l) == 0 {
		return 0, 0
	}
	slices.Sort(l)
	us := func(d time.Duration) float64 { return float64(d) / 1e3 }
	return us(l[len(l)/2]), us(l[len(l)*99/100])
}

func groupLatency(ctx context.Context, b StoreBackend, n, rounds int) ([]StoreResult, error) {
	url, release, err := b.Fresh()
	if err != nil {
		return nil, err
	}
	defer release()
	cs, err := openN(ctx, url, n, true)
	if err != nil {
		return nil, err
	}
	defer closeAll(cs)
	name := "b" + strconv.FormatInt(time.Now().UnixNano(), 36)
	gs := make([]*group.Group, n)
	for i, c := range cs {
		if gs[i], err = group.New(ctx, c, name, group.Config{Size: n}); err != nil {
			return nil, err
		}
		defer gs[i].Close()
	}
	barr := make([]time.Duration, 0, rounds)
	ag := make([]time.Duration, 0, rounds)
	payload := make([]byte, 64)
	errs := make([]error, n)
	for round := -2; round < rounds; round++ { // two warm-up rounds
		for _, kind := range []string{"barrier", "allgather"} {
			var wg sync.WaitGroup
			start := time.Now()
			for i, g := range gs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if kind == "barrier" {
						errs[i] = g.Barrier(ctx)
					} else {
						_, errs[i] = g.AllGather(ctx, payload)
					}
				}()
			}
			wg.Wait()
			el := time.Since(start)
			for _, err := range errs {
				if err != nil {
					return nil, err
				}
			}
			if round >= 0 && kind == "barrier" {
				barr = append(barr, el)
			} else if round >= 0 {
				ag = append(ag, el)
			}
		}
	}
	bp50, bp99 := pct(barr)
	ap50, ap99 := pct(ag)
	return []StoreResult{
		{Backend: b.Name, Op: "barrier", Ranks: n, P50us: bp50, P99us: bp99},
		{Backend: b.Name, Op: "allgather", Ranks: n, P50us: ap50, P99us: ap99},
	}, nil
}

// WriteStoreTable prints rows as an aligned table.
func WriteStoreTable(w io.Writer, rs []StoreResult) {
	fmt.Fprintf(w, "%-10s %-10s %8s %6s %12s %10s %10s\n", "backend", "op", "clients", "ranks", "ops/s", "p50", "p99")
	for _, r := range rs {
		ops := "-"
		if r.OpsPerS > 0 {
			ops = strconv.FormatFloat(r.OpsPerS, 'f', 0, 64)
		}
		fmt.Fprintf(w, "%-10s %-10s %8s %6s %12s %10s %10s\n", r.Backend, r.Op, dash(r.Clients), dash(r.Ranks), ops,
			fmtUS(r.P50us), fmtUS(r.P99us))
	}
}

func dash(n int) string {
	if n == 0 {
		return "-"
	}
	return strconv.Itoa(n)
}

func fmtUS(us float64) string {
	if us >= 1000 {
		return strconv.FormatFloat(us/1000, 'f', 2, 64) + " ms"
	}
	return strconv.FormatFloat(us, 'f', 1, 64) + " µs"
}

// WriteStoreJSON writes one JSON object per line.
func WriteStoreJSON(w io.Writer, r StoreResult) error { return json.NewEncoder(w).Encode(r) }
