package memcopy

import (
	"bytes"
	"fmt"
	"testing"
	"unsafe"
)

// TestCopy: Copy and Movsb move every byte at sizes on both sides of MovsbMin and at
// misaligned addresses, nothing past the shorter slice.
func TestCopy(t *testing.T) {
	for _, n := range []int{0, 1, 7, MovsbMin - 1, MovsbMin, MovsbMin + 1, 65536 + 3, 1<<20 + 9} {
		for _, shift := range []int{0, 1, 13} {
			src := make([]byte, n+shift)
			for i := range src {
				src[i] = byte(i*31 + n)
			}
			dst := make([]byte, n+shift+1)
			if got := Copy(dst[shift:shift+n], src[shift:]); got != n {
				t.Fatalf("Copy of %d bytes returned %d", n, got)
			}
			if !bytes.Equal(dst[shift:shift+n], src[shift:]) || dst[shift+n] != 0 {
				t.Fatalf("%d bytes at offset %d: the copy differs or ran past its end", n, shift)
			}
			if HasERMS() && n > 0 { // a race build's Copy takes Go's copy: Movsb itself, checked here
				clear(dst)
				Movsb(unsafe.Pointer(&dst[shift]), unsafe.Pointer(&src[shift]), uintptr(n))
				if !bytes.Equal(dst[shift:shift+n], src[shift:]) || dst[shift+n] != 0 {
					t.Fatalf("Movsb of %d bytes at offset %d: the copy differs or ran past its end", n, shift)
				}
			}
		}
	}
	// The shorter slice bounds it.
	src, dst := bytes.Repeat([]byte{7}, 2*MovsbMin), make([]byte, MovsbMin+1)
	if got := Copy(dst[:MovsbMin], src); got != MovsbMin || dst[MovsbMin] != 0 {
		t.Fatalf("Copy into a shorter slice: %d bytes, the byte past it %d", got, dst[MovsbMin])
	}
}

// BenchmarkPieces copies 512 discrete pieces (each at twice its size from the last, as a KV
// batch's blocks: a batch of 128 KiB pieces is far larger than the caches) with Go's copy and
// with Copy.
func BenchmarkPieces(b *testing.B) {
	for _, s := range []int{4 << 10, 16 << 10, 64 << 10, 128 << 10} {
		const n = 512
		src, dst := make([]byte, 2*n*s), make([]byte, 2*n*s)
		for _, how := range []string{"go", "Copy"} {
			b.Run(fmt.Sprintf("%dK/%s", s>>10, how), func(b *testing.B) {
				b.SetBytes(int64(n * s))
				for b.Loop() {
					for i := range n {
						d, c := dst[2*s*i:2*s*i+s], src[2*s*i:2*s*i+s]
						if how == "go" {
							copy(d, c)
						} else {
							Copy(d, c)
						}
					}
				}
			})
		}
	}
}
