package shm

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// hasERMS says whether the CPU has enhanced `rep movsb` (ERMS).
func hasERMS() bool { return cpu.X86.HasERMS }

// movsb copies n bytes from src to dst with `rep movsb`; the ranges must not overlap.
//
//go:noescape
func movsb(dst, src unsafe.Pointer, n uintptr)
