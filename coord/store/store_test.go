package store_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/coord/store/storetest"
	"github.com/hmc-go/hmc/internal/etcdtest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	storetest.ServeIfChild()
	goleak.VerifyTestMain(m, etcdtest.IgnoreGoroutines()...)
}

// embedded starts a fresh embedded server for one test.
func embedded(t *testing.T) storetest.Opener {
	srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return func(cfg store.Config) (store.Client, error) {
		return store.Open(context.Background(), srv.URL(), cfg)
	}
}

func TestEmbedded(t *testing.T) { storetest.Run(t, embedded) }

// deadPort is a loopback address bound but not listening: it refuses connections, and nobody
// else can take it meanwhile (a closed ephemeral port can be reused by another test at once).
func deadPort(t *testing.T) string {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*unix.SockaddrInet4).Port))
}

// logLines is a slog handler that keeps each record's message, its time and its url.
type logLines struct {
	mu    sync.Mutex
	lines []string
	times []time.Time
	warns []string // the lines at warning level or above
}

func (l *logLines) Enabled(context.Context, slog.Level) bool { return true }
func (l *logLines) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logLines) WithGroup(string) slog.Handler            { return l }
func (l *logLines) Handle(_ context.Context, r slog.Record) error {
	msg := r.Message
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "url" {
			msg += " " + a.Value.String()
		}
		return true
	})
	l.mu.Lock()
	l.lines, l.times = append(l.lines, msg), append(l.times, r.Time)
	if r.Level >= slog.LevelWarn {
		l.warns = append(l.warns, msg)
	}
	l.mu.Unlock()
	return nil
}

// Opening a store where nothing listens says so, naming the address and the refusal; while it
// waits the client logs within a second, then every few seconds.
func TestOpenNoStoreSaysWhy(t *testing.T) {
	for _, scheme := range []string{"tcp", "etcd"} {
		t.Run(scheme, func(t *testing.T) {
			addr := deadPort(t)
			logs := &logLines{}
			start := time.Now()
			_, err := store.Open(context.Background(), scheme+"://"+addr, store.Config{DialTimeout: 4500 * time.Millisecond, Logger: slog.New(logs)})
			if err == nil {
				t.Fatal("opened a store where nothing listens")
			}
			if !errors.Is(err, syscall.ECONNREFUSED) || !strings.Contains(err.Error(), addr) {
				t.Fatalf("error %q does not say nothing listens at %s", err, addr)
			}
			if d := time.Since(start); d > 7*time.Second {
				t.Fatalf("took %v", d)
			}
			logs.mu.Lock()
			defer logs.mu.Unlock()
			if len(logs.lines) < 2 || logs.times[0].Sub(start) > time.Second || !strings.Contains(logs.lines[0], addr) {
				t.Fatalf("logged %q at %v (want a first line within 1 s naming %s, then more)", logs.lines, logs.times, addr)
			}
			if len(logs.lines) > 4 {
				t.Fatalf("logged %d lines in 4.5 s: %q", len(logs.lines), logs.lines)
			}
		})
	}
}

// A server shutting down ends its clients' links: that is logged as a leave (info), not as a
// lost link (warning).
func TestShutdownIsNotALoss(t *testing.T) {
	logs := &logLines{}
	srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	c, err := store.Open(context.Background(), srv.URL(), store.Config{Ranking: store.Explicit, Rank: 0, WorldSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	logs.mu.Lock()
	defer logs.mu.Unlock()
	if len(logs.warns) != 0 {
		t.Fatalf("warnings at a clean shutdown: %q", logs.warns)
	}
	if !slices.ContainsFunc(logs.lines, func(l string) bool { return strings.Contains(l, "shutting down") }) {
		t.Fatalf("no info line for the closed link: %q", logs.lines)
	}
}

// A refused client hears why from the server: here a world size unlike the store's.
func TestRefusalSaysWhy(t *testing.T) {
	srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx := context.Background()
	a, err := store.Open(ctx, srv.URL(), store.Config{Ranking: store.Explicit, Rank: 0, WorldSize: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	_, err = store.Open(ctx, srv.URL(), store.Config{Ranking: store.Explicit, Rank: 0, WorldSize: 1})
	if err == nil || !strings.Contains(err.Error(), "world size 1, the store's is 8") || !strings.Contains(err.Error(), srv.URL()) {
		t.Fatalf("refusal: %v", err)
	}
	_, err = store.Open(ctx, srv.URL(), store.Config{Ranking: store.Explicit, Rank: 0, WorldSize: 8})
	if err == nil || !strings.Contains(err.Error(), "rank 0 is held by a live client") {
		t.Fatalf("taken rank: %v", err)
	}
}

// The server tells OnEvent of ranks joining and leaving, and of refused clients.
func TestServerEvents(t *testing.T) {
	var mu sync.Mutex
	var events []string
	srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{OnEvent: func(e string, rank int) {
		mu.Lock()
		events = append(events, fmt.Sprintf("%s %d", e, rank))
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx := context.Background()
	a, err := store.Open(ctx, srv.URL(), store.Config{Ranking: store.Explicit, Rank: 2, WorldSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Open(ctx, srv.URL(), store.Config{Ranking: store.Explicit, Rank: 2, WorldSize: 4}); err == nil {
		t.Fatal("a second client got rank 2")
	}
	_ = a.Close()
	want := []string{"rank_joined 2", "refused 2", "rank_left 2"}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		got := strings.Join(events, ", ")
		mu.Unlock()
		if got == strings.Join(want, ", ") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("events %q, want %q", got, want)
		}
	}
}
