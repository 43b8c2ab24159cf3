package bm_test

import (
	"context"
	"fmt"
	"time"

	"github.com/hmc-go/hmc/fabric/bm"
)

// One rank of a world (here a world of one): init, create, join, write to a global address
// and read it back. With more ranks, every process runs the same code with its own rank, and
// PtrByMemType(bm.Host, r) names rank r's slice.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f, err := bm.Init(ctx, "tcp://127.0.0.1:0", bm.DefaultConfig()) // a world of 1; serves the store
	if err != nil {
		panic(err)
	}
	defer f.Close()
	b, err := f.Create(ctx, 0, bm.Options{LocalDRAM: 64 << 20, DataOps: bm.OpHostSHM | bm.OpHostTCP})
	if err != nil {
		panic(err)
	}
	if err := b.Join(ctx); err != nil {
		panic(err)
	}
	gva, _ := b.PtrByMemType(bm.Host, f.Rank())
	if err := b.Write(ctx, gva+4096, []byte("hello, global memory")); err != nil {
		panic(err)
	}
	got := make([]byte, 20)
	if err := b.Read(ctx, got, gva+4096); err != nil {
		panic(err)
	}
	fmt.Println(string(got), string(b.Local()[4096:4096+5]))
	// Output: hello, global memory hello
}
