package startup

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/internal/childtest"
	"github.com/hmc-go/hmc/status"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSettings(t *testing.T) {
	var s Settings
	s.Fill()
	if s.InitTimeout != DefaultTimeout || s.ControlTimeout != DefaultTimeout || s.Logger == nil {
		t.Fatalf("Fill: %+v", s)
	}
	for _, bad := range []Settings{{InitTimeout: -1}, {ControlTimeout: -time.Second}, {BindIP: "host.example"}} {
		if err := bad.Validate("face"); !errors.Is(err, status.ErrInvalidConfig) || !strings.HasPrefix(err.Error(), "face: ") {
			t.Errorf("%+v: %v", bad, err)
		}
	}
	for url, want := range map[string]bool{"tcp://127.0.0.1:7000": true, "tcp://0.0.0.0:7000": true,
		"tcp://192.0.2.1:7000": false, "etcd://127.0.0.1:2379": false, "127.0.0.1:7000": false} {
		if got := LocalStoreURL(url); got != want {
			t.Errorf("LocalStoreURL(%q) = %v", url, got)
		}
	}
}

// The first process on a local URL serves the store, the next joins it; a world that differs
// from the store's is refused, naming the face.
func TestOpenStore(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	url := "tcp://" + childtest.FreeAddr(t)
	s := Settings{StartStore: true}
	s.Fill()
	a, srv, err := OpenStore(ctx, "face", url, s, Member{World: 2, Rank: 0})
	if err != nil || srv == nil {
		t.Fatalf("rank 0: %v (serving: %v)", err, srv != nil)
	}
	defer srv.Close()
	defer a.Close()
	b, srv2, err := OpenStore(ctx, "face", url, s, Member{World: 2, Auto: true})
	if err != nil || srv2 != nil || b.Rank() != 1 {
		t.Fatalf("the next: %v (serving: %v)", err, srv2 != nil)
	}
	defer b.Close()
	if _, _, err := OpenStore(ctx, "face", url, s, Member{World: 3, Auto: true}); err == nil || !strings.HasPrefix(err.Error(), "face: ") {
		t.Fatalf("another world size: %v", err)
	}
	if _, _, err := OpenStore(ctx, "face", "", s, Member{World: 1}); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatalf("empty URL: %v", err)
	}
}

// A face known by name gets a stable slot: the same name the same rank, another name another;
// and its group set-up works on the link.
func TestOpenStoreByNameAndGroup(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	url := srv.URL()
	var s Settings
	s.Fill()
	a, ra, err := OpenStoreByName(ctx, "face", url, s, "names/", "127.0.0.1:5000")
	if err != nil {
		t.Fatal(err)
	}
	b, rb, err := OpenStoreByName(ctx, "face", url, s, "names/", "127.0.0.1:5001")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if ra != 0 || rb != 1 {
		t.Fatalf("two names: ranks %d and %d, want 0 and 1", ra, rb)
	}
	a.Close()
	a2, ra2, err := OpenStoreByName(ctx, "face", url, s, "names/", "127.0.0.1:5000")
	if err != nil || ra2 != ra {
		t.Fatalf("the same name again: rank %d (was %d), %v", ra2, ra, err)
	}
	defer a2.Close()
	g, err := JoinGroup(ctx, a2, "G", 1, s) // rank 0 of a static world of 1
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
}
