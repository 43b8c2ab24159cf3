package shm

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// haveMovsb says whether the CPU has enhanced `rep movsb` (ERMS), which copies a batch's
// mid-sized pieces faster than Go's AVX loop when their bytes are not in the caches (not
// under the race detector, which sees only instrumented copies).
var haveMovsb = cpu.X86.HasERMS && !raceEnabled

// hasERMS says whether the CPU has enhanced `rep movsb` (tests use movsb with or without the race
// detector).
func hasERMS() bool { return cpu.X86.HasERMS }

// movsb copies n bytes from src to dst with `rep movsb`; the ranges must not overlap.
//
//go:noescape
func movsb(dst, src unsafe.Pointer, n uintptr)
