//go:build ucx && cgo

package ucx

import (
	"context"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/transporttest"
)

// go test -tags ucx -bench . ./transport/ucx  (both sides in this process; UCX_NET_DEVICES=lo)
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

// BenchmarkPutWindow streams puts with 16 in flight (hmc bench --window 16), on HMC's memfd
// buffers and on buffers UCX allocated.
func BenchmarkPutWindow(b *testing.B) {
	const window = 16
	for _, tls := range []string{"posix,cma,self", "tcp"} {
		for _, alloc := range []string{"memfd", "ucx"} {
			for _, n := range []uint64{64 << 10, 1 << 20} {
				b.Run(tls+"/"+alloc+"/"+transporttest.SizeName(n), func(b *testing.B) {
					cfg := Config{TLS: tls}
					tr, err := New(cfg)
					if err != nil {
						b.Fatal(err)
					}
					newBuf := transporttest.HostBuf
					if alloc == "ucx" {
						newBuf = func(t testing.TB, size uint64) *buffer.ConnBuffer { return hostBuf(t, size, cfg) }
					}
					p := transporttest.NewPairOf(b, tr, "127.0.0.1:0", newBuf(b, n), newBuf(b, n), 0)
					ctx := context.Background()
					b.SetBytes(int64(n))
					var ring [window]*transport.Op
					i := 0
					for b.Loop() {
						if op := ring[i%window]; op != nil {
							if err := op.Wait(ctx); err != nil {
								b.Fatal(err)
							}
						}
						op, err := p.EP.PutAsync(ctx, 0, 0, n)
						if err != nil {
							b.Fatal(err)
						}
						ring[i%window] = op
						i++
					}
					for _, op := range ring {
						if op != nil {
							if err := op.Wait(ctx); err != nil {
								b.Fatal(err)
							}
						}
					}
				})
			}
		}
	}
}

// BenchmarkRegisterUCX is what UCX adds to a registration when a peer first resolves the
// region: ucp_mem_map and ucp_rkey_pack of 1,000 regions of 64 MiB (address space reserved, not
// touched), over tcp.
func BenchmarkRegisterUCX(b *testing.B) {
	const n, size = 1000, 64 << 20
	mem, err := unix.Mmap(-1, 0, n*size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Munmap(mem)
	tr, err := New(Config{TLS: "tcp"})
	if err != nil {
		b.Fatal(err)
	}
	w, err := tr.(*Transport).acquire()
	if err != nil {
		b.Fatal(err)
	}
	defer tr.(*Transport).release()
	for b.Loop() {
		undo := make([]func(), 0, n)
		for i := range n {
			memh, unregister, err := w.register(mem[i*size : (i+1)*size])
			if err != nil {
				b.Fatal(err)
			}
			if _, err := w.packRkey(memh); err != nil {
				b.Fatal(err)
			}
			undo = append(undo, unregister)
		}
		b.StopTimer()
		for _, u := range undo {
			u()
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/1000regions")
}
