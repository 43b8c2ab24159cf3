package group_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hmc-go/hmc/coord/group"
	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/internal/etcdtest"
)

// The etcd leader of a 3-member cluster is killed while 4 members run barriers and allgathers:
// every round completes (exactly-once writes keep the counters right), none fails.
func TestEtcdLeaderKilledMidBarrier(t *testing.T) {
	cl := etcdtest.Start(t, 3)
	url := cl.URL("leaderkill")
	const n, rounds, killAt = 4, 40, 10
	gs := make([]*group.Group, n)
	for i := range gs {
		c := mustOpen(t, url, store.Config{Ranking: store.Explicit, Rank: i, WorldSize: n, Heartbeat: time.Second})
		gs[i] = newGroup(t, c, "lk", group.Config{Size: n})
	}
	var progress atomic.Int64
	killed := make(chan string, 1)
	go func() {
		for progress.Load() < killAt {
			time.Sleep(5 * time.Millisecond)
		}
		name, err := cl.KillLeader()
		if err != nil {
			t.Error(err)
			name = "none"
		}
		killed <- name
	}()
	start := time.Now()
	all(t, n, func(i int) error {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		for r := range rounds {
			if err := gs[i].Barrier(ctx); err != nil {
				return fmt.Errorf("rank %d barrier %d: %w", i, r, err)
			}
			out, err := gs[i].AllGather(ctx, []byte{byte(i), byte(r)})
			if err != nil {
				return fmt.Errorf("rank %d allgather %d: %w", i, r, err)
			}
			for j, d := range out {
				if d[0] != byte(j) || d[1] != byte(r) {
					return fmt.Errorf("rank %d allgather %d: slot %d = %v", i, r, j, d)
				}
			}
			if i == 0 {
				progress.Add(1)
			}
		}
		return nil
	})
	select {
	case name := <-killed:
		t.Logf("killed leader %s after round %d; %d rounds in %v", name, killAt, rounds, time.Since(start))
	default:
		t.Fatal("the leader was never killed")
	}
}
