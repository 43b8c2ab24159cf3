// Command capi builds libhmc.so, HMC-Go's C library:
//
//	go build -buildmode=c-shared -o libhmc.so ./capi
//
// hmc.h (beside this file, hand-written and documented) declares the API: opaque handles,
// int status returns equal to HMC's status codes, a thread-local last-error string, sizes as
// uint64_t. Every exported function recovers panics, so a Go bug never kills the C caller. The
// Python package (python/) is built on this library.
package main

func main() {}
