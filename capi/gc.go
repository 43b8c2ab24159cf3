//go:build cgo

package main

import "os"

// ballast puts a floor under the collector's heap target. The library's live heap is small
// beside what each batch call allocates for its requests, so the default target (twice the live
// heap) ran the collector every 20 to 30 calls of a 1,024-entry batch from Python (888 cycles in
// 2 s), a fifth of the call's time. With the floor it runs a few times a second. The ballast is
// never written: the kernel's zero pages back it, so it is address space, not memory, and it
// holds no pointers, so the collector never scans it. A GOGC or GOMEMLIMIT the user sets is left
// alone.
//
//lint:ignore U1000 held, never read: its size is the point
var ballast []byte

// ballastSize is the floor: the heap target is at least twice it.
const ballastSize = 64 << 20

func init() {
	if os.Getenv("GOGC") != "" || os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	ballast = make([]byte, ballastSize)
}
