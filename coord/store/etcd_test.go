package store_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/coord/store/storetest"
	"github.com/hmc-go/hmc/internal/etcdtest"
)

var nsSeq atomic.Int64

func etcdBackend(c *etcdtest.Cluster) storetest.Backend {
	return func(t *testing.T) storetest.Opener {
		url := c.URL(fmt.Sprintf("test%d", nsSeq.Add(1)))
		return func(cfg store.Config) (store.Client, error) {
			cfg.Heartbeat = time.Second
			return store.Open(context.Background(), url, cfg)
		}
	}
}

func TestEtcd(t *testing.T) {
	c := etcdtest.Start(t, 1)
	storetest.Run(t, etcdBackend(c))
}
