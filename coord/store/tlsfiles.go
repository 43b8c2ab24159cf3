package store

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// TLSFromFiles builds the TLS side of a Config or ServerConfig from PEM files, as the CLI's
// --tls-cert, --tls-key and --tls-ca and the C and Python edges name them. cert and key are this
// side's certificate and key (a server needs them; a client gives them for mutual TLS); ca is
// the authority the other side's certificate must be signed by: for a server, client
// certificates are then required (mutual TLS); for a client it replaces the system roots. All
// empty gives nil (no TLS).
func TLSFromFiles(cert, key, ca string, server bool) (*tls.Config, error) {
	if cert == "" && key == "" && ca == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS13}
	if cert != "" || key != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("%w: TLS key pair %s, %s: %w", ErrInvalidKey, cert, key, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	} else if server {
		return nil, fmt.Errorf("%w: a TLS server needs a certificate and key", ErrInvalidKey)
	}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("%w: TLS CA %s: %w", ErrInvalidKey, ca, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: no certificate in %s", ErrInvalidKey, ca)
		}
		if server {
			cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
		} else {
			cfg.RootCAs = pool
		}
	}
	return cfg, nil
}
