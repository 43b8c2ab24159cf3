package acceptor

import (
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestServesAndClosesEverything(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{}, 2)
	s := Start[net.Conn](l, l.Accept, func(c net.Conn) {
		served <- struct{}{}
		_, _ = io.Copy(io.Discard, c) // until Close closes c
	}, slog.New(slog.DiscardHandler), "test")
	var clients []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
		<-served
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, c := range clients {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatal("connection still open after Close")
		}
		c.Close()
	}
	if err := s.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	if _, err := net.Dial("tcp", l.Addr().String()); err == nil {
		t.Fatal("still accepting after Close")
	}
}
