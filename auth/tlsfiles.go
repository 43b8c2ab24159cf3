package auth

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/hmc-go/hmc/status"
)

// TLSFromFiles builds Config.TLS from PEM files, as the CLI's --tls-cert, --tls-key and
// --tls-ca name them: this process's certificate and key (used both to accept and to dial, so
// it should allow both server and client authentication) and the authority every peer's
// certificate must be signed by. All empty gives nil (no TLS); anything else needs all three.
func TLSFromFiles(cert, key, ca string) (*tls.Config, error) {
	if cert == "" && key == "" && ca == "" {
		return nil, nil
	}
	if cert == "" || key == "" || ca == "" {
		return nil, fmt.Errorf("auth: mutual TLS needs a certificate, its key and the peers' CA (got %q, %q, %q): %w", cert, key, ca, status.ErrInvalidConfig)
	}
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, fmt.Errorf("auth: TLS key pair %s, %s: %w: %w", cert, key, status.ErrInvalidConfig, err)
	}
	pem, err := os.ReadFile(ca)
	if err != nil {
		return nil, fmt.Errorf("auth: TLS CA: %w: %w", status.ErrInvalidConfig, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("auth: no certificate in %s: %w", ca, status.ErrInvalidConfig)
	}
	return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{pair}, RootCAs: pool, ClientCAs: pool}, nil
}
