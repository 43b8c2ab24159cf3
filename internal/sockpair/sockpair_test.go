package sockpair

import (
	"io"
	"testing"
)

// TestNew: bytes written on either end arrive at the other, over both networks.
func TestNew(t *testing.T) {
	for _, network := range []string{"tcp", "unix"} {
		a, b := New(t, network)
		if _, err := a.Write([]byte("ab")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 2)
		if _, err := io.ReadFull(b, buf); err != nil || string(buf) != "ab" {
			t.Fatalf("%s: %q %v", network, buf, err)
		}
		if _, err := b.Write([]byte("cd")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(a, buf); err != nil || string(buf) != "cd" {
			t.Fatalf("%s: %q %v", network, buf, err)
		}
	}
}
