package shm

// The benchmarks behind Config's defaults: worker count and piece size for cache-resident
// (4 MiB) and DRAM-sized (256 MiB) copies, and glibc's memcpy against Go's copy.

import (
	"fmt"
	"testing"
	"time"
	"unsafe"
)

func BenchmarkCopyShapes(b *testing.B) {
	for _, size := range []uint64{4 << 20, 256 << 20} {
		src, dst := make([]byte, size), make([]byte, size)
		for i := range src {
			src[i], dst[i] = byte(i), byte(i>>8)
		}
		for _, w := range []int{1, 2} {
			for _, piece := range []uint64{128 << 10, 256 << 10, 512 << 10, 64 << 20} {
				ep := &endpoint{cfg: Config{Workers: w, PieceSize: piece, ParallelThreshold: 1 << 20, HugeCopy: 64 << 20},
					helpers: newHelpers(w-1, 50*time.Microsecond)}
				defer ep.helpers.close()
				b.Run(fmt.Sprintf("%dMiB/w%d/p%dK", size>>20, w, piece>>10), func(b *testing.B) {
					b.SetBytes(int64(size))
					for b.Loop() {
						ep.copy(dst, src)
					}
				})
			}
		}
	}
}

func BenchmarkLibcMemcpy(b *testing.B) {
	mc := libcMemcpy()
	if mc == nil {
		b.Skip("no libc")
	}
	for _, size := range []uint64{4 << 20, 256 << 20} {
		src, dst := make([]byte, size), make([]byte, size)
		for i := range src {
			src[i], dst[i] = byte(i), byte(i>>8)
		}
		b.Run(fmt.Sprintf("%dMiB", size>>20), func(b *testing.B) {
			b.SetBytes(int64(size))
			for b.Loop() {
				mc(unsafe.Pointer(&dst[0]), unsafe.Pointer(&src[0]), uintptr(size))
			}
		})
	}
}
