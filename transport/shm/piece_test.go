package shm

import (
	"bytes"
	"fmt"
	"testing"
	"unsafe"

	"github.com/hmc-go/hmc/internal/memcopy"
)

// TestPieceCopySizes: pieceCopy moves every byte at every size and misalignment its ways
// take (Go's copy, `rep movsb`, glibc), and nothing past the piece.
func TestPieceCopySizes(t *testing.T) {
	for _, n := range []int{1, 7, 4095, 4096, 4097, 65536 + 3, 1<<20 - 1, 1 << 20, 1<<20 + 9} {
		for _, shift := range []int{0, 1, 13} {
			src := make([]byte, n+shift)
			for i := range src {
				src[i] = byte(i*31 + n)
			}
			dst := make([]byte, n+shift+1)
			pieceCopy(dst[shift:shift+n], src[shift:], 16<<10, false)
			if !bytes.Equal(dst[shift:shift+n], src[shift:]) || dst[shift+n] != 0 {
				t.Fatalf("%d bytes at offset %d: the copy differs or ran past its end", n, shift)
			}
			if memcopy.HasERMS() { // the race build copies with Go's copy: movsb itself, checked here
				clear(dst)
				memcopy.Movsb(unsafe.Pointer(&dst[shift]), unsafe.Pointer(&src[shift]), uintptr(n))
				if !bytes.Equal(dst[shift:shift+n], src[shift:]) || dst[shift+n] != 0 {
					t.Fatalf("movsb of %d bytes at offset %d: the copy differs or ran past its end", n, shift)
				}
			}
		}
	}
}

// BenchmarkPieceCopies copies 512 discrete pieces (each at twice its size from the last, as a
// KV batch's blocks, so that a batch of 128 KiB pieces is far larger than the caches) with Go's
// copy, glibc's memcpy and `rep movsb`, from sizes that stay in the caches to 128 KiB; and, as
// their ceiling, the same bytes as one `rep movsb` (whole): what a piece costs beyond its bytes.
func BenchmarkPieceCopies(b *testing.B) {
	mc := libcMemcpy()
	for _, s := range []int{4 << 10, 8 << 10, 16 << 10, 128 << 10} {
		const n = 512
		src, dst := make([]byte, 2*n*s), make([]byte, 2*n*s)
		for _, how := range []string{"go", "libc", "movsb", "whole"} {
			if (how == "libc" && mc == nil) || ((how == "movsb" || how == "whole") && !memcopy.HaveMovsb) {
				continue
			}
			b.Run(fmt.Sprintf("%dK/%s", s>>10, how), func(b *testing.B) {
				b.SetBytes(int64(n * s))
				for b.Loop() {
					if how == "whole" {
						memcopy.Movsb(unsafe.Pointer(&dst[0]), unsafe.Pointer(&src[0]), uintptr(n*s))
						continue
					}
					for i := range n {
						d, c := unsafe.Pointer(&dst[2*s*i]), unsafe.Pointer(&src[2*s*i])
						switch how {
						case "go":
							copy(dst[2*s*i:2*s*i+s], src[2*s*i:2*s*i+s])
						case "libc":
							mc(d, c, uintptr(s))
						default:
							memcopy.Movsb(d, c, uintptr(s))
						}
					}
				}
			})
		}
	}
}
