package store_test

import (
	"context"
	"os"
	"testing"

	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/coord/store/storetest"
	"github.com/hmc-go/hmc/internal/etcdtest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv("HMC_STORE_CHILD") == "1" {
		storeChild()
	}
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
