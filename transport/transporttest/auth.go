package transporttest

import (
	"bytes"
	"errors"
	"testing"

	"github.com/hmc-go/hmc/auth"
	"github.com/hmc-go/hmc/auth/authtest"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// AuthOptions describe a transport under the authentication suite.
type AuthOptions struct {
	Options
	// With returns a fresh transport that authenticates with a.
	With func(t testing.TB, a auth.Config) transport.Transport
	// TLS says whether the transport's links run TLS (links that leave the host); without it
	// only the secret is tried.
	TLS bool
}

// RunAuth checks that a target that authenticates serves only initiators that prove the same
// credentials: every other initiator (none, another secret, no or a foreign certificate) is
// refused at Dial with status.ErrPermission and leaves the target's region untouched, and an
// initiator that authenticates refuses a target that does not.
func RunAuth(t *testing.T, o AuthOptions) {
	p, foreign := authtest.NewPKI(t), authtest.NewPKI(t)
	good := auth.Config{Secret: []byte("the group's secret")}
	bad := map[string]auth.Config{
		"none":           {},
		"another secret": {Secret: []byte("a guess")},
	}
	if o.TLS {
		good.TLS = p.Peer(t, "target")
		bad["secret without TLS"] = auth.Config{Secret: good.Secret}
		bad["TLS without secret"] = auth.Config{TLS: p.Peer(t, "initiator")}
		bad["foreign certificate"] = auth.Config{Secret: good.Secret, TLS: foreign.Peer(t, "intruder")}
		bad["another secret inside TLS"] = auth.Config{Secret: []byte("a guess"), TLS: p.Peer(t, "member")}
	}
	const size = 64 << 10
	target := o.buf(t, size)
	Fill(target.Bytes(), 7)
	want := bytes.Clone(target.Bytes())
	srv, err := o.With(t, good).Listen(transport.ServerConfig{BindAddr: o.addr(t), Region: target})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })

	dial := func(t *testing.T, a auth.Config, addr string) (transport.Endpoint, error) {
		local := o.buf(t, size)
		Fill(local.Bytes(), 99)
		return o.With(t, a).Dial(ctx10(t), transport.DialConfig{Addr: addr, Local: local, Rank: 1, Lanes: o.Lanes})
	}
	t.Run("SameCredentials", func(t *testing.T) {
		a := good
		if o.TLS {
			a.TLS = p.Peer(t, "initiator")
		}
		ep, err := dial(t, a, srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer ep.Close()
		if err := transport.Get(ctx10(t), ep, 0, 0, size); err != nil {
			t.Fatal(err)
		}
		// The initiator's local region now holds the target's bytes; put them back shifted
		// by one page and read the page back.
		if err := transport.Put(ctx10(t), ep, 0, 4096, 4096); err != nil {
			t.Fatal(err)
		}
		copy(want[4096:8192], want[0:4096])
		if !bytes.Equal(target.Bytes(), want) {
			t.Fatal("authenticated put/get moved the wrong bytes")
		}
	})
	for name, a := range bad {
		t.Run("Refused/"+name, func(t *testing.T) {
			ep, err := dial(t, a, srv.Addr())
			if err == nil {
				ep.Close()
				t.Fatal("dialled with wrong credentials")
			}
			if !errors.Is(err, status.ErrPermission) {
				t.Fatalf("Dial: %v, want ErrPermission", err)
			}
			t.Log(err)
			if !bytes.Equal(target.Bytes(), want) {
				t.Fatal("the refused initiator changed the target's region")
			}
		})
	}
	t.Run("PlainTargetRefused", func(t *testing.T) {
		plain, err := o.With(t, auth.Config{}).Listen(transport.ServerConfig{BindAddr: o.addr(t), Region: o.buf(t, size)})
		if err != nil {
			t.Fatal(err)
		}
		defer plain.Close()
		ep, err := dial(t, good, plain.Addr())
		if err == nil {
			ep.Close()
			t.Fatal("an authenticating initiator accepted a target that authenticates nothing")
		}
		if !errors.Is(err, status.ErrPermission) {
			t.Fatalf("Dial: %v, want ErrPermission", err)
		}
		t.Log(err)
	})
}
