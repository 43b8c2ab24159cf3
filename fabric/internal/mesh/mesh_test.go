package mesh

import (
	"errors"
	"testing"

	"github.com/hmc-go/hmc/status"
)

func TestCardRoundTrip(t *testing.T) {
	c := Card{Rank: 3, IP: "127.0.0.1", Boot: "b", Addrs: map[string]string{"tcp": "127.0.0.1:1"}}
	got, err := ParseCard(c.Encode())
	if err != nil || !cardEqual(got, c) {
		t.Fatalf("%+v %v", got, err)
	}
	for _, bad := range []string{``, `{}`, `{"rank":-1,"addrs":{"tcp":"x"}}`, `{"rank":1}`, `[1]`} {
		if _, err := ParseCard([]byte(bad)); !errors.Is(err, status.ErrProtocol) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// FuzzParseCard: a card from the store or a peer is refused or decoded, never a panic; one
// accepted is valid and survives encoding again.
func FuzzParseCard(f *testing.F) {
	f.Add(Card{Rank: 1, Addrs: map[string]string{"tcp": "a"}}.Encode())
	f.Add(Card{Rank: 3, IP: "10.0.0.1", Boot: "b", Addrs: map[string]string{"tcp": "10.0.0.1:7000", "shm": "@hmc-shm-7001"}}.Encode())
	f.Add([]byte(`{"rank":9999999999999999999}`))
	f.Add([]byte(`{"rank":1,"addrs":{"tcp":"[::1]:0"}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseCard(b)
		if err != nil {
			if !errors.Is(err, status.ErrProtocol) {
				t.Fatalf("refusal %v is not ErrProtocol", err)
			}
			return
		}
		if c.Rank < 0 || len(c.Addrs) == 0 || c.Validate() != nil {
			t.Fatalf("accepted %+v", c)
		}
		again, err := ParseCard(c.Encode())
		if err != nil || !cardEqual(again, c) || again.Rank != c.Rank {
			t.Fatalf("%+v encodes to a card read back as %+v (%v)", c, again, err)
		}
	})
}
