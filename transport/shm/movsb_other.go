//go:build !amd64

package shm

import "unsafe"

// haveMovsb is false where `rep movsb` does not exist.
const haveMovsb = false

func movsb(dst, src unsafe.Pointer, n uintptr) { panic("shm: movsb on a CPU without it") }

func hasERMS() bool { return false }
