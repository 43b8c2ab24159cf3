//go:build !race

package racebuild

// Enabled is true in a race-detector build.
const Enabled = false
