package main

import (
	"bytes"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/hmc-go/hmc/auth"
	"github.com/hmc-go/hmc/status"
)

// authFlags are the data and control plane's authentication flags of the bench commands.
type authFlags struct {
	secretFile, cert, key, ca string
}

func (a *authFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&a.secretFile, "secret-file", "", "authenticate every link with the shared secret in this file (HMAC challenge both ways; both sides need it)")
	fl.StringVar(&a.cert, "tls-cert", "", "run links that leave the host in mutual TLS 1.3 with this certificate (PEM; with --tls-key and --tls-ca)")
	fl.StringVar(&a.key, "tls-key", "", "the certificate's private key (PEM)")
	fl.StringVar(&a.ca, "tls-ca", "", "the CA every peer's certificate must be signed by (PEM)")
}

// config reads the files the flags name.
func (a *authFlags) config() (auth.Config, error) {
	var c auth.Config
	if a.secretFile != "" {
		var err error
		if c.Secret, err = readSecretFile(a.secretFile); err != nil {
			return c, err
		}
		if len(c.Secret) == 0 {
			return c, fmt.Errorf("--secret-file %s is empty: %w", a.secretFile, status.ErrInvalidConfig)
		}
	}
	tc, err := auth.TLSFromFiles(a.cert, a.key, a.ca)
	if err != nil {
		return c, err
	}
	c.TLS = tc
	return c, nil
}

// args repeats the flags for a child process.
func (a *authFlags) args() []string {
	var out []string
	for _, f := range [][2]string{{"--secret-file", a.secretFile}, {"--tls-cert", a.cert}, {"--tls-key", a.key}, {"--tls-ca", a.ca}} {
		if f[1] != "" {
			out = append(out, f[0], f[1])
		}
	}
	return out
}

// readSecretFile reads a --secret-file: the secret is its contents without surrounding white
// space (a trailing newline is not part of it).
func readSecretFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--secret-file: %w: %w", status.ErrInvalidConfig, err)
	}
	return bytes.TrimSpace(b), nil
}
