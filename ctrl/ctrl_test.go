package ctrl

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/hmc-go/hmc/internal/racebuild"
	"github.com/hmc-go/hmc/status"
)

func TestMain(m *testing.M) {
	runChild() // a re-executed side of BenchmarkRoundTripProcesses
	goleak.VerifyTestMain(m)
}

func TestHeaderPinned(t *testing.T) {
	if HeaderSize != 8 || TypeInt != 1 || TypeStruct != 2 || FlagHello != 0x8000 {
		t.Fatal("constants drifted from upstream HMC")
	}
	h := MakeHeader(TypeInt, 0x0102, 0x01020304)
	want := []byte{0x01, 0x00, 0x02, 0x01, 0x04, 0x03, 0x02, 0x01}
	if !bytes.Equal(h[:], want) {
		t.Fatalf("header % x, want % x", h[:], want)
	}
	hello := AppendHello(nil, 7)
	wantHello := []byte{0x02, 0x00, 0x00, 0x80, 0x04, 0x00, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00}
	if !bytes.Equal(hello, wantHello) {
		t.Fatalf("hello % x, want % x", hello, wantHello)
	}
	var hh Header
	copy(hh[:], hello)
	r, err := ParseHello(hh, hello[8:])
	if err != nil || r != 7 {
		t.Fatalf("ParseHello = %d, %v", r, err)
	}
	if UDSPathFor("/tmp/", 3) != "/tmp/hmc_ctrl_rank_3.sock" || UDSPathFor("/x", 0) != "/x/hmc_ctrl_rank_0.sock" {
		t.Fatal("UDSPathFor")
	}
}

// readSpin is the Config.ReadSpin of newManager's Managers (TestPollingReads sets it).
var readSpin time.Duration

func newManager(t testing.TB, _ uint32) *Manager {
	t.Helper()
	m, err := New(Config{HelloTimeout: time.Second, ReadSpin: readSpin})

	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// pair returns a server (rank 0) and a client (rank 1) connected over tr.
func pair(t testing.TB, tr Transport) (srv, cli *Manager) {
	srv, cli = newManager(t, 0), newManager(t, 1)
	ctx := ctxT(t)
	switch tr {
	case TCP:
		if err := srv.Listen("127.0.0.1", 0, ""); err != nil {
			t.Fatal(err)
		}
		if err := cli.DialTCP(ctx, 0, 1, srv.TCPAddr().String()); err != nil {
			t.Fatal(err)
		}
	case UDS:
		path := UDSPathFor(t.TempDir(), 0)
		if err := srv.Listen("", -1, path); err != nil {
			t.Fatal(err)
		}
		if err := cli.DialUDS(ctx, 0, 1, path); err != nil {
			t.Fatal(err)
		}
	}
	if err := srv.WaitPeer(ctx, 1); err != nil {
		t.Fatal(err)
	}
	return srv, cli
}

type point struct {
	X, Y int32
	Tag  uint64
}

func TestSendRecvBothWays(t *testing.T) {
	for _, tr := range []Transport{TCP, UDS} {
		t.Run(tr.String(), func(t *testing.T) {
			srv, cli := pair(t, tr)
			ctx := ctxT(t)
			if err := cli.SendU64(ctx, 0, 0xDEADBEEFCAFE); err != nil {
				t.Fatal(err)
			}
			if v, err := srv.RecvU64(ctx, 1); err != nil || v != 0xDEADBEEFCAFE {
				t.Fatalf("RecvU64 = %x, %v", v, err)
			}
			if err := srv.SendInt(ctx, 1, -42); err != nil {
				t.Fatal(err)
			}
			if v, err := cli.RecvInt(ctx, 0); err != nil || v != -42 {
				t.Fatalf("RecvInt = %d, %v", v, err)
			}
			if err := cli.SendStruct(ctx, 0, point{1, -2, 3}); err != nil {
				t.Fatal(err)
			}
			var p point
			if err := srv.RecvStruct(ctx, 1, &p); err != nil || p != (point{1, -2, 3}) {
				t.Fatalf("RecvStruct = %+v, %v", p, err)
			}
			big := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB, writev path
			if err := cli.Send(ctx, 0, TypeStruct, 0, big); err != nil {
				t.Fatal(err)
			}
			msg, err := srv.Recv(ctx, 1)
			if err != nil || !bytes.Equal(msg.Payload, big) {
				t.Fatalf("big frame: %v", err)
			}
			// A typed receive of the wrong kind consumes the message and says so.
			_ = cli.SendInt(ctx, 0, 1)
			if _, err := srv.RecvU64(ctx, 1); !errors.Is(err, status.ErrProtocol) {
				t.Fatalf("RecvU64 of an int: %v", err)
			}
			for _, n := range []int{4, 12} { // a struct of word size, and one larger than a word
				_ = cli.Send(ctx, 0, TypeStruct, 0, make([]byte, n))
				if _, err := srv.RecvU64(ctx, 1); !errors.Is(err, status.ErrProtocol) {
					t.Fatalf("RecvU64 of a %d-byte struct: %v", n, err)
				}
			}
			_ = cli.SendU64(ctx, 0, 42)
			if v, err := srv.RecvU64(ctx, 1); err != nil || v != 42 {
				t.Fatalf("RecvU64 after the refused ones: %d, %v", v, err)
			}
			if srv.PeerAddr(1) == nil || !srv.HasPeer(1) || srv.HasPeer(9) {
				t.Fatal("peer bookkeeping")
			}
		})
	}
}

// TestPollingReads runs the tests that read, interrupt reads and end connections again with
// reads that poll their sockets before parking (Config.ReadSpin).
func TestPollingReads(t *testing.T) {
	readSpin = 50 * time.Microsecond
	defer func() { readSpin = 0 }()
	for name, f := range map[string]func(*testing.T){
		"SendRecvBothWays":                    TestSendRecvBothWays,
		"RecvWaitsForLatePeer":                TestRecvWaitsForLatePeer,
		"RecvDeadline":                        TestRecvDeadline,
		"PeerDeathIsAnError":                  TestPeerDeathIsAnError,
		"CloseUnblocksWaiters":                TestCloseUnblocksWaiters,
		"ReconnectReplaces":                   TestReconnectReplaces,
		"RecvTimeoutMidFrameLosesNothing":     TestRecvTimeoutMidFrameLosesNothing,
		"ConcurrentReceiversOfDifferentTypes": TestConcurrentReceiversOfDifferentTypes,
		"FullInboxKeepsOrder":                 TestFullInboxKeepsOrder,
	} {
		t.Run(name, f)
	}
	if _, err := New(Config{ReadSpin: -1}); !errors.Is(err, status.ErrInvalidConfig) {
		t.Errorf("a negative ReadSpin: %v", err)
	}
}

func TestInternalTypesAreSeparate(t *testing.T) {
	srv, cli := pair(t, UDS)
	ctx := ctxT(t)
	_ = cli.Send(ctx, 0, FirstInternalType+1, 0, []byte("internal"))
	_ = cli.SendU64(ctx, 0, 5)
	if v, err := srv.RecvU64(ctx, 1); err != nil || v != 5 {
		t.Fatalf("user message behind an internal one: %d %v", v, err)
	}
	msg, err := srv.RecvType(ctx, 1, FirstInternalType+1)
	if err != nil || string(msg.Payload) != "internal" {
		t.Fatalf("RecvType: %q %v", msg.Payload, err)
	}
	if _, err := srv.RecvType(ctx, 1, TypeInt); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatal(err)
	}
}

func TestRecvWaitsForLatePeer(t *testing.T) {
	srv := newManager(t, 0)
	if err := srv.Listen("127.0.0.1", 0, ""); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	got := make(chan uint64, 1)
	go func() {
		v, err := srv.RecvU64(ctx, 5)
		if err != nil {
			t.Error(err)
		}
		got <- v
	}()
	time.Sleep(50 * time.Millisecond)
	cli := newManager(t, 5)
	if err := cli.DialTCP(ctx, 0, 5, srv.TCPAddr().String()); err != nil {
		t.Fatal(err)
	}
	if err := cli.SendU64(ctx, 0, 77); err != nil {
		t.Fatal(err)
	}
	if v := <-got; v != 77 {
		t.Fatalf("got %d", v)
	}
}

func TestRecvDeadline(t *testing.T) {
	srv, _ := pair(t, TCP)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := srv.Recv(ctx, 1)
	if !errors.Is(err, status.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}
	if time.Since(start) > 2*time.Second {
		t.Fatal("deadline not honoured")
	}
	// Never-seen rank: waits, then times out.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel2()
	if err := srv.SendU64(ctx2, 99, 1); !errors.Is(err, status.ErrTimeout) {
		t.Fatalf("send to absent rank: %v", err)
	}
}

func TestConcurrentSendersNeverInterleave(t *testing.T) {
	srv, cli := pair(t, TCP)
	ctx := ctxT(t)
	// Senders of frames (under the connection's write lock) and of u64s (one fdconn call
	// each, no lock of their own) at once.
	const senders, words, each = 8, 4, 50
	var wg sync.WaitGroup
	for s := range senders {
		wg.Go(func() {
			for i := range each {
				size := 100 + (s*each+i)*97%20000 // mixes the small-copy and writev paths
				p := bytes.Repeat([]byte{byte(s)}, size)
				binary.LittleEndian.PutUint32(p, uint32(size))
				if err := cli.Send(ctx, 0, TypeStruct, 0, p); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	for w := range words {
		wg.Go(func() {
			for i := range each {
				if err := cli.SendU64(ctx, 0, uint64(w)<<32|uint64(i)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	next := make([]uint64, words) // each word sender's next value: its u64s arrive in order
	for range (senders + words) * each {
		msg, err := srv.Recv(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		p := msg.Payload
		if msg.Type == TypeInt {
			v := binary.LittleEndian.Uint64(p)
			if len(p) != 8 || v>>32 >= words || uint64(uint32(v)) != next[v>>32] {
				t.Fatalf("u64 %#x (%d bytes): frames interleaved or reordered", v, len(p))
			}
			next[v>>32]++
			continue
		}
		if int(binary.LittleEndian.Uint32(p)) != len(p) {
			t.Fatal("length prefix mismatch: frames interleaved")
		}
		for _, b := range p[4:] {
			if b != p[len(p)-1] {
				t.Fatal("mixed bytes: frames interleaved")
			}
		}
	}
	wg.Wait()
}

// TestWordsAllocateNothing: a u64 sent and received (the round trip of upstream's tags)
// allocates nothing on either side.
func TestWordsAllocateNothing(t *testing.T) {
	if racebuild.Enabled {
		t.Skip("the race detector allocates")
	}
	srv, cli := pair(t, UDS)
	ctx := ctxT(t)
	allocs := testing.AllocsPerRun(1000, func() {
		if err := cli.SendU64(ctx, 0, 7); err != nil {
			t.Fatal(err)
		}
		if v, err := srv.RecvU64(ctx, 1); err != nil || v != 7 {
			t.Fatal(v, err)
		}
		if err := srv.SendInt(ctx, 1, -5); err != nil {
			t.Fatal(err)
		}
		if v, err := cli.RecvInt(ctx, 0); err != nil || v != -5 {
			t.Fatal(v, err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per u64 and int round trip, want 0", allocs)
	}
}

func TestPeerDeathIsAnError(t *testing.T) {
	srv, cli := pair(t, TCP)
	ctx := ctxT(t)
	_ = cli.SendU64(ctx, 0, 1)
	cli.Close()
	if v, err := srv.RecvU64(ctx, 1); err != nil || v != 1 {
		t.Fatalf("queued message lost: %v", err)
	}
	start := time.Now()
	if _, err := srv.Recv(ctx, 1); !errors.Is(err, status.ErrPeerClosed) {
		t.Fatalf("recv from dead peer: %v", err)
	}
	if time.Since(start) > 2*time.Second {
		t.Fatal("slow")
	}
	if err := srv.SendU64(ctx, 1, 2); err == nil {
		t.Fatal("send to dead peer succeeded")
	}
}

func TestMalformedFrames(t *testing.T) {
	cases := []struct {
		name  string
		bytes []byte
	}{
		{"not hello", MakeHeader(TypeInt, 0, 4).bytes(0, 0, 0, 0)},
		{"hello too long", MakeHeader(TypeStruct, FlagHello, 8).bytes(1, 0, 0, 0, 0, 0, 0, 0)},
		{"oversized frame after hello", append(AppendHello(nil, 3), MakeHeader(TypeInt, 0, DefaultMaxFrame+1).bytes()...)},
		{"second hello", append(AppendHello(nil, 3), AppendHello(nil, 3)...)},
		{"truncated frame", append(AppendHello(nil, 3), MakeHeader(TypeInt, 0, 100).bytes(1, 2, 3)...)},
		{"silent", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := newManager(t, 0)
			if err := srv.Listen("127.0.0.1", 0, ""); err != nil {
				t.Fatal(err)
			}
			c, err := net.Dial("tcp", srv.TCPAddr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_, _ = c.Write(tc.bytes)
			if tc.name == "truncated frame" {
				_ = c.(*net.TCPConn).CloseWrite()
			}
			// The server must close the connection (EOF on our side) within the hello timeout.
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			var b [1]byte
			if _, err := c.Read(b[:]); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("server kept the connection: %v", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			if _, err := srv.Recv(ctx, 3); err == nil {
				t.Fatal("a message was delivered from a malformed stream")
			}
		})
	}
}

func (h Header) bytes(payload ...byte) []byte { return append(h[:], payload...) }

func TestUDSLiveSocketIsNotStolen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "s.sock")
	a := newManager(t, 0)
	if err := a.Listen("", -1, path); err != nil {
		t.Fatal(err)
	}
	b := newManager(t, 0)
	if err := b.Listen("", -1, path); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatalf("second server on a live socket: %v", err)
	}
	// A stale socket file (no server) is replaced.
	stale := filepath.Join(dir, "stale.sock")
	l, _ := net.Listen("unix", stale)
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	if err := b.Listen("", -1, stale); err != nil {
		t.Fatalf("stale socket: %v", err)
	}
	// A regular file is not removed.
	reg := filepath.Join(dir, "file")
	_ = os.WriteFile(reg, []byte("x"), 0o600)
	c := newManager(t, 0)
	if err := c.Listen("", -1, reg); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatalf("regular file: %v", err)
	}
	if _, err := os.Stat(reg); err != nil {
		t.Fatal("regular file removed")
	}
	a.Close()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("socket not unlinked on Close: %v", err)
	}
}

func TestListenErrors(t *testing.T) {
	m := newManager(t, 0)
	if err := m.Listen("127.0.0.1", -1, ""); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatal(err)
	}
	if err := m.Listen("127.0.0.1", 70000, ""); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatal(err)
	}
	if err := m.Listen("127.0.0.1", 0, ""); err != nil {
		t.Fatal(err)
	}
	if err := m.Listen("127.0.0.1", 0, ""); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatal("second listen", err)
	}
	n := newManager(t, 0)
	if err := n.Listen("127.0.0.1", m.TCPAddr().Port, ""); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatalf("port in use: %v", err)
	}
	if err := n.DialTCP(ctxT(t), 1, 0, ""); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatal(err)
	}
	if err := n.DialUDS(ctxT(t), 1, 0, filepath.Join(t.TempDir(), "none.sock")); !errors.Is(err, status.ErrFailed) {
		t.Fatal(err)
	}
	if err := n.ClosePeer(42); !errors.Is(err, status.ErrNotFound) {
		t.Fatal(err)
	}
	if err := n.Send(ctxT(t), 1, TypeStruct, FlagHello, nil); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatal(err)
	}
	if _, err := New(Config{InboxDepth: -1}); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatal(err)
	}
}

func TestCloseUnblocksWaiters(t *testing.T) {
	srv, _ := pair(t, UDS)
	errc := make(chan error, 2)
	go func() { _, err := srv.Recv(context.Background(), 1); errc <- err }()
	go func() { _, err := srv.Recv(context.Background(), 77); errc <- err }()
	time.Sleep(20 * time.Millisecond)
	srv.Close()
	for range 2 {
		select {
		case err := <-errc:
			if err == nil {
				t.Fatal("nil error after Close")
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Close did not unblock Recv")
		}
	}
	if _, err := srv.peerFor(1); !errors.Is(err, status.ErrClosed) {
		t.Fatal(err)
	}
}

func TestCloseAllKeepsListening(t *testing.T) {
	srv, cli := pair(t, TCP)
	ctx := ctxT(t)
	srv.CloseAll()
	if srv.HasPeer(1) {
		t.Fatal("peer still connected after CloseAll")
	}
	cli2 := newManager(t, 1)
	if err := cli2.DialTCP(ctx, 0, 1, srv.TCPAddr().String()); err != nil {
		t.Fatalf("listener stopped: %v", err)
	}
	_ = cli2.SendU64(ctx, 0, 3)
	if v, err := srv.RecvU64(ctx, 1); err != nil || v != 3 {
		t.Fatal(v, err)
	}
	_ = cli
}

func TestReconnectReplaces(t *testing.T) {
	srv, cli := pair(t, TCP)
	ctx := ctxT(t)
	// A Recv already reading the old connection goes on with the new one.
	got := make(chan error, 1)
	go func() {
		v, err := srv.RecvU64(ctx, 1)
		if err == nil && v != 2 {
			err = fmt.Errorf("got %d", v)
		}
		got <- err
	}()
	time.Sleep(20 * time.Millisecond) // let it take the old connection's read token
	cli2 := newManager(t, 1)
	if err := cli2.DialTCP(ctx, 0, 1, srv.TCPAddr().String()); err != nil {
		t.Fatal(err)
	}
	_ = cli2.SendU64(ctx, 0, 2)
	if err := <-got; err != nil {
		t.Fatalf("Recv across the replacement: %v", err)
	}
	// The old client's connection was closed by the server.
	deadline := time.Now().Add(5 * time.Second)
	for cli.HasPeer(0) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if cli.HasPeer(0) {
		t.Fatal("replaced connection still open")
	}
	if err := srv.ClosePeer(1); err != nil {
		t.Fatal(err)
	}
}

func FuzzHeader(f *testing.F) {
	f.Add(AppendHello(nil, 1))
	f.Add(MakeHeader(TypeInt, 0, 8).bytes(1, 2, 3, 4, 5, 6, 7, 8))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < HeaderSize {
			return
		}
		var h Header
		copy(h[:], b)
		if err := h.Check(1024); err == nil && (h.Length() > 1024 || h.IsHello()) {
			t.Fatal("Check accepted a bad header")
		}
		if r, err := ParseHello(h, b[HeaderSize:]); err == nil {
			if !bytes.Equal(AppendHello(nil, r), b) {
				t.Fatal("hello does not round-trip")
			}
		}
		h2 := MakeHeader(h.Type(), h.Flags(), h.Length())
		if h2 != h {
			t.Fatal("header does not round-trip")
		}
	})
}

func BenchmarkRoundTrip(b *testing.B) {
	for _, tr := range []Transport{TCP, UDS} {
		b.Run(tr.String(), func(b *testing.B) {
			srv, cli := pair(b, tr)
			ctx := context.Background()
			done := make(chan struct{})
			go func() {
				defer close(done)
				for {
					v, err := srv.RecvU64(ctx, 1)
					if err != nil || srv.SendU64(ctx, 1, v) != nil {
						return
					}
				}
			}()
			for b.Loop() {
				if err := cli.SendU64(ctx, 0, 1); err != nil {
					b.Fatal(err)
				}
				if _, err := cli.RecvU64(ctx, 0); err != nil {
					b.Fatal(err)
				}
			}
			cli.Close()
			<-done
		})
	}
}

// rawPeer connects to srv's TCP listener as rank 3 and says HELLO, so a test can write
// frames byte by byte.
func rawPeer(t *testing.T, srv *Manager) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", srv.TCPAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := c.Write(AppendHello(nil, 3)); err != nil {
		t.Fatal(err)
	}
	if err := srv.WaitPeer(ctxT(t), 3); err != nil {
		t.Fatal(err)
	}
	return c
}

// A Recv that reads the socket itself and whose context ends in the middle of a frame loses
// no byte: the next Recv returns the frame whole. Small frames (one buffer) and large ones
// (read in parts) alike, and while the connection's own reader is idle or active.
func TestRecvTimeoutMidFrameLosesNothing(t *testing.T) {
	for _, size := range []int{5, 100 << 10} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			srv := newManager(t, 0)
			if err := srv.Listen("127.0.0.1", 0, ""); err != nil {
				t.Fatal(err)
			}
			c := rawPeer(t, srv)
			payload := make([]byte, size)
			for i := range payload {
				payload[i] = byte(i * 7)
			}
			frame := append(MakeHeader(TypeStruct, 0, uint32(size)).bytes(), payload...)
			cuts := []int{3, HeaderSize + size/3, HeaderSize + size - 1, len(frame)}
			prev := 0
			for i, cut := range cuts {
				if _, err := c.Write(frame[prev:cut]); err != nil {
					t.Fatal(err)
				}
				prev = cut
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
				msg, err := srv.Recv(ctx, 3)
				cancel()
				if i < len(cuts)-1 {
					if status.CodeOf(err) != status.Timeout {
						t.Fatalf("cut %d: Recv of a partial frame = %v", cut, err)
					}
					continue
				}
				if err != nil || msg.Type != TypeStruct || !bytes.Equal(msg.Payload, payload) {
					t.Fatalf("whole frame: %v (type %#x, %d bytes)", err, msg.Type, len(msg.Payload))
				}
			}
			// and the stream is still in step
			if _, err := c.Write(MakeHeader(TypeInt, 0, 8).bytes(9, 0, 0, 0, 0, 0, 0, 0)); err != nil {
				t.Fatal(err)
			}
			if v, err := srv.RecvU64(ctxT(t), 3); err != nil || v != 9 {
				t.Fatalf("next frame: %d %v", v, err)
			}
		})
	}
}

// Receivers of different inboxes wait at once: whichever reads the socket hands the others
// their messages, in order, and none waits for a message that already arrived.
func TestConcurrentReceiversOfDifferentTypes(t *testing.T) {
	srv, cli := pair(t, UDS)
	ctx := ctxT(t)
	const n = 2000
	internal := FirstInternalType + 3
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	wg.Add(2)
	go func() {
		defer wg.Done()
		for i := range n {
			v, err := srv.RecvU64(ctx, 1)
			if err != nil || v != uint64(i) {
				errs <- fmt.Errorf("user %d: %d %v", i, v, err)
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		for i := range n {
			msg, err := srv.RecvType(ctx, 1, internal)
			if err != nil || len(msg.Payload) != 8 || binary.LittleEndian.Uint64(msg.Payload) != uint64(i) {
				errs <- fmt.Errorf("internal %d: %v %v", i, msg.Payload, err)
				return
			}
		}
	}()
	for i := range n {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], uint64(i))
		if err := cli.Send(ctx, 0, internal, 0, b[:]); err != nil {
			t.Fatal(err)
		}
		if err := cli.SendU64(ctx, 0, uint64(i)); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// With a tiny inbox the connection's reader fills it and holds the next frame; receivers get
// every message in order, whichever of them reads the socket.
func TestFullInboxKeepsOrder(t *testing.T) {
	srv, err := New(Config{InboxDepth: 2, ReadSpin: readSpin})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	if err := srv.Listen("127.0.0.1", 0, ""); err != nil {
		t.Fatal(err)
	}
	cli := newManager(t, 1)
	ctx := ctxT(t)
	if err := cli.DialTCP(ctx, 0, 1, srv.TCPAddr().String()); err != nil {
		t.Fatal(err)
	}
	const n = 50
	for i := range n {
		if err := cli.SendU64(ctx, 0, uint64(i)); err != nil {
			t.Fatal(err)
		}
		if i == 5 {
			time.Sleep(100 * time.Millisecond) // the reader fills the inbox and holds one
		}
	}
	for i := range n {
		if v, err := srv.RecvU64(ctx, 1); err != nil || v != uint64(i) {
			t.Fatalf("message %d: %d %v", i, v, err)
		}
	}
}
