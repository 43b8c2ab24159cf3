package rpc

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/hmc-go/hmc/status"
)

// Every connection opens with the server's hello: the magic "HMCRPC1\x00", a flags byte (bit 0:
// a shared secret is required) and a 32-byte nonce Ns. With a secret, the client answers its
// nonce Nc and HMAC-SHA256(secret, "hmc-rpc client" | Ns | Nc); the server checks it in
// constant time (closing the connection otherwise) and answers HMAC-SHA256(secret, "hmc-rpc
// server" | Nc | Ns), which the client checks. A side with a secret refuses a side without one,
// so a stranger can neither ask a rank to copy nor pose as one.

const (
	helloMagic   = "HMCRPC1\x00"
	nonceLen     = 32
	flagSecret   = 1
	helloLen     = len(helloMagic) + 1 + nonceLen
	clientMsgLen = nonceLen + sha256.Size
)

func mac(secret []byte, label string, a, b []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(label))
	m.Write(a)
	m.Write(b)
	return m.Sum(nil)
}

func errAuth(format string, args ...any) error {
	return fmt.Errorf("rpc: "+format+": %w", append(args, status.ErrPermission)...)
}

// serverHello runs the server's side of the handshake on a new connection.
func serverHello(c net.Conn, secret []byte, timeout time.Duration) error {
	_ = c.SetDeadline(time.Now().Add(timeout))
	defer c.SetDeadline(time.Time{})
	hello := make([]byte, helloLen)
	copy(hello, helloMagic)
	if len(secret) > 0 {
		hello[len(helloMagic)] = flagSecret
	}
	ns := hello[len(helloMagic)+1:]
	if _, err := rand.Read(ns); err != nil {
		return err
	}
	if _, err := c.Write(hello); err != nil {
		return err
	}
	if len(secret) == 0 {
		return nil
	}
	msg := make([]byte, clientMsgLen)
	if _, err := io.ReadFull(c, msg); err != nil {
		return err
	}
	nc, sum := msg[:nonceLen], msg[nonceLen:]
	if !hmac.Equal(sum, mac(secret, "hmc-rpc client", ns, nc)) {
		return errAuth("client %s did not prove the secret", c.RemoteAddr())
	}
	_, err := c.Write(mac(secret, "hmc-rpc server", nc, ns))
	return err
}

// clientHello runs the client's side.
func clientHello(c net.Conn, secret []byte, deadline time.Time) error {
	_ = c.SetDeadline(deadline)
	hello := make([]byte, helloLen)
	if _, err := io.ReadFull(c, hello); err != nil {
		return err
	}
	if string(hello[:len(helloMagic)]) != helloMagic {
		return fmt.Errorf("rpc: %s is not a request socket: %w", c.RemoteAddr(), status.ErrProtocol)
	}
	wants := hello[len(helloMagic)]&flagSecret != 0
	switch {
	case wants && len(secret) == 0:
		return errAuth("%s requires a shared secret, and none is configured", c.RemoteAddr())
	case !wants && len(secret) > 0:
		return errAuth("%s does not authenticate; this side requires it", c.RemoteAddr())
	case !wants:
		return nil
	}
	ns := hello[len(helloMagic)+1:]
	nc := make([]byte, nonceLen)
	if _, err := rand.Read(nc); err != nil {
		return err
	}
	if _, err := c.Write(append(nc, mac(secret, "hmc-rpc client", ns, nc)...)); err != nil {
		return err
	}
	sum := make([]byte, sha256.Size)
	if _, err := io.ReadFull(c, sum); err != nil {
		return errAuth("%s refused this side's secret (%v)", c.RemoteAddr(), err)
	}
	if !hmac.Equal(sum, mac(secret, "hmc-rpc server", nc, ns)) {
		return errAuth("%s did not prove the secret", c.RemoteAddr())
	}
	return nil
}
