// Package transporttest is the conformance suite that every transport runs: one body of tests,
// like nettest.TestConn, applied to tcp, shm and ucx alike.
package transporttest
