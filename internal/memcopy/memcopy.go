package memcopy

import (
	"unsafe"

	"github.com/hmc-go/hmc/internal/racebuild"
)

// MovsbMin is the smallest copy Copy makes with `rep movsb`: pieces of 8 KiB in the caches
// copy at 83-85 GB/s that way against 53-55 with Go's copy, cold pieces of 128 KiB at 54-71
// against 19-28, and 4 KiB pieces at 70-74 against 56-60 (BenchmarkPieces), with no call's
// cost. Below it Go's copy, whose start costs less, is as fast.
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
