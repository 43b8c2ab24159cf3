package trans_test

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/hmc-go/hmc/fabric/trans"
	"github.com/hmc-go/hmc/memory"
)

// A prefill worker moves one layer-block of KV cache (DeepSeek-R1's shape: 61 layers, a 128 KiB
// K piece and a 16 KiB V piece per layer, each piece at its own address) into a decode worker's
// registered cache in one batch, and tells it so. Here both engines live in one process; in
// production each is its own process, usually on its own host.
func Example_kvBlock() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	decode, err := trans.Create(ctx, trans.P2P, trans.Config{UniqueID: "127.0.0.1:0", Role: trans.Receiver})
	if err != nil {
		panic(err)
	}
	defer decode.Close()
	prefill, err := trans.Create(ctx, trans.P2P, trans.Config{UniqueID: "127.0.0.1:0", Role: trans.Sender})
	if err != nil {
		panic(err)
	}
	defer prefill.Close()

	const layers, k, v = 61, 128 << 10, 16 << 10
	cache, err := decode.Malloc(2 * layers * (k + v)) // the decode side's KV pool
	if err != nil {
		panic(err)
	}
	src := make([]byte, layers*(k+v)) // the prefill side's block, layer by layer
	for i := range src {
		src[i] = byte(i * 7)
	}
	if err := prefill.Register(memory.AddrOf(src), uint64(len(src))); err != nil {
		panic(err)
	}
	var reqs []trans.Request
	for l := range layers {
		off := uint64(l * (k + v))
		dst := cache + 2*off // scattered on the decode side
		reqs = append(reqs,
			trans.Request{Op: trans.Write, Local: memory.AddrOf(src) + off, Remote: dst, Size: k},
			trans.Request{Op: trans.Write, Local: memory.AddrOf(src) + off + k, Remote: dst + k + 4096, Size: v})
	}
	if err := prefill.Transfer(ctx, decode.UniqueID(), reqs, &trans.Notify{Msg: "block 0 ready"}); err != nil {
		panic(err)
	}
	got := memory.HostSlice(memory.Ptr(cache), 2*layers*(k+v))
	ok := true
	for l := range layers {
		off := l * (k + v)
		ok = ok && bytes.Equal(got[2*off:2*off+k], src[off:off+k]) && bytes.Equal(got[2*off+k+4096:2*off+k+4096+v], src[off+k:off+k+v])
	}
	for _, n := range decode.Notifies() {
		fmt.Println(n.Msg, "- bytes equal:", ok)
	}
	// Output: block 0 ready - bytes equal: true
}
