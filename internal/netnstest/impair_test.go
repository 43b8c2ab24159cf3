package netnstest

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echo serves one connection inside the namespace, writing back what it reads.
func echo(t *testing.T, n *NS) string {
	t.Helper()
	l, err := n.Listen("")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.Copy(c, c)
	}()
	t.Cleanup(func() { l.Close(); <-done })
	return l.Addr().String()
}

// roundTrip sends p through the echo and returns how long the first byte took to come back
// and whether all of it came back intact.
func roundTrip(t *testing.T, c net.Conn, p []byte) (time.Duration, bool) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	start := time.Now()
	go func() { _, _ = c.Write(p) }()
	got := make([]byte, len(p))
	if _, err := io.ReadFull(c, got[:1]); err != nil {
		t.Fatal(err)
	}
	rtt := time.Since(start)
	if _, err := io.ReadFull(c, got[1:]); err != nil {
		t.Fatal(err)
	}
	return rtt, bytes.Equal(got, p)
}

// The queue delays, drops and reorders a namespace's packets; TCP across still delivers every
// byte in order, the delay shows in the round trip, and healing restores it.
func TestImpair(t *testing.T) {
	n := New(t)
	c, err := net.Dial("tcp", echo(t, n))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := make([]byte, 4<<20)
	for i := range p {
		p[i] = byte(rand.Uint32())
	}
	base, ok := roundTrip(t, c, p[:1])
	if !ok {
		t.Fatal("echo differs")
	}
	heal := n.Impair(t, Impairment{Delay: 25 * time.Millisecond, Jitter: 5 * time.Millisecond, Loss: 0.02, Reorder: 0.1})
	var rtts []time.Duration
	for range 5 { // a dropped byte costs a retransmission, a reordered one skips the delay
		rtt, ok := roundTrip(t, c, p[:1])
		if !ok {
			t.Fatal("echo differs under impairment")
		}
		rtts = append(rtts, rtt)
	}
	slices.Sort(rtts)
	slow := rtts[2]
	if _, ok := roundTrip(t, c, p[:1<<20]); !ok {
		t.Fatal("1 MiB through delay, loss and reordering differs")
	}
	// 25±5 ms each way; in the median trip at least one way was delayed.
	if slow < 20*time.Millisecond {
		t.Fatalf("round trip under 2×25 ms delay took %v (before: %v)", slow, base)
	}
	heal()
	fast, ok := roundTrip(t, c, p)
	if !ok {
		t.Fatal("echo differs after healing")
	}
	t.Logf("round trip %v, impaired %v, healed %v (4 MiB, first byte)", base, slow, fast)
}
