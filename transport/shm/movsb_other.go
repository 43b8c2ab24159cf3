//go:build !amd64

package shm

import "unsafe"

// movsb exists on amd64 only: hasERMS keeps it from being called elsewhere.
func movsb(dst, src unsafe.Pointer, n uintptr) { panic("shm: movsb on a CPU without it") }

func hasERMS() bool { return false }
