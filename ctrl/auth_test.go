package ctrl

import (
	"errors"
	"testing"
	"time"

	"github.com/hmc-go/hmc/auth"
	"github.com/hmc-go/hmc/auth/authtest"
	"github.com/hmc-go/hmc/status"
)

func managerWith(t *testing.T, a auth.Config) *Manager {
	t.Helper()
	m, err := New(Config{HelloTimeout: time.Second, Auth: a})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// listen starts m on TCP or a Unix socket and returns how to dial it.
func listen(t *testing.T, m *Manager, tr Transport) func(*Manager) error {
	t.Helper()
	if tr == TCP {
		if err := m.Listen("127.0.0.1", 0, ""); err != nil {
			t.Fatal(err)
		}
		return func(c *Manager) error { return c.DialTCP(ctxT(t), 0, 1, m.TCPAddr().String()) }
	}
	path := UDSPathFor(t.TempDir(), 0)
	if err := m.Listen("", -1, path); err != nil {
		t.Fatal(err)
	}
	return func(c *Manager) error { return c.DialUDS(ctxT(t), 0, 1, path) }
}

func TestAuth(t *testing.T) {
	p, foreign := authtest.NewPKI(t), authtest.NewPKI(t)
	secret := []byte("group secret")
	for _, tr := range []Transport{TCP, UDS} {
		good := auth.Config{Secret: secret}
		if tr == TCP {
			good.TLS = p.Peer(t, "rank0")
		}
		bad := map[string]auth.Config{"another secret": {Secret: []byte("guess"), TLS: good.TLS}}
		if tr == TCP {
			bad["foreign certificate"] = auth.Config{Secret: secret, TLS: foreign.Peer(t, "x")}
			bad["no TLS"] = auth.Config{Secret: secret}
		}
		t.Run(tr.String(), func(t *testing.T) {
			srv := managerWith(t, good)
			dial := listen(t, srv, tr)
			t.Run("SameCredentials", func(t *testing.T) {
				a := good
				if tr == TCP {
					a.TLS = p.Peer(t, "rank1")
				}
				cli := managerWith(t, a)
				if err := dial(cli); err != nil {
					t.Fatal(err)
				}
				if err := cli.SendU64(ctxT(t), 0, 42); err != nil {
					t.Fatal(err)
				}
				if v, err := srv.RecvU64(ctxT(t), 1); err != nil || v != 42 {
					t.Fatalf("RecvU64 = %d %v", v, err)
				}
				if err := srv.SendU64(ctxT(t), 1, 43); err != nil {
					t.Fatal(err)
				}
				if v, err := cli.RecvU64(ctxT(t), 0); err != nil || v != 43 {
					t.Fatalf("RecvU64 = %d %v", v, err)
				}
				srv.CloseAll()
			})
			for name, a := range bad {
				t.Run("Refused/"+name, func(t *testing.T) {
					err := dial(managerWith(t, a))
					if !errors.Is(err, status.ErrPermission) {
						t.Fatalf("dial: %v, want ErrPermission", err)
					}
					t.Log(err)
					if srv.HasPeer(1) {
						t.Fatal("the refused peer was attached")
					}
				})
			}
			// A dialer that authenticates nothing sends its HELLO and a message without
			// waiting: neither is read, and its next receive says why.
			t.Run("Refused/none", func(t *testing.T) {
				cli := managerWith(t, auth.Config{})
				if err := dial(cli); err != nil {
					t.Fatal(err) // the HELLO is not answered: a plain dial cannot tell yet
				}
				_ = cli.SendU64(ctxT(t), 0, 7)
				if _, err := cli.RecvU64(ctxT(t), 0); !errors.Is(err, status.ErrPermission) {
					t.Fatalf("RecvU64 after a refused HELLO: %v, want ErrPermission", err)
				}
				if srv.HasPeer(1) {
					t.Fatal("the unauthenticated peer was attached")
				}
			})
			t.Run("PlainListenerRefused", func(t *testing.T) {
				plain := managerWith(t, auth.Config{})
				err := listen(t, plain, tr)(managerWith(t, good))
				if !errors.Is(err, status.ErrPermission) {
					t.Fatalf("dial: %v, want ErrPermission", err)
				}
			})
		})
	}
}
