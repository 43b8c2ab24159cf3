package store

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"time"
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

// reasonMagic starts the text the server sends after a refusing connect result (an extension:
// upstream's clients close the link on a refusal without reading further, and a client of ours
// facing a server that sends none sees the link close).
const reasonMagic = "HMCR"

// maxReason bounds a refusal reason's length.
const maxReason = 1024

// writeRefusal answers a connect request with result c (not success) and why, the reason.
func writeRefusal(w io.Writer, c Code, why error) error {
	if err := writeResult(w, c); err != nil {
		return err
	}
	msg := why.Error()
	if len(msg) > maxReason {
		msg = msg[:maxReason]
	}
	b := make([]byte, len(reasonMagic)+2+len(msg))
	copy(b, reasonMagic)
	binary.LittleEndian.PutUint16(b[len(reasonMagic):], uint16(len(msg)))
	copy(b[len(reasonMagic)+2:], msg)
	_, err := w.Write(b)
	return err
}

// readReason reads the reason that may follow a refusal, within a second; "" when none comes
// (an upstream server, or an older one of ours) or it is malformed.
func readReason(c net.Conn) string {
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	hdr := make([]byte, len(reasonMagic)+2)
	if _, err := io.ReadFull(c, hdr); err != nil || string(hdr[:len(reasonMagic)]) != reasonMagic {
		return ""
	}
	n := int(binary.LittleEndian.Uint16(hdr[len(reasonMagic):]))
	if n > maxReason {
		return ""
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(c, msg); err != nil {
		return ""
	}
	return strings.ToValidUTF8(string(msg), "?")
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
