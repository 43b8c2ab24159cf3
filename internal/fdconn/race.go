//go:build race

package fdconn

const raceEnabled = true
