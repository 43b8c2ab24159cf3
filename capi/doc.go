// Command capi builds libhmc.so, HMC-Go's C library:
//
//	go build -buildmode=c-shared -o libhmc.so ./capi
//
// capi/include/hmc.h (hand-written and documented) declares the API: opaque handles, int
// status returns equal to HMC's status codes, a thread-local last-error string, sizes as
// uint64_t. Every exported function recovers panics, so a Go bug never kills the C caller. The
// exports live in packages per face under capi/internal (cabi: what they share; hmcapi:
// sessions, buffers, memory, control plane, groups; storeapi: the config store), all linked
// into this one c-shared library: one Go runtime per process. The Python package (python/) is
// built on it.
package main

func main() {}
