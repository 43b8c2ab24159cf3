package shm

import (
	"context"
	"fmt"
	"testing"

	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/transporttest"
)

// BenchmarkVector writes a KV batch's shape, 512 blocks each at twice its size from the last,
// into a registered region as one vector (WriteVAsync) and, as its peer, the same bytes as one
// contiguous write, with the copy on one goroutine (w1) and shared with a helper (w2).
func BenchmarkVector(b *testing.B) {
	const n = 512
	for _, w := range []int{1, 2} {
		for _, s := range []uint64{4 << 10, 16 << 10} {
			p := transporttest.Options{New: func(testing.TB) transport.Transport {
				tr, err := New(Config{Workers: w})
				if err != nil {
					b.Fatal(err)
				}
				return tr
			}, Addr: abstractName}.NewRMAPair(b)
			v := p.RMA.(transport.VectorRMA)
			tgt, src := transporttest.HostBuf(b, 2*n*s), transporttest.HostBuf(b, 2*n*s)
			reg, err := p.Table.RegisterBuffer(tgt)
			if err != nil {
				b.Fatal(err)
			}
			local := src.Bytes()
			srcs, dsts := make([][]byte, n), make([]transport.Remote, n)
			for i := range uint64(n) {
				srcs[i] = local[2*s*i : 2*s*i+s]
				dsts[i] = transport.Remote{Addr: reg.Addr() + 2*s*i}
			}
			ctx := context.Background()
			for _, how := range []string{"scattered", "contiguous"} {
				b.Run(fmt.Sprintf("w%d/%dK/%s", w, s>>10, how), func(b *testing.B) {
					b.SetBytes(int64(n * s))
					for b.Loop() {
						var op *transport.Op
						var err error
						if how == "scattered" {
							op, err = v.WriteVAsync(ctx, srcs, dsts)
						} else {
							op, err = p.RMA.WriteAsync(ctx, local[:n*s], transport.Remote{Addr: reg.Addr()})
						}
						if err == nil {
							err = op.Wait(ctx)
						}
						if err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}
