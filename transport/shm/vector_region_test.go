package shm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/transporttest"
)

// TestVectorOneRegion: vectors whose pieces all lie in one mapped (memfd) region take the
// one-region path (checked in one pass, each piece's range found from its address): named by
// address and by key, pieces of every copy path's size with empty ones among them and first,
// copied by the caller alone (under Config.ParallelThreshold) and shared with the helpers (over
// it), written and read back byte for byte. A piece past the region's end fails the vector,
// typed, before any byte is written; one in another region sends the vector the general way.
func TestVectorOneRegion(t *testing.T) {
	p := transporttest.Options{New: func(testing.TB) transport.Transport {
		tr, err := New(Config{Workers: 2})
		if err != nil {
			t.Fatal(err)
		}
		return tr
	}, Addr: abstractName}.NewRMAPair(t)
	v := p.RMA.(transport.VectorRMA)
	const size = 16 << 20
	tgt, other := transporttest.HostBuf(t, size), transporttest.HostBuf(t, 1<<20)
	reg, err := p.Table.RegisterBuffer(tgt)
	if err != nil {
		t.Fatal(err)
	}
	oreg, err := p.Table.RegisterBuffer(other)
	if err != nil {
		t.Fatal(err)
	}
	mem := tgt.Bytes()
	src := make([]byte, 8<<20)
	transporttest.Fill(src, 7)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, c := range []struct {
		name  string
		sizes []int
	}{
		{"solo", []int{0, 1, 100, 64, 4096, 0, 300, 8192, 3, 65536, 17}},
		{"shared", append([]int{0}, repeat(512, 4096)...)},
		{"shared-mixed", repeat(300, 100, 4096, 16384, 0, 7)},
	} {
		for _, byKey := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/key=%v", c.name, byKey), func(t *testing.T) {
				clear(mem)
				var srcs, back [][]byte
				var dsts []transport.Remote
				at, off := uint64(4096), 0
				for _, n := range c.sizes {
					srcs, back = append(srcs, src[off:off+n]), append(back, make([]byte, n))
					d := transport.Remote{Addr: reg.Addr() + at}
					if byKey {
						d = transport.Remote{Key: reg.Key(), Addr: at}
					}
					dsts = append(dsts, d)
					at += uint64(n) + 4096 // a hole after every piece
					off += n
				}
				op, err := v.WriteVAsync(ctx, srcs, dsts)
				if err == nil {
					err = op.Wait(ctx)
				}
				if err != nil {
					t.Fatal(err)
				}
				if op, err = v.ReadVAsync(ctx, back, dsts); err == nil {
					err = op.Wait(ctx)
				}
				if err != nil {
					t.Fatal(err)
				}
				at = 4096
				for i, s := range srcs {
					if !bytes.Equal(mem[at:at+uint64(len(s))], s) || !bytes.Equal(back[i], s) {
						t.Fatalf("piece %d (%d bytes) differs, written or read back", i, len(s))
					}
					if hole := mem[at+uint64(len(s)) : at+uint64(len(s))+4096]; !bytes.Equal(hole, make([]byte, 4096)) {
						t.Fatalf("the hole after piece %d was written", i)
					}
					at += uint64(len(s)) + 4096
				}
			})
		}
	}
	clear(mem)
	for _, last := range []transport.Remote{{Addr: reg.Addr() + size - 2}, {Key: reg.Key(), Addr: size - 2}} {
		op, err := v.WriteVAsync(ctx, [][]byte{[]byte("good"), []byte("past the end")}, []transport.Remote{{Addr: reg.Addr()}, last})
		if err == nil {
			err = op.Wait(ctx)
		}
		if !errors.Is(err, status.ErrOutOfRange) && !errors.Is(err, status.ErrNotFound) {
			t.Fatalf("a piece past the region's end (%+v): %v", last, err)
		}
		if !bytes.Equal(mem[:4], make([]byte, 4)) {
			t.Fatalf("a refused vector (%+v) wrote its first piece", last)
		}
	}
	op, err := v.WriteVAsync(ctx, [][]byte{[]byte("here"), []byte("there")}, []transport.Remote{{Addr: reg.Addr() + 8}, {Addr: oreg.Addr() + 8}})
	if err == nil {
		err = op.Wait(ctx)
	}
	if err != nil || string(mem[8:12]) != "here" || string(other.Bytes()[8:13]) != "there" {
		t.Fatalf("a vector over two regions: %v", err)
	}
}

// repeat returns sizes repeated to n entries.
func repeat(n int, sizes ...int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = sizes[i%len(sizes)]
	}
	return out
}
