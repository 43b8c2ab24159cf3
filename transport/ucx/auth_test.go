//go:build ucx && cgo

package ucx

import (
	"testing"

	"github.com/hmc-go/hmc/auth"
	"github.com/hmc-go/hmc/auth/authtest"
	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/transporttest"
)

// The bootstrap link is authenticated: without the credentials no worker address or rkey
// leaves the target.
func TestAuth(t *testing.T) {
	for _, tls := range []bool{false, true} {
		t.Run(map[bool]string{false: "Secret", true: "TLS"}[tls], func(t *testing.T) {
			transporttest.RunAuth(t, transporttest.AuthOptions{
				With: func(t testing.TB, a auth.Config) transport.Transport {
					tr, err := New(Config{TLS: "tcp", Auth: a})
					if err != nil {
						t.Fatal(err)
					}
					return tr
				},
				TLS: tls,
			})
		})
	}
}

// Region messages (rkeys on resolve, revocations) run on the bootstrap link: the RMA suite
// with that link inside TLS.
func TestRMAOverTLSLink(t *testing.T) {
	a := auth.Config{Secret: []byte("k"), TLS: authtest.NewPKI(t).Peer(t, "rank")}
	transporttest.RunRMA(t, transporttest.Options{New: func(t testing.TB) transport.Transport {
		tr, err := New(Config{TLS: "tcp", Auth: a})
		if err != nil {
			t.Fatal(err)
		}
		return tr
	}})
}
