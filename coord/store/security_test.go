package store_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"math/big"
	"net"
	"testing"
	"time"

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

type pki struct {
	ca   *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newPKI(t *testing.T) *pki {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "hmc test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &pki{ca, key, pool}
}

func (p *pki) cert(t *testing.T, name string, usage x509.ExtKeyUsage) tls.Certificate {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func TestMutualTLS(t *testing.T) {
	p := newPKI(t)
	srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{TLS: &tls.Config{
		Certificates: []tls.Certificate{p.cert(t, "store", x509.ExtKeyUsageServerAuth)},
		ClientAuth:   tls.RequireAndVerifyClientCert, ClientCAs: p.pool,
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx := context.Background()
	good := &tls.Config{RootCAs: p.pool, Certificates: []tls.Certificate{p.cert(t, "rank0", x509.ExtKeyUsageClientAuth)}}
	c, err := store.Open(ctx, srv.URL(), store.Config{TLS: good})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if n, err := c.Add(ctx, "n", 2); err != nil || n != 2 {
		t.Fatalf("Add over TLS = %d %v", n, err)
	}
	other := newPKI(t)
	for name, cfg := range map[string]*tls.Config{
		"no client cert":     {RootCAs: p.pool},
		"untrusted cert":     {RootCAs: p.pool, Certificates: []tls.Certificate{other.cert(t, "intruder", x509.ExtKeyUsageClientAuth)}},
		"untrusted server":   {RootCAs: other.pool, Certificates: []tls.Certificate{p.cert(t, "rank1", x509.ExtKeyUsageClientAuth)}},
		"TLS 1.2 max (weak)": {RootCAs: p.pool, MaxVersion: tls.VersionTLS12, Certificates: []tls.Certificate{p.cert(t, "old", x509.ExtKeyUsageClientAuth)}},
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
