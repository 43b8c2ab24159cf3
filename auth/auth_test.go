package auth_test

import (
	"bytes"
	"errors"
	"fmt"
	"github.com/hmc-go/hmc/internal/sockpair"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hmc-go/hmc/auth"
	"github.com/hmc-go/hmc/auth/authtest"
	"github.com/hmc-go/hmc/status"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pair connects two loopback TCP sockets.
func pair(t *testing.T) (client, server net.Conn) { return sockpair.New(t, "tcp") }

// run authenticates both ends of a fresh pair, as a protocol does before its first message,
// and then exchanges a hello and a welcome through the connections they returned. A side
// with a zero Config speaks its protocol straight away and checks what it read with Refuse or
// Refusal, as the transports do.
func run(t *testing.T, ccfg, scfg auth.Config) (cerr, serr error) {
	t.Helper()
	c, s := pair(t)
	dl := time.Now().Add(5 * time.Second)
	hello, welcome := []byte("HMCT a 32-byte protocol hello..."), []byte("HMCT the 24-byte welcome")
	sch := make(chan error, 1)
	go func() {
		defer s.Close() // as a target does: the initiator sees the link end
		conn, err := auth.Server(s, scfg, "test", dl)
		if err != nil {
			sch <- err
			return
		}
		got := make([]byte, len(hello))
		if _, err := io.ReadFull(conn, got); err != nil {
			sch <- err
			return
		}
		if err := auth.Refuse(conn, got); err != nil {
			sch <- err
			return
		}
		if !bytes.Equal(got, hello) {
			sch <- fmt.Errorf("target read %q", got)
			return
		}
		_, err = conn.Write(welcome)
		sch <- err
	}()
	cerr = func() error {
		defer c.Close()
		conn, err := auth.Client(c, ccfg, "test", dl)
		if err != nil {
			return err
		}
		if _, err := conn.Write(hello); err != nil {
			return err
		}
		got := make([]byte, len(welcome))
		n, err := io.ReadFull(conn, got)
		if err := auth.Refusal(got[:n], "target"); err != nil {
			return err
		}
		if err != nil || !bytes.Equal(got, welcome) {
			return fmt.Errorf("initiator read %q %v", got, err)
		}
		return nil
	}()
	return cerr, <-sch
}

func TestMatrix(t *testing.T) {
	p, other := authtest.NewPKI(t), authtest.NewPKI(t)
	cfgs := map[string]auth.Config{
		"none":         {},
		"secret":       {Secret: []byte("s3cret")},
		"other secret": {Secret: []byte("another")},
		"tls":          {TLS: p.Peer(t, "a")},
		"tls+secret":   {TLS: p.Peer(t, "b"), Secret: []byte("s3cret")},
		"foreign tls":  {TLS: other.Peer(t, "c")},
	}
	ok := map[[2]string]bool{
		{"none", "none"}: true, {"secret", "secret"}: true, {"other secret", "other secret"}: true,
		{"tls", "tls"}: true, {"tls+secret", "tls+secret"}: true, {"foreign tls", "foreign tls"}: true,
	}
	for cn, cc := range cfgs {
		for sn, sc := range cfgs {
			t.Run(cn+"→"+sn, func(t *testing.T) {
				cerr, serr := run(t, cc, sc)
				if ok[[2]string{cn, sn}] {
					if cerr != nil || serr != nil {
						t.Fatalf("initiator %v, target %v", cerr, serr)
					}
					return
				}
				// A mismatch is ErrPermission on both sides, each saying what the other lacks.
				if !errors.Is(cerr, status.ErrPermission) {
					t.Errorf("initiator: %v, want ErrPermission", cerr)
				}
				if !errors.Is(serr, status.ErrPermission) {
					t.Errorf("target: %v, want ErrPermission", serr)
				}
				t.Logf("initiator: %v\ntarget: %v", cerr, serr)
			})
		}
	}
}

// An initiator that authenticates nothing, speaking its protocol to a target that demands a
// secret, reads the target's refusal where it expected the protocol's answer: Refusal names it.
func TestRefusalSeenByPlainInitiator(t *testing.T) {
	c, s := pair(t)
	sch := make(chan error, 1)
	go func() {
		_, err := auth.Server(s, auth.Config{Secret: []byte("k")}, "test", time.Now().Add(5*time.Second))
		s.Close()
		sch <- err
	}()
	if _, err := c.Write([]byte("HMCT a 32-byte protocol hello...")); err != nil {
		t.Fatal(err)
	}
	welcome := make([]byte, 24)
	n, _ := io.ReadFull(c, welcome)
	err := auth.Refusal(welcome[:n], "target")
	if !errors.Is(err, status.ErrPermission) || !strings.Contains(err.Error(), "shared secret") {
		t.Fatalf("Refusal = %v", err)
	}
	if err := <-sch; !errors.Is(err, status.ErrPermission) {
		t.Fatalf("target: %v", err)
	}
	if auth.Refusal([]byte("HMCT\x02\x00...."), "x") != nil {
		t.Fatal("a protocol answer taken for a refusal")
	}
}

// A target that authenticates nothing answers a preamble with Refuse, and the initiator's
// Client says the target authenticates nothing.
func TestRefuseByPlainTarget(t *testing.T) {
	c, s := pair(t)
	sch := make(chan error, 1)
	go func() {
		hello := make([]byte, 32) // the plain target's protocol hello is shorter than a preamble
		if _, err := io.ReadFull(s, hello); err != nil {
			sch <- err
			return
		}
		err := auth.Refuse(s, hello)
		s.Close()
		sch <- err
	}()
	_, err := auth.Client(c, auth.Config{Secret: []byte("k")}, "test", time.Now().Add(5*time.Second))
	if !errors.Is(err, status.ErrPermission) || !strings.Contains(err.Error(), "authenticates nothing") {
		t.Fatalf("Client = %v", err)
	}
	if err := <-sch; !errors.Is(err, status.ErrPermission) {
		t.Fatalf("Refuse = %v", err)
	}
	if auth.Refuse(s, []byte("HMCT....")) != nil {
		t.Fatal("a protocol hello taken for a preamble")
	}
}

// A target that stops answering turns into a timeout, not a hang.
func TestSilentTargetTimesOut(t *testing.T) {
	c, _ := pair(t)
	start := time.Now()
	_, err := auth.Client(c, auth.Config{Secret: []byte("k")}, "test", time.Now().Add(200*time.Millisecond))
	if !errors.Is(err, status.ErrTimeout) || time.Since(start) > 3*time.Second {
		t.Fatalf("Client = %v after %v", err, time.Since(start))
	}
}

// The proofs are bound to the protocol: a secret proved for one is not accepted for another.
func TestProofBoundToProtocol(t *testing.T) {
	c, s := pair(t)
	cfg := auth.Config{Secret: []byte("k")}
	sch := make(chan error, 1)
	go func() {
		_, err := auth.Server(s, cfg, "ctrl", time.Now().Add(5*time.Second))
		s.Close()
		sch <- err
	}()
	if _, err := auth.Client(c, cfg, "tcp", time.Now().Add(5*time.Second)); !errors.Is(err, status.ErrPermission) {
		t.Fatalf("Client = %v", err)
	}
	if err := <-sch; !errors.Is(err, status.ErrPermission) {
		t.Fatalf("Server = %v", err)
	}
}

func TestValidateAndFiles(t *testing.T) {
	p := authtest.NewPKI(t)
	if err := (auth.Config{TLS: p.Peer(t, "x")}).Validate(); err != nil {
		t.Fatal(err)
	}
	cfg := p.Peer(t, "x")
	cfg.Certificates = nil
	if err := (auth.Config{TLS: cfg}).Validate(); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatalf("TLS without a certificate: %v", err)
	}
	dir := t.TempDir()
	cert, key, ca := p.Files(t, dir, "rank0")
	tc, err := auth.TLSFromFiles(cert, key, ca)
	if err != nil || tc == nil {
		t.Fatal(tc, err)
	}
	if tc, err := auth.TLSFromFiles("", "", ""); tc != nil || err != nil {
		t.Fatal(tc, err)
	}
	if _, err := auth.TLSFromFiles(cert, "", ca); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatal(err)
	}
	// Two peers loaded from files authenticate each other.
	cert2, key2, _ := p.Files(t, dir, "rank1")
	tc2, err := auth.TLSFromFiles(cert2, key2, ca)
	if err != nil {
		t.Fatal(err)
	}
	if cerr, serr := run(t, auth.Config{TLS: tc}, auth.Config{TLS: tc2}); cerr != nil || serr != nil {
		t.Fatal(cerr, serr)
	}
}

func FuzzMessage(f *testing.F) {
	f.Add([]byte("HMCAUTH1\x01\x02" + strings.Repeat("\x00", 54)))
	f.Add(bytes.Repeat([]byte{0xff}, 64))
	f.Fuzz(func(t *testing.T, b []byte) {
		auth.DecodeForTest(b)
	})
}
