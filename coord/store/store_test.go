package store_test

import (
	"context"
	"errors"
	"fmt"
	"net"
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

// Opening a store where nothing listens says so, naming the address and the refusal.
func TestOpenNoStoreSaysWhy(t *testing.T) {
	// A port bound but not listening refuses connections, and nobody else can take it meanwhile
	// (a closed ephemeral port can be reused by another test's listener at once).
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*unix.SockaddrInet4).Port))
	start := time.Now()
	_, err = store.Open(context.Background(), "tcp://"+addr, store.Config{DialTimeout: 3 * time.Second})
	if err == nil {
		t.Fatal("opened a store where nothing listens")
	}
	if !errors.Is(err, syscall.ECONNREFUSED) || !strings.Contains(err.Error(), "no store at tcp://"+addr) {
		t.Fatalf("error %q does not say nothing listens at %s", err, addr)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %v", d)
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
