package transport

import (
	"testing"
	"time"
)

// SpinYield yields at most once per yieldEvery, whoever calls it: the next yield is due
// yieldEvery after the last, and calls before that only read the clock.
func TestSpinYieldEvery(t *testing.T) {
	now := time.Now()
	nextYield.Store(int64(now.Sub(yieldEpoch))) // a yield is due now
	SpinYield(now)
	first := nextYield.Load()
	if want := int64(now.Sub(yieldEpoch) + yieldEvery); first != want {
		t.Fatalf("after a yield the next is due at %d, want %d", first, want)
	}
	SpinYield(now.Add(yieldEvery / 2))
	if got := nextYield.Load(); got != first {
		t.Fatalf("yielded again %v after the last: next due moved from %d to %d", yieldEvery/2, first, got)
	}
	SpinYield(now.Add(yieldEvery))
	if got := nextYield.Load(); got != first+int64(yieldEvery) {
		t.Fatalf("no yield %v after the last: next due %d, want %d", yieldEvery, got, first+int64(yieldEvery))
	}
}
