// Package authtest makes certificates for tests of authenticated links: a throw-away authority
// and peer certificates valid for 127.0.0.1 that serve both to accept and to dial.
package authtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// PKI is a certificate authority for one test.
type PKI struct {
	ca   *x509.Certificate
	der  []byte
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

var serial atomic.Int64

// NewPKI makes a fresh authority, valid for an hour.
func NewPKI(t testing.TB) *PKI {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial.Add(1)), Subject: pkix.Name{CommonName: "hmc test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &PKI{ca: ca, der: der, key: key, pool: pool}
}

// Cert issues a certificate named name for 127.0.0.1 and ::1, good for server and client
// authentication.
func (p *PKI) Cert(t testing.TB, name string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial.Add(1) + time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.IPv6loopback}, DNSNames: []string{"localhost"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// Pool returns a certificate pool holding the authority, for RootCAs and ClientCAs.
func (p *PKI) Pool() *x509.CertPool { return p.pool }

// Peer returns a mutual-TLS configuration for a peer named name: its certificate and this
// authority as the one its peers must chain to.
func (p *PKI) Peer(t testing.TB, name string) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{p.Cert(t, name)}, RootCAs: p.pool, ClientCAs: p.pool}
}

// Files writes a peer's certificate, key and the authority as PEM files in dir and returns
// their paths, for code that loads them (auth.TLSFromFiles, the CLI's --tls-* flags).
func (p *PKI) Files(t testing.TB, dir, name string) (cert, key, ca string) {
	t.Helper()
	c := p.Cert(t, name)
	kder, err := x509.MarshalECPrivateKey(c.PrivateKey.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	cert, key, ca = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key"), filepath.Join(dir, "ca.crt")
	for path, blk := range map[string]*pem.Block{
		cert: {Type: "CERTIFICATE", Bytes: c.Certificate[0]},
		key:  {Type: "EC PRIVATE KEY", Bytes: kder},
		ca:   {Type: "CERTIFICATE", Bytes: p.der},
	} {
		if err := os.WriteFile(path, pem.EncodeToMemory(blk), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return cert, key, ca
}
