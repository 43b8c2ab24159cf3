// Package racebuild says whether this binary was built with the race detector (go build
// -race). Code whose effect the detector cannot see (copies made in assembly, writev's
// scatter-gather) takes an instrumented path when Enabled, so that the detector still orders
// it.
package racebuild
