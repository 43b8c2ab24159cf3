package group_test

import (
	"context"
	"fmt"
	"log"

	"github.com/hmc-go/hmc/coord/group"
	"github.com/hmc-go/hmc/coord/store"
)

// A member joins a group through the config store and meets the others in a barrier and an
// allgather. Here the group has one member and the store is served in-process; each of 8
// processes would run the same code with Size 8. (README.md shows this example.)
func Example() {
	// README: store
	ctx := context.Background()
	srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{}) // or `hmc store serve`
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	url := srv.URL() // tcp://127.0.0.1:<port>; or "etcd://10.0.0.1:2379,10.0.0.2:2379/job42"
	myAddr := "10.0.0.1:2025"

	c, err := store.Open(ctx, url, store.Config{Ranking: store.Auto, WorldSize: 1})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	g, err := group.New(ctx, c, "workers", group.Config{Size: 1}) // static: ranks 0..Size-1
	if err != nil {
		log.Fatal(err)
	}
	defer g.Close()
	if err := g.Barrier(ctx); err != nil { // a dead member → *group.MemberDownError
		log.Fatal(err)
	}
	all, err := g.AllGather(ctx, []byte(myAddr)) // every member's contribution, in rank order
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("rank %d of %d: %s\n", c.Rank(), len(all), all)
	// README: end

	// Output: rank 0 of 1: [10.0.0.1:2025]
}
