package bm

import (
	"testing"

	"github.com/hmc-go/hmc/memory"
)

// A KV block (61 × 128 KiB + 61 × 16 KiB discrete pieces) into this rank's slice as one
// CopyBatch, beside the same bytes as one copy: what the batch path costs over a plain copy.
func BenchmarkKVBlockLocal(b *testing.B) {
	_, o := single(b, Options{LocalDRAM: 64 << 20})
	ctx := testCtx(b)
	base, _ := o.PtrByMemType(Host, 0)
	var ps []CopyParams
	src := make([]byte, 32<<20)
	off, total := uint64(0), uint64(0)
	for i := range 122 {
		n := uint64(128 << 10)
		if i >= 61 {
			n = 16 << 10
		}
		ps = append(ps, CopyParams{Src: memory.AddrOf(src) + off, Dst: base + off, Size: n})
		off += 2 * n
		total += n
	}
	b.Run("batch", func(b *testing.B) {
		b.SetBytes(int64(total))
		for b.Loop() {
			if err := o.CopyBatch(ctx, ps, H2G, 0); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("contiguous", func(b *testing.B) {
		b.SetBytes(int64(total))
		for b.Loop() {
			if err := o.Copy(ctx, memory.AddrOf(src), base, total, H2G, 0); err != nil {
				b.Fatal(err)
			}
		}
	})
}
