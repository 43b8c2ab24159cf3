package shm

import (
	"fmt"
	"testing"
	"unsafe"
)

// glibc's memcpy through purego against Go's copy for the pieces of a batch: the call costs
// about a microsecond, which small pieces do not earn back.
func BenchmarkSmallCopies(b *testing.B) {
	mc := libcMemcpy()
	if mc == nil {
		b.Skip("no libc")
	}
	for _, size := range []int{16 << 10, 128 << 10, 512 << 10, 1 << 20, 4 << 20} {
		src, dst := make([]byte, size), make([]byte, size)
		b.Run(fmt.Sprintf("libc/%dK", size>>10), func(b *testing.B) {
			b.SetBytes(int64(size))
			for b.Loop() {
				mc(unsafe.Pointer(&dst[0]), unsafe.Pointer(&src[0]), uintptr(size))
			}
		})
		b.Run(fmt.Sprintf("go/%dK", size>>10), func(b *testing.B) {
			b.SetBytes(int64(size))
			for b.Loop() {
				copy(dst, src)
			}
		})
	}
}
