package store

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"net"
)

// The shared-secret handshake (docs/wire/store.md): after the connect request a server that has
// a secret answers resultChallenge and a 32-byte nonce Ns; the client answers its nonce Nc and
// HMAC(secret, "hmc-store client" | request | Ns | Nc); the server checks it (refusing with
// CodeError otherwise) and answers HMAC(secret, "hmc-store server" | request | Nc | Ns) before
// the ordinary 2-byte result, so the client checks the server too. A client with a secret
// refuses a server that does not challenge it.

func mac(secret []byte, label string, req, n1, n2 []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(label))
	h.Write(req)
	h.Write(n1)
	h.Write(n2)
	return h.Sum(nil)
}

func writeResult(w io.Writer, c Code) error {
	var b [2]byte
	binary.LittleEndian.PutUint16(b[:], uint16(c))
	_, err := w.Write(b[:])
	return err
}

func readResult(r io.Reader) (Code, error) {
	var b [2]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, err
	}
	return Code(int16(binary.LittleEndian.Uint16(b[:]))), nil
}

// serverAuth runs the server side of the challenge on c after the connect request req.
func serverAuth(c net.Conn, secret, req []byte) error {
	ns := make([]byte, nonceLen)
	_, _ = rand.Read(ns) // crypto/rand.Read never fails (Go ≥ 1.24)
	if err := writeResult(c, resultChallenge); err != nil {
		return err
	}
	if _, err := c.Write(ns); err != nil {
		return err
	}
	in := make([]byte, nonceLen+macLen)
	if _, err := io.ReadFull(c, in); err != nil {
		return err
	}
	nc, got := in[:nonceLen], in[nonceLen:]
	if !hmac.Equal(got, mac(secret, "hmc-store client", req, ns, nc)) {
		_ = writeResult(c, CodeError) // best effort: the client learns why
		return fmt.Errorf("%w: client's secret does not match", ErrAuth)
	}
	_, err := c.Write(mac(secret, "hmc-store server", req, nc, ns))
	return err
}

// clientAuth runs the client side; first is the server's first answer to the request.
func clientAuth(c net.Conn, secret, req []byte, first Code) error {
	switch {
	case len(secret) == 0 && first == resultChallenge:
		return fmt.Errorf("%w: the store demands a shared secret and none is configured", ErrAuth)
	case len(secret) == 0:
		return nil
	case first != resultChallenge:
		return fmt.Errorf("%w: the store did not authenticate itself (no secret configured there?)", ErrAuth)
	}
	ns := make([]byte, nonceLen)
	if _, err := io.ReadFull(c, ns); err != nil {
		return err
	}
	nc := make([]byte, nonceLen)
	_, _ = rand.Read(nc)
	if _, err := c.Write(append(nc, mac(secret, "hmc-store client", req, ns, nc)...)); err != nil {
		return err
	}
	got := make([]byte, macLen)
	if _, err := io.ReadFull(c, got); err != nil {
		return fmt.Errorf("%w: the store refused the secret: %w", ErrAuth, err)
	}
	if !hmac.Equal(got, mac(secret, "hmc-store server", req, nc, ns)) {
		return fmt.Errorf("%w: the store's answer does not prove the secret", ErrAuth)
	}
	return nil
}
