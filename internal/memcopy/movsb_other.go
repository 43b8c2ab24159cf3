//go:build !amd64

package memcopy

import "unsafe"

// movsb exists on amd64 only: hasERMS keeps it from being called elsewhere.
func movsb(dst, src unsafe.Pointer, n uintptr) { panic("memcopy: movsb on a CPU without it") }

func hasERMS() bool { return false }
