package store_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hmc-go/hmc/auth/authtest"

	"github.com/hmc-go/hmc/coord/store"
)

func TestSharedSecret(t *testing.T) {
	secret := []byte("job-42-secret")
	srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx := context.Background()
	c, err := store.Open(ctx, srv.URL(), store.Config{Secret: secret, Ranking: store.Explicit, Rank: 1, WorldSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Set(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string]store.Config{
		"wrong secret": {Secret: []byte("guess"), DialTimeout: 2 * time.Second},
		"no secret":    {DialTimeout: 2 * time.Second},
	} {
		if bad, err := store.Open(ctx, srv.URL(), cfg); !errors.Is(err, store.ErrAuth) {
			if bad != nil {
				_ = bad.Close()
			}
			t.Errorf("%s: err = %v, want ErrAuth", name, err)
		}
	}
	// A client with a secret refuses a server that does not prove it.
	open, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	if _, err := store.Open(ctx, open.URL(), store.Config{Secret: secret}); !errors.Is(err, store.ErrAuth) {
		t.Errorf("server without secret: %v", err)
	}
	// A raw client that answers the challenge with garbage is dropped and never served.
	raw, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	_, _ = raw.Write(make([]byte, 16))
	buf := make([]byte, 2+32)
	if _, err := io.ReadFull(raw, buf); err != nil { // the challenge may come in pieces
		t.Fatal(err)
	}
	_, _ = raw.Write(make([]byte, 64))
	_ = raw.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, _ := raw.Read(buf)
	if n != 2 || buf[0] != 0xff || buf[1] != 0xff { // CodeError, then close
		t.Errorf("server answered %d bytes % x to a bad MAC", n, buf[:n])
	}
	if v, err := c.Get(ctx, "k", 0); err != nil || string(v) != "v" {
		t.Fatalf("authenticated client after the attack: %q %v", v, err)
	}
}

func TestMutualTLS(t *testing.T) {
	p := authtest.NewPKI(t)
	srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{TLS: &tls.Config{
		Certificates: []tls.Certificate{p.Cert(t, "store")},
		ClientAuth:   tls.RequireAndVerifyClientCert, ClientCAs: p.Pool(),
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx := context.Background()
	good := &tls.Config{RootCAs: p.Pool(), Certificates: []tls.Certificate{p.Cert(t, "rank0")}}
	c, err := store.Open(ctx, srv.URL(), store.Config{TLS: good})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if n, err := c.Add(ctx, "n", 2); err != nil || n != 2 {
		t.Fatalf("Add over TLS = %d %v", n, err)
	}
	other := authtest.NewPKI(t)
	for name, cfg := range map[string]*tls.Config{
		"no client cert":     {RootCAs: p.Pool()},
		"untrusted cert":     {RootCAs: p.Pool(), Certificates: []tls.Certificate{other.Cert(t, "intruder")}},
		"untrusted server":   {RootCAs: other.Pool(), Certificates: []tls.Certificate{p.Cert(t, "rank1")}},
		"TLS 1.2 max (weak)": {RootCAs: p.Pool(), MaxVersion: tls.VersionTLS12, Certificates: []tls.Certificate{p.Cert(t, "old")}},
	} {
		bad, err := store.Open(ctx, srv.URL(), store.Config{TLS: cfg, DialTimeout: 2 * time.Second})
		if err == nil {
			// With TLS 1.3 the client learns of a rejected certificate on its first read.
			_, err = bad.Add(ctx, "n", 1)
			_ = bad.Close()
		}
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// A plaintext client gets nothing.
	if bad, err := store.Open(ctx, srv.URL(), store.Config{DialTimeout: 2 * time.Second}); err == nil {
		_ = bad.Close()
		t.Error("plaintext client accepted by a TLS store")
	}
}
