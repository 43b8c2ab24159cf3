package tcp

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/hmc-go/hmc/auth"
	"github.com/hmc-go/hmc/auth/authtest"
	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/transporttest"
)

func withAuth(t testing.TB, a auth.Config) transport.Transport {
	tr, err := New(Config{ChunkSize: testChunk, Lanes: 2, MaxInflight: 8, Auth: a})
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func TestAuth(t *testing.T) {
	for _, tls := range []bool{false, true} {
		t.Run(map[bool]string{false: "Secret", true: "TLS"}[tls], func(t *testing.T) {
			transporttest.RunAuth(t, transporttest.AuthOptions{Options: transporttest.Options{ChunkSize: testChunk}, With: withAuth, TLS: tls})
		})
	}
}

// The whole conformance suite and RMA on lanes inside TLS with a secret.
func TestConformanceTLS(t *testing.T) {
	a := auth.Config{Secret: []byte("k"), TLS: authtest.NewPKI(t).Peer(t, "rank")}
	o := transporttest.Options{New: func(t testing.TB) transport.Transport { return withAuth(t, a) }, ChunkSize: testChunk}
	transporttest.Run(t, o)
	transporttest.RunRMA(t, o)
}

// An attacker who skips the authentication and pipelines a valid hello, a PUT request and its
// payload gets nothing written: the target reads the first 8 bytes, sees no preamble, refuses
// and closes.
func TestUnauthenticatedPutPipelined(t *testing.T) {
	region, _ := buffer.New(0, 4096, memory.CPU)
	defer region.Close()
	srv, err := withAuth(t, auth.Config{Secret: []byte("k")}).Listen(transport.ServerConfig{BindAddr: "127.0.0.1:0", Region: region})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	c, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var hb [helloSize]byte
	hello{lane: 0, lanes: 1, rank: 9}.encode(&hb)
	var rb [reqSize]byte
	request{op: opPut, id: 1, offset: 0, length: 64}.encode(&rb)
	msg := append(append(hb[:], rb[:]...), bytes.Repeat([]byte{0xEE}, 64)...)
	_, _ = c.Write(msg)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got := make([]byte, 256)
	n, _ := c.Read(got)
	if auth.Refusal(got[:n], "target") == nil {
		t.Fatalf("target answered % x, want a refusal", got[:n])
	}
	if bytes.Contains(region.Bytes(), []byte{0xEE}) {
		t.Fatal("the unauthenticated PUT landed")
	}
}

// BenchmarkDial measures an endpoint's connect (TCP handshake, authentication, hello/welcome
// per lane) and close, with one lane (the price of each authentication per link) and with
// DefaultLanes.
func BenchmarkDial(b *testing.B) {
	p := authtest.NewPKI(b)
	for _, c := range []struct {
		name string
		a    auth.Config
	}{
		{"none", auth.Config{}},
		{"secret", auth.Config{Secret: []byte("k")}},
		{"tls+secret", auth.Config{Secret: []byte("k"), TLS: p.Peer(b, "rank")}},
	} {
		for _, lanes := range []int{1, DefaultLanes} {
			name := fmt.Sprintf("%s/lanes=%d", c.name, lanes)
			b.Run(name, func(b *testing.B) {
				tr := withAuth(b, c.a)
				region, _ := buffer.New(0, 4096, memory.CPU)
				defer region.Close()
				srv, err := tr.Listen(transport.ServerConfig{BindAddr: "127.0.0.1:0", Region: region})
				if err != nil {
					b.Fatal(err)
				}
				defer srv.Close()
				for b.Loop() {
					ep, err := tr.Dial(context.Background(), transport.DialConfig{Addr: srv.Addr(), Local: region, Lanes: lanes})
					if err != nil {
						b.Fatal(err)
					}
					ep.Close()
				}
			})
		}
	}
}
