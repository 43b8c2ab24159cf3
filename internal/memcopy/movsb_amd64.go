package memcopy

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

func hasERMS() bool { return cpu.X86.HasERMS }

//go:noescape
func movsb(dst, src unsafe.Pointer, n uintptr)
