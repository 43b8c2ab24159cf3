package group_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/hmc-go/hmc/coord/group"
	"github.com/hmc-go/hmc/coord/store"
)

// child is a group member in its own process: HMC_GROUP_CHILD=<mode>, HMC_STORE_URL, HMC_WORLD.
// Modes: "rounds" (barriers and allgathers, checked), "die" (joins the first barrier, then
// waits to be killed), "survive" (expects a MemberDownError in its second barrier).
func child() int {
	url, mode := os.Getenv("HMC_STORE_URL"), os.Getenv("HMC_GROUP_CHILD")
	world, _ := strconv.Atoi(os.Getenv("HMC_WORLD"))
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
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
