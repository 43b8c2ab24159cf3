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

// FuzzParseCard: a card from the store or a peer is refused or decoded, never a panic.
func FuzzParseCard(f *testing.F) {
	f.Add(Card{Rank: 1, Addrs: map[string]string{"tcp": "a"}}.Encode())
	f.Add([]byte(`{"rank":9999999999999999999}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseCard(b)
		if err == nil && (c.Rank < 0 || len(c.Addrs) == 0) {
			t.Fatalf("accepted %+v", c)
		}
	})
}
