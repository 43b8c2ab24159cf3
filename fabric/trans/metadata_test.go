package trans

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/hmc-go/hmc/coord/httpmeta"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// Mooncake's HTTP metadata server and Redis: a target process publishes itself there, an
// initiator finds and writes to it (bytes checked by the target), an unknown peer fails at once
// with ErrNotFound, Probe tells the two apart, and a closed engine's key is gone.
func TestHTTPMetadata(t *testing.T) {
	srv, err := httpmeta.Listen("127.0.0.1:0", "")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	c, _ := httpmeta.NewClient(srv.URL(), 0)
	defer c.Close()
	testKVMetadata(t, srv.URL(), c)
}

func TestRedisMetadata(t *testing.T) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("HMC_REQUIRE_REDIS") == "1" {
			t.Fatal("HMC_REQUIRE_REDIS=1 but there is no redis-server (apt-get install redis-server)")
		}
		t.Skip("no redis-server (apt-get install redis-server)")
	}
	addr := freeID(t)
	_, port, _ := strings.Cut(addr, ":")
	cmd := exec.Command(bin, "--bind", "127.0.0.1", "--port", port, "--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	url := "redis://" + addr
	r, err := openRedis(url, RedisConfig{}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for i := 0; ; i++ {
		if err := r.c.Ping(context.Background()).Err(); err == nil {
			break
		} else if i > 100 {
			t.Fatalf("redis-server did not come up: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	testKVMetadata(t, url, r)
	cfg := DefaultConfig()
	cfg.Redis.DB = 300
	cfg.UniqueID = "127.0.0.1:0"
	if _, err := Create(context.Background(), url, cfg); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatalf("database 300: %v", err)
	}
}

func testKVMetadata(t *testing.T, url string, c kvMeta) {
	tg := spawnTarget(t, "127.0.0.1:0", url)
	e := initiator(t, url, transport.TCP)
	ctx := testCtx(t)
	for _, id := range []string{tg.id, e.UniqueID()} {
		if _, err := c.Get(ctx, kvPrefix+engineKey(id)); err != nil {
			t.Fatalf("%s is not published: %v", id, err)
		}
	}
	batcher(t, ctx, e, tg, 64<<10)(1)
	if err := e.Probe(ctx, tg.id); err != nil {
		t.Fatalf("probe of the target: %v", err)
	}
	unknown := freeID(t)
	src := make([]byte, 16)
	if err := e.Write(ctx, unknown, memory.AddrOf(src), 4096, 16); !errors.Is(err, status.ErrNotFound) || !strings.Contains(err.Error(), "not published") {
		t.Fatalf("write to an unpublished peer: %v", err)
	}
	if err := e.Probe(ctx, unknown); !errors.Is(err, status.ErrNotFound) {
		t.Fatalf("probe of an unpublished peer: %v", err)
	}
	if err := e.Probe(ctx, "unreachable_peer:9"); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatalf("probe of a malformed id: %v", err)
	}
	e2, err := Create(ctx, url, Config{UniqueID: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := e2.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, kvPrefix+engineKey(e2.UniqueID())); !errors.Is(err, status.ErrNotFound) {
		t.Fatalf("a closed engine is still published: %v", err)
	}
	if _, err := c.Get(ctx, kvPrefix+engineKey(e.UniqueID())); err != nil {
		t.Fatalf("a live engine is not published: %v", err)
	}
}

func TestNormalizeMetadata(t *testing.T) {
	for in, want := range map[string]string{
		"":                               "P2PHANDSHAKE",
		"P2PHANDSHAKE":                   "P2PHANDSHAKE",
		"127.0.0.1:2379":                 "etcd://127.0.0.1:2379",
		"10.0.0.1:2379,10.0.0.2:2379":    "etcd://10.0.0.1:2379,10.0.0.2:2379",
		"etcd://127.0.0.1:2379":          "etcd://127.0.0.1:2379",
		"tcp://127.0.0.1:7000":           "tcp://127.0.0.1:7000",
		"http://127.0.0.1:8080/metadata": "http://127.0.0.1:8080/metadata",
		"https://meta.example:443/m":     "https://meta.example:443/m",
		" etcd://127.0.0.1:2379 ":        "etcd://127.0.0.1:2379",
	} {
		got, err := NormalizeMetadata(in)
		if err != nil || got != want {
			t.Errorf("NormalizeMetadata(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"consul://x:1", "http://", "redis://"} {
		if _, err := NormalizeMetadata(in); err == nil {
			t.Errorf("NormalizeMetadata(%q): no error", in)
		}
	}
	if _, err := Create(context.Background(), "zookeeper://h:1", Config{UniqueID: "127.0.0.1:0"}); !errors.Is(err, status.ErrUnsupported) {
		t.Errorf("Create on an unknown scheme: %v", err)
	}
}

func TestProtocol(t *testing.T) {
	for name, want := range map[string][]transport.ConnType{
		"tcp":  {transport.SHM, transport.TCP},
		"TCP":  {transport.SHM, transport.TCP},
		"rdma": {transport.SHM, transport.RDMA},
		"ucx":  {transport.SHM, transport.UCX},
	} {
		got, err := Protocol(name, false)
		if err != nil || len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
			t.Errorf("Protocol(%q) = %v, %v; want %v", name, got, err, want)
		}
	}
	for _, name := range []string{"efa", "nvlink", "ascend", "cxl", "xgmi"} {
		if _, err := Protocol(name, false); !errors.Is(err, status.ErrUnsupported) || !strings.Contains(err.Error(), "tcp, rdma") {
			t.Errorf("Protocol(%q): %v", name, err)
		}
	}
	if got, _ := Protocol("rdma", true); got[1] != transport.TCP {
		t.Errorf("rdma forced to tcp: %v", got)
	}
	// Without an RDMA device (or UCX in the build) "rdma" fails at Create, saying how to pick tcp.
	ks, _ := Protocol("rdma", false)
	cfg := DefaultConfig()
	cfg.Kinds = ks
	cfg.UniqueID = "127.0.0.1:0"
	e, err := Create(context.Background(), P2P, cfg)
	if err == nil {
		_ = e.Close()
		t.Skip("this host has an RDMA device and a UCX build: rdma came up")
	}
	if !strings.Contains(err.Error(), "MC_FORCE_TCP=1") || !strings.Contains(err.Error(), `"tcp"`) {
		t.Fatalf("rdma without a device: %v", err)
	}
}
