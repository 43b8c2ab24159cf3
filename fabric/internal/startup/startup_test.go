package startup

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

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
