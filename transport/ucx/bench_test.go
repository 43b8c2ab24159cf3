//go:build ucx && cgo

package ucx

import (
	"context"
	"testing"

	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/transporttest"
)

// go test -tags ucx -bench Put ./transport/ucx  (UCX_TLS picks the transports; default posix,cma,self here)
func BenchmarkPut(b *testing.B) { benchOp(b, transport.Put) }

func BenchmarkGet(b *testing.B) { benchOp(b, transport.Get) }

func benchOp(b *testing.B, op func(context.Context, transport.Endpoint, uint64, uint64, uint64) error) {
	for _, tls := range []string{"posix,cma,self", "tcp"} {
		for _, n := range []uint64{8, 64 << 10, 1 << 20, 4 << 20} {
			b.Run(tls+"/"+transporttest.SizeName(n), func(b *testing.B) {
				tr, err := New(Config{TLS: tls})
				if err != nil {
					b.Fatal(err)
				}
				p := transporttest.NewPair(b, tr, n, n, 0)
				ctx := context.Background()
				b.SetBytes(int64(n))
				for b.Loop() {
					if err := op(ctx, p.EP, 0, 0, n); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
