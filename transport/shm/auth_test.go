package shm

import (
	"testing"

	"github.com/hmc-go/hmc/auth"
	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/transporttest"
)

func TestAuth(t *testing.T) {
	transporttest.RunAuth(t, transporttest.AuthOptions{
		Options: transporttest.Options{Addr: abstractName},
		With: func(t testing.TB, a auth.Config) transport.Transport {
			tr, err := New(Config{Auth: a})
			if err != nil {
				t.Fatal(err)
			}
			return tr
		},
	})
}
