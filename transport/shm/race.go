//go:build race

package shm

// raceEnabled: the race detector does not see copies made in assembly, so the race build copies
// with Go's copy, which it instruments.
const raceEnabled = true
