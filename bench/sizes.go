package bench

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/hmc-go/hmc/status"
)

// sizeUnits names the units ParseSize takes, for its error messages.
const sizeUnits = "B; KiB, MiB, GiB, TiB or k, m, g, t (1024-based); KB, MB, GB, TB (1000-based)"

// ParseSize reads a human size: a whole number above 0 with an optional unit. KiB/MiB/GiB/TiB
// and k/m/g/t (as upstream's perf.py) are powers of 1024; KB/MB/GB/TB are powers of 1000.
func ParseSize(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   uint64
	}{
		{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
		{"k", 1 << 10}, {"K", 1 << 10}, {"m", 1 << 20}, {"M", 1 << 20}, {"g", 1 << 30}, {"G", 1 << 30},
		{"t", 1 << 40}, {"T", 1 << 40},
		{"B", 1},
	}
	mult := uint64(1)
	for _, u := range units {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseUint(t, 10, 64)
	switch {
	case err != nil:
		return 0, fmt.Errorf("size %q: want a whole number above 0 with an optional unit (%s): %w", s, sizeUnits, status.ErrInvalidConfig)
	case n == 0:
		return 0, fmt.Errorf("size %q: a transfer of 0 bytes measures nothing; the smallest is 1: %w", s, status.ErrInvalidConfig)
	case n > (1<<62)/mult:
		return 0, fmt.Errorf("size %q: larger than 4 EiB: %w", s, status.ErrInvalidConfig)
	}
	return n * mult, nil
}

// ParseSizes reads a comma-separated list of sizes.
func ParseSizes(s string) ([]uint64, error) {
	var out []uint64
	for _, f := range strings.Split(s, ",") {
		if strings.TrimSpace(f) == "" {
			continue
		}
		n, err := ParseSize(f)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no sizes in %q: %w", s, status.ErrInvalidConfig)
	}
	return out, nil
}

// FormatSize prints n with the largest binary unit that divides it.
func FormatSize(n uint64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}
