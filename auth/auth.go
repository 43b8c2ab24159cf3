package auth

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/hmc-go/hmc/status"
)

// Config is a link's authentication. The zero value authenticates nothing (the default).
type Config struct {
	// Secret, when set, is a key both ends must hold: each proves it to the other at connect
	// (HMAC-SHA256 over both ends' fresh nonces), so a peer without it cannot send or receive
	// one byte of the protocol.
	Secret []byte
	// TLS, when set, runs the link in TLS 1.3 with certificates verified both ways (mutual
	// TLS). It holds this process's certificate (Certificates) and the authority its peers'
	// certificates must chain to (RootCAs; ClientCAs defaults to RootCAs). An initiator checks
	// the target's certificate against the address it dialled unless ServerName is set. Links
	// that stay on the host (shared memory, Unix sockets) use only the secret: the kernel
	// already names their peer (SO_PEERCRED).
	TLS *tls.Config
}

// Enabled reports whether c authenticates anything.
func (c Config) Enabled() bool { return len(c.Secret) > 0 || c.TLS != nil }

// Local returns c without TLS, for links that never leave the host.
func (c Config) Local() Config { return Config{Secret: c.Secret} }

// Validate rejects a TLS configuration that cannot authenticate this side.
func (c Config) Validate() error {
	if c.TLS != nil && len(c.TLS.Certificates) == 0 && c.TLS.GetCertificate == nil && c.TLS.GetClientCertificate == nil {
		return fmt.Errorf("auth: TLS without a certificate (mutual TLS needs one on every side): %w", status.ErrInvalidConfig)
	}
	return nil
}

const (
	magic     = "HMCAUTH1"
	version   = 1
	nonceLen  = 32
	msgLen    = 64 // preamble and reply; not shorter than any protocol's first message (shm's hello)
	macLen    = sha256.Size
	flagTLS   = 1 << 0
	flagKey   = 1 << 1
	stOK      = 0
	stRefused = 1 // the flags do not match this side's (the reply's flags say what it wants)
	stBadKey  = 2 // the initiator's proof of the secret did not check out
)

func flags(c Config) byte {
	var f byte
	if c.TLS != nil {
		f |= flagTLS
	}
	if len(c.Secret) > 0 {
		f |= flagKey
	}
	return f
}

func describe(f byte) string {
	switch f & (flagTLS | flagKey) {
	case 0:
		return "no authentication"
	case flagTLS:
		return "TLS"
	case flagKey:
		return "a shared secret"
	default:
		return "TLS and a shared secret"
	}
}

func denied(format string, args ...any) error {
	return fmt.Errorf("auth: "+format+": %w", append(args, status.ErrPermission)...)
}

// message is a preamble or a reply.
type message struct {
	flags, status byte
	nonce         [nonceLen]byte
}

func (m message) encode(reply bool) []byte {
	b := make([]byte, msgLen)
	copy(b, magic)
	b[8] = version
	b[9] = m.flags
	if reply {
		b[10] = m.status
	}
	copy(b[msgLen-nonceLen:], m.nonce[:])
	return b
}

func decode(b []byte, reply bool) (message, error) {
	if len(b) != msgLen || string(b[:len(magic)]) != magic {
		return message{}, fmt.Errorf("auth: not an authentication message: %w", status.ErrProtocol)
	}
	if b[8] != version {
		return message{}, fmt.Errorf("auth: version %d, this side speaks %d: %w", b[8], version, status.ErrUnsupported)
	}
	m := message{flags: b[9]}
	reserved := b[10 : msgLen-nonceLen]
	if reply {
		m.status, reserved = b[10], b[11:msgLen-nonceLen]
	}
	if m.flags&^(flagTLS|flagKey) != 0 || m.status > stBadKey || !allZero(reserved) {
		return message{}, fmt.Errorf("auth: reserved bits set: %w", status.ErrProtocol)
	}
	copy(m.nonce[:], b[msgLen-nonceLen:])
	return m, nil
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

func mac(secret []byte, label string, a, b []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(label))
	m.Write(a)
	m.Write(b)
	return m.Sum(nil)
}

// Client authenticates a new connection c from the initiator's side, before the protocol's
// first byte, and returns the connection the protocol runs on (c, or c inside TLS). proto
// names the protocol ("tcp", "ctrl", ...), so a proof for one is no proof for another;
// deadline bounds the whole exchange. With a zero Config it does nothing and returns c. A
// refusal or a failed proof wraps status.ErrPermission; c is left for the caller to close.
func Client(c net.Conn, cfg Config, proto string, deadline time.Time) (net.Conn, error) {
	if !cfg.Enabled() {
		return c, nil
	}
	_ = c.SetDeadline(deadline)
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	mine := message{flags: flags(cfg)}
	_, _ = rand.Read(mine.nonce[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	if _, err := c.Write(mine.encode(false)); err != nil {
		return nil, ioErr(err)
	}
	b := make([]byte, msgLen)
	n, err := io.ReadFull(c, b)
	if err != nil {
		if n > 0 && !bytes.HasPrefix([]byte(magic), b[:min(n, len(magic))]) {
			return nil, denied("%s answered with something else than an authentication reply: it authenticates nothing, this side demands %s", peer(c), describe(mine.flags))
		}
		if n == 0 && errors.Is(err, io.EOF) {
			return nil, denied("%s closed the link without answering this side's authentication (%v): it may not authenticate", peer(c), err)
		}
		return nil, ioErr(err)
	}
	theirs, err := decode(b, true)
	if err != nil {
		return nil, err
	}
	if theirs.status != stOK && theirs.flags == 0 {
		return nil, denied("%s authenticates nothing, this side demands %s", peer(c), describe(mine.flags))
	}
	if theirs.status != stOK || theirs.flags != mine.flags {
		return nil, denied("%s demands %s, this side offers %s", peer(c), describe(theirs.flags), describe(mine.flags))
	}
	conn, err := startTLS(c, cfg.TLS, false)
	if err != nil || len(cfg.Secret) == 0 {
		return conn, err
	}
	if _, err := conn.Write(mac(cfg.Secret, "hmc-auth "+proto+" initiator", theirs.nonce[:], mine.nonce[:])); err != nil {
		return nil, ioErr(err)
	}
	ans := make([]byte, 1+macLen)
	if _, err := io.ReadFull(conn, ans[:1]); err != nil {
		return nil, ioErr(err)
	}
	if ans[0] != stOK {
		return nil, denied("%s refused this side's secret (the two hold different secrets)", peer(c))
	}
	if _, err := io.ReadFull(conn, ans[1:]); err != nil {
		return nil, ioErr(err)
	}
	if !hmac.Equal(ans[1:], mac(cfg.Secret, "hmc-auth "+proto+" target", mine.nonce[:], theirs.nonce[:])) {
		return nil, denied("%s did not prove the secret", peer(c))
	}
	_ = conn.SetDeadline(time.Time{})
	return conn, nil
}

// Server authenticates a new connection c from the target's side, before it reads the
// protocol's first message, and returns the connection the protocol runs on. A peer that
// offers other credentials than cfg (or none) is told so and refused with an error wrapping
// status.ErrPermission; c is left for the caller to close. With a zero Config it returns c.
func Server(c net.Conn, cfg Config, proto string, deadline time.Time) (net.Conn, error) {
	if !cfg.Enabled() {
		return c, nil
	}
	_ = c.SetDeadline(deadline)
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	mine := message{flags: flags(cfg)}
	_, _ = rand.Read(mine.nonce[:])
	// The magic first: an initiator that does not authenticate sent its protocol's hello,
	// which may be shorter than a preamble, and waits for an answer.
	b := make([]byte, msgLen)
	if _, err := io.ReadFull(c, b[:len(magic)]); err != nil {
		return nil, ioErr(err)
	}
	if string(b[:len(magic)]) != magic {
		mine.status = stRefused
		_, _ = c.Write(mine.encode(true)) // best effort: the initiator learns why
		return nil, denied("%s does not authenticate; this side demands %s", peer(c), describe(mine.flags))
	}
	if _, err := io.ReadFull(c, b[len(magic):]); err != nil {
		return nil, ioErr(err)
	}
	theirs, err := decode(b, false)
	if err != nil {
		return nil, err
	}
	if theirs.flags != mine.flags {
		mine.status = stRefused
		_, _ = c.Write(mine.encode(true))
		return nil, denied("%s offers %s, this side demands %s", peer(c), describe(theirs.flags), describe(mine.flags))
	}
	if _, err := c.Write(mine.encode(true)); err != nil {
		return nil, ioErr(err)
	}
	conn, err := startTLS(c, cfg.TLS, true)
	if err != nil || len(cfg.Secret) == 0 {
		return conn, err
	}
	proof := make([]byte, macLen)
	if _, err := io.ReadFull(conn, proof); err != nil {
		return nil, ioErr(err)
	}
	if !hmac.Equal(proof, mac(cfg.Secret, "hmc-auth "+proto+" initiator", mine.nonce[:], theirs.nonce[:])) {
		_, _ = conn.Write([]byte{stBadKey})
		return nil, denied("%s did not prove the secret", peer(c))
	}
	ans := append([]byte{stOK}, mac(cfg.Secret, "hmc-auth "+proto+" target", theirs.nonce[:], mine.nonce[:])...)
	if _, err := conn.Write(ans); err != nil {
		return nil, ioErr(err)
	}
	return conn, nil
}

// startTLS runs TLS 1.3 over c with tc (none: c itself), as the server (accepting) or the
// client, verifying the other side's certificate both ways: a client checks the server's
// against the dialled address unless tc names a server, a server demands a client's chained
// to ClientCAs (RootCAs when unset).
func startTLS(c net.Conn, tc *tls.Config, server bool) (net.Conn, error) {
	if tc == nil {
		return c, nil
	}
	tc = tc.Clone()
	tc.MinVersion = tls.VersionTLS13
	var t *tls.Conn
	if server {
		tc.ClientAuth = max(tc.ClientAuth, tls.RequireAndVerifyClientCert)
		if tc.ClientCAs == nil {
			tc.ClientCAs = tc.RootCAs
		}
		t = tls.Server(c, tc)
	} else {
		if tc.ServerName == "" {
			tc.ServerName, _, _ = net.SplitHostPort(peer(c))
		}
		t = tls.Client(c, tc)
	}
	if err := t.Handshake(); err != nil {
		return nil, denied("TLS with %s: %v", peer(c), err)
	}
	return t, nil
}

// Refuse is for a target that does not authenticate: b is the start of what it read as the
// protocol's first message. If b is an authenticating initiator's preamble, Refuse answers
// that this side authenticates nothing and returns an error wrapping status.ErrPermission
// (the caller closes c); otherwise it returns nil.
func Refuse(c net.Conn, b []byte) error {
	if len(b) < len(magic) || string(b[:len(magic)]) != magic {
		return nil
	}
	_, _ = c.Write(message{status: stRefused}.encode(true)) // best effort
	f := byte(0)
	if len(b) > 9 {
		f = b[9]
	}
	return denied("%s offers %s; this side authenticates nothing", peer(c), describe(f))
}

// Refusal is for an initiator that does not authenticate: b is the start of what it read as
// the target's answer. If it is an authentication reply (the target demands credentials),
// Refusal returns an error wrapping status.ErrPermission that says what the target demands;
// otherwise nil.
func Refusal(b []byte, peer string) error {
	if len(b) < len(magic) || string(b[:len(magic)]) != magic {
		return nil
	}
	f := byte(flagKey)
	if len(b) > 9 {
		f = b[9]
	}
	return denied("%s demands %s; this side offers none", peer, describe(f))
}

func ioErr(err error) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("auth: %w: %w", status.ErrTimeout, err)
	}
	return fmt.Errorf("auth: %w: %w", status.ErrPeerClosed, err)
}

// peer names c's other end for errors ("peer" where the socket has no address, as a Unix
// socket's initiator).
func peer(c net.Conn) string {
	if a := c.RemoteAddr(); a != nil && a.String() != "" {
		return a.String()
	}
	return "peer"
}
