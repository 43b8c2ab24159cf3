package group_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/hmc-go/hmc/coord/group"
	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/status"
)

// child is a group member in its own process: HMC_GROUP_CHILD=<mode>, HMC_STORE_URL, HMC_WORLD.
// Modes: "rounds" (barriers and allgathers, checked), "die" (joins the first barrier, then
// waits to be killed), "survive" (expects a MemberDownError in its second barrier).
func child() int {
	url, mode := os.Getenv("HMC_STORE_URL"), os.Getenv("HMC_GROUP_CHILD")
	world, _ := strconv.Atoi(os.Getenv("HMC_WORLD"))
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	if mode == "partition" {
		return partitioned(ctx, url, world)
	}
	c, err := store.Open(ctx, url, store.Config{Ranking: store.Auto, WorldSize: world})
	if err != nil {
		fmt.Println("open:", err)
		return 1
	}
	defer c.Close()
	if mode == "join" { // joins the dynamic group "dyn", then waits to be killed
		g, err := group.New(ctx, c, "dyn", group.Config{})
		if err == nil {
			_, err = g.Join(ctx)
		}
		if err != nil {
			fmt.Println("join:", err)
			return 1
		}
		fmt.Println("JOINED", c.Rank())
		select {}
	}
	g, err := group.New(ctx, c, "procs", group.Config{Size: world})
	if err != nil {
		fmt.Println("group:", err)
		return 1
	}
	defer g.Close()
	me := c.Rank()
	switch mode {
	case "rounds":
		for round := range 5 {
			if err := g.Barrier(ctx); err != nil {
				fmt.Println("barrier:", err)
				return 1
			}
			out, err := g.AllGather(ctx, []byte(fmt.Sprintf("%d/%d", me, round)))
			if err != nil {
				fmt.Println("allgather:", err)
				return 1
			}
			for r, d := range out {
				if !bytes.Equal(d, []byte(fmt.Sprintf("%d/%d", r, round))) {
					fmt.Printf("rank %d round %d: slot %d = %q\n", me, round, r, d)
					return 1
				}
			}
		}
		fmt.Println("OK", me)
		return 0
	case "die", "survive":
		if err := g.Barrier(ctx); err != nil {
			fmt.Println("barrier:", err)
			return 1
		}
		fmt.Println("READY", me)
		if mode == "die" {
			select {} // until SIGKILL
		}
		err := g.Barrier(ctx)
		fmt.Println("SECOND", err)
		return 0
	}
	return 2
}

// partitioned is a member of the dynamic group "part" (explicit rank HMC_RANK, heartbeat 100
// ms) doing barriers with a 1 s deadline until killed (a member to be frozen, HMC_GROUP_FROZEN,
// does not hold its barriers to that). It prints WHOLE when a barrier succeeds
// with every rank in the view (first, and again after SHRUNK), SHRUNK when one succeeds with
// fewer, and FAIL for an error that is not a typed one a partition explains.
func partitioned(ctx context.Context, url string, world int) int {
	me, _ := strconv.Atoi(os.Getenv("HMC_RANK"))
	c, err := store.Open(ctx, url, store.Config{Ranking: store.Explicit, Rank: me, WorldSize: world, Heartbeat: 100 * time.Millisecond})
	if err != nil {
		fmt.Println("FAIL open:", err)
		return 1
	}
	defer c.Close()
	g, err := group.New(ctx, c, "part", group.DefaultConfig())
	if err != nil {
		fmt.Println("FAIL group:", err)
		return 1
	}
	defer g.Close()
	if _, err := g.Join(ctx); err != nil {
		fmt.Println("FAIL join:", err)
		return 1
	}
	state := ""
	for ctx.Err() == nil {
		bctx, cancel := context.WithTimeout(ctx, time.Second)
		start := time.Now()
		err := g.Barrier(bctx)
		cancel()
		if took := time.Since(start); took > 2*time.Second && os.Getenv("HMC_GROUP_FROZEN") == "" { // frozen: its clock ran on
			fmt.Println("FAIL a barrier with a 1 s deadline took", took)
			return 1
		}
		switch {
		case err == nil:
			now := "SHRUNK"
			if g.View().Size() == world {
				now = "WHOLE"
			}
			if now != state {
				state = now
				fmt.Println(now, me)
			}
		case errors.Is(err, status.ErrPeerClosed), errors.Is(err, status.ErrTimeout), errors.Is(err, group.ErrNotMember), errors.Is(err, store.ErrIO):
			if state != "ERR" {
				state = "ERR"
				fmt.Println("ERR", me, err)
			}
		default:
			fmt.Println("FAIL untyped:", err)
			return 1
		}
		time.Sleep(20 * time.Millisecond)
	}
	return 0
}
