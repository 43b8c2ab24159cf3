package memcopy

import (
	"unsafe"

	"github.com/hmc-go/hmc/internal/racebuild"
)

// MovsbMin is the smallest copy Copy makes with `rep movsb`: 512 discrete pieces of 4 KiB copy
// at 71-75 GB/s that way against 56 with Go's copy, of 16 KiB at 66-68 against 57, and pieces
// of 64 and 128 KiB, far beyond the caches as a batch, at 70-73 and 53-67 against 29 and 24-26
// (BenchmarkPieces on the 2-vCPU AMD machine; transport/shm's BenchmarkPieceCopies adds
// glibc). Below it Go's copy, whose start costs less, is as fast.
const MovsbMin = 4 << 10

// HaveMovsb says whether Copy uses `rep movsb`: on CPUs with ERMS, and not under the race
// detector (which does not see copies made in assembly).
var HaveMovsb = hasERMS() && !racebuild.Enabled

// Copy copies min(len(dst), len(src)) bytes from src to dst, which must not overlap, and
// returns how many.
func Copy(dst, src []byte) int {
	n := min(len(dst), len(src))
	if n >= MovsbMin && HaveMovsb {
		movsb(unsafe.Pointer(unsafe.SliceData(dst)), unsafe.Pointer(unsafe.SliceData(src)), uintptr(n))
		return n
	}
	return copy(dst, src)
}

// Movsb copies n bytes from src to dst with `rep movsb`; the ranges must not overlap. Only
// where the CPU has ERMS (HasERMS); the race detector does not see it.
func Movsb(dst, src unsafe.Pointer, n uintptr) { movsb(dst, src, n) }

// HasERMS says whether the CPU has enhanced `rep movsb` (ERMS), which Movsb needs.
func HasERMS() bool { return hasERMS() }
