package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

func TestWireConstantsPinned(t *testing.T) {
	ops := map[Op]int16{OpSet: 0, OpGet: 1, OpAdd: 2, OpRemove: 3, OpAppend: 4, OpCAS: 5, OpWrite: 6, OpWatchRankDown: 7, OpHeartbeat: 8}
	for op, v := range ops {
		if int16(op) != v {
			t.Errorf("op %d = %d", v, op)
		}
	}
	codes := map[Code]int16{CodeSuccess: 0, CodeError: -1, CodeInvalidMessage: -400, CodeInvalidKey: -401, CodeNotExist: -404, CodeRestore: -405, CodeTimeout: -601, CodeIOError: -602}
	for c, v := range codes {
		if int16(c) != v {
			t.Errorf("%v = %d, want %d", c, c, v)
		}
	}
	if headerLen != 16 || connectReqLen != 16 || maxBody != 10<<20 {
		t.Error("frame sizes changed")
	}
	b := connectReq{Rank: 3, World: 8}.encode()
	if !bytes.Equal(b, []byte{0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 8, 0, 0, 0}) {
		t.Errorf("connect request % x", b)
	}
	f := (&message{UserDef: -1, Op: OpGet, Keys: [][]byte{[]byte("k")}}).frame(7, CodeSuccess)
	want := []byte{0, 0, 0, 0, 43, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, // header: type, result, len 43, seq 7, crc
		43, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1, 0, // total, userDef -1, op GET
		1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 'k', // one key "k"
		0, 0, 0, 0, 0, 0, 0, 0} // no values
	if !bytes.Equal(f, want) {
		t.Errorf("frame\n% x\nwant\n% x", f, want)
	}
}

func TestMessageRoundTrip(t *testing.T) {
	m := &message{UserDef: 1234, Op: OpCAS, Keys: [][]byte{[]byte("key")}, Values: [][]byte{nil, []byte("new"), bytes.Repeat([]byte{9}, 1000)}}
	f := m.frame(99, CodeNotExist)
	h, body, err := readFrame(bytes.NewReader(f), make([]byte, headerLen))
	if err != nil || h.Seq != 99 || h.Result != CodeNotExist {
		t.Fatalf("header %+v %v", h, err)
	}
	got, err := decodeMessage(body)
	if err != nil || got.UserDef != 1234 || got.Op != OpCAS || len(got.Keys) != 1 || len(got.Values) != 3 ||
		string(got.Keys[0]) != "key" || len(got.Values[0]) != 0 || !bytes.Equal(got.Values[2], m.Values[2]) {
		t.Fatalf("decoded %+v %v", got, err)
	}
}

func TestDecodeRejects(t *testing.T) {
	good := (&message{Op: OpSet, Keys: [][]byte{[]byte("k")}, Values: [][]byte{[]byte("v")}}).frame(1, 0)[headerLen:]
	cases := map[string][]byte{
		"empty":        {},
		"short":        good[:20],
		"truncated":    good[:len(good)-1],
		"trailing":     append(append([]byte{}, good...), 0),
		"bad total":    func() []byte { b := append([]byte{}, good...); b[0]++; return b }(),
		"many keys":    func() []byte { b := append([]byte{}, good...); binary.LittleEndian.PutUint64(b[18:], 11); return b }(),
		"huge key len": func() []byte { b := append([]byte{}, good...); binary.LittleEndian.PutUint64(b[26:], 1<<62); return b }(),
	}
	for name, b := range cases {
		// fix the total for the cases that are not about it, so the deeper checks run
		if name != "bad total" && len(b) >= 8 {
			binary.LittleEndian.PutUint64(b[0:], uint64(len(b)))
		}
		if _, err := decodeMessage(b); !errors.Is(err, ErrInvalidMessage) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
	var hdr [headerLen]byte
	header{BodyLen: maxBody + 1}.put(hdr[:])
	if _, err := decodeHeader(hdr[:]); !errors.Is(err, ErrInvalidMessage) {
		t.Errorf("oversized body accepted: %v", err)
	}
}

func FuzzDecodeMessage(f *testing.F) {
	f.Add((&message{Op: OpSet, Keys: [][]byte{[]byte("k")}, Values: [][]byte{[]byte("v")}}).frame(1, 0)[headerLen:])
	f.Add((&message{Op: OpCAS, Keys: [][]byte{[]byte("key")}, Values: [][]byte{nil, []byte("x")}}).frame(1, 0)[headerLen:])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMessage(b)
		if err != nil {
			if !errors.Is(err, ErrInvalidMessage) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		// What decodes re-encodes to the same bytes.
		if f := m.frame(0, 0)[headerLen:]; !bytes.Equal(f, b) {
			t.Fatalf("re-encoding differs:\n% x\n% x", f, b)
		}
	})
}

func FuzzConnectRequest(f *testing.F) {
	f.Add(connectReq{Rank: noRankWire}.encode())
	f.Add(connectReq{Rank: 1, World: 4}.encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeConnectReq(b)
		if err != nil {
			return
		}
		if r.World > MaxWorldSize || (r.Rank != noRankWire && r.Rank >= MaxWorldSize) {
			t.Fatalf("accepted %+v", r)
		}
	})
}

// rawLink connects to srv and completes the handshake without a rank.
func rawLink(t *testing.T, srv *Server) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_, _ = c.Write(connectReq{Rank: noRankWire}.encode())
	if res, err := readResult(c); err != nil || res != CodeSuccess {
		t.Fatalf("handshake %v %v", res, err)
	}
	return c
}

// closedByPeer waits for the server to drop c.
func closedByPeer(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, c); err != nil {
		t.Fatalf("link not closed by the server: %v", err)
	}
}

func TestServerDropsBadLinksOnly(t *testing.T) {
	srv, err := Listen("tcp://127.0.0.1:0", ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx := context.Background()
	good, err := Open(ctx, srv.URL(), Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	_ = good.Set(ctx, "k", []byte("kept"))

	badFrames := map[string][]byte{
		"oversized header": func() []byte { var h [headerLen]byte; header{BodyLen: maxBody + 1}.put(h[:]); return h[:] }(),
		"bad type":         func() []byte { var h [headerLen]byte; header{Type: 3}.put(h[:]); return h[:] }(),
		"bad body": func() []byte {
			f := (&message{Op: OpSet, Keys: [][]byte{[]byte("k")}}).frame(1, 0)
			f[headerLen]++ // total size field wrong
			return f
		}(),
	}
	for name, f := range badFrames {
		c := rawLink(t, srv)
		_, _ = c.Write(f)
		closedByPeer(t, c)
		t.Logf("%s: dropped", name)
	}
	// A truncated frame followed by silence and close: the server just drops the link.
	c := rawLink(t, srv)
	f := (&message{Op: OpSet, Keys: [][]byte{[]byte("x")}, Values: [][]byte{[]byte("y")}}).frame(1, 0)
	_, _ = c.Write(f[:len(f)-2])
	_ = c.Close()
	// Bad connect requests.
	for name, req := range map[string][]byte{
		"magic":    {1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
		"rank":     connectReq{Rank: 5000, World: 0}.encode(),
		"world":    connectReq{Rank: noRankWire, World: 5000}.encode(),
		"rank>=ws": connectReq{Rank: 4, World: 4}.encode(),
	} {
		c, err := net.Dial("tcp", srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write(req)
		res, err := readResult(c)
		if err != nil || res == CodeSuccess {
			t.Errorf("connect request %s: result %v %v", name, res, err)
		}
		_ = c.Close()
	}
	// Semantically bad requests get an error reply, the link stays.
	c = rawLink(t, srv)
	for _, m := range []*message{
		{Op: OpSet, Keys: [][]byte{[]byte("k")}}, // no value
		{Op: OpGet},                              // no key
		{Op: 77, Keys: [][]byte{[]byte("k")}},    // unknown op
		{Op: OpAdd, Keys: [][]byte{[]byte("k")}, Values: [][]byte{[]byte("one")}}, // not a number
		{Op: OpWrite, Keys: [][]byte{[]byte("k")}, Values: [][]byte{{1}}},         // no offset
	} {
		_, _ = c.Write(m.frame(5, 0))
		h, _, err := readFrame(c, make([]byte, headerLen))
		if err != nil || h.Result == CodeSuccess || h.Seq != 5 {
			t.Errorf("op %d: reply %+v %v", m.Op, h, err)
		}
	}
	if v, err := good.Get(ctx, "k", 0); err != nil || string(v) != "kept" {
		t.Fatalf("good client after bad links: %q %v", v, err)
	}
}

func TestServerDropsSilentLinks(t *testing.T) {
	srv, err := Listen("tcp://127.0.0.1:0", ServerConfig{LinkTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	obs, err := Open(context.Background(), srv.URL(), Config{Heartbeat: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close()
	downs := make(chan int, 2)
	defer obs.WatchRankDown(func(r int) { downs <- r })()
	c, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = c.Write(connectReq{Rank: 2, World: 4}.encode())
	if res, err := readResult(c); err != nil || res != CodeSuccess {
		t.Fatal(res, err)
	}
	// c never sends a heartbeat; obs does (every 50 ms) and stays.
	select {
	case r := <-downs:
		if r != 2 {
			t.Fatalf("rank down %d", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("silent link never dropped")
	}
	time.Sleep(400 * time.Millisecond)
	if _, err := obs.Add(context.Background(), "alive", 1); err != nil {
		t.Fatalf("heartbeating client dropped: %v", err)
	}
}

func TestServerWipesWhenLastClientLeaves(t *testing.T) {
	srv, err := Listen("tcp://127.0.0.1:0", ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx := context.Background()
	a, _ := Open(ctx, srv.URL(), Config{})
	b, _ := Open(ctx, srv.URL(), Config{})
	_ = a.Set(ctx, "job", []byte("1"))
	_ = a.Close()
	if _, err := b.Get(ctx, "job", 0); err != nil {
		t.Fatalf("state lost while a client remains: %v", err)
	}
	_ = b.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := Open(ctx, srv.URL(), Config{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Get(ctx, "job", 0)
		_ = c.Close()
		if errors.Is(err, ErrNotExist) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("state kept after the last client left: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestParseTCPAddr(t *testing.T) {
	for in, want := range map[string]string{"127.0.0.1:7000": "127.0.0.1:7000", "[::1]:7000": "[::1]:7000", "localhost:1": "localhost:1"} {
		if got, err := ParseTCPAddr(in); err != nil || got != want {
			t.Errorf("%s → %s, %v", in, got, err)
		}
	}
	for _, in := range []string{"::1:7000", "127.0.0.1", "127.0.0.1:99999", ":7000", "[::1]7000"} {
		if _, err := ParseTCPAddr(in); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("%s accepted: %v", in, err)
		}
	}
}

func TestIPv6(t *testing.T) {
	srv, err := Listen("tcp://[::1]:0", ServerConfig{})
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	defer srv.Close()
	c, err := Open(context.Background(), srv.URL(), Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Set(context.Background(), "v6", []byte("ok")); err != nil {
		t.Fatal(err)
	}
}

// A rank-down the store sent before a reply reaches the callbacks before that reply returns:
// a client that reads what another wrote after a rank died has been told of the death. A
// callback that itself calls the store is delayed a little, not deadlocked.
func TestRankDownBeforeLaterReplies(t *testing.T) {
	srv, err := Listen("tcp://127.0.0.1:0", ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx := context.Background()
	obs, err := Open(ctx, srv.URL(), Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close()
	var seen atomic.Int64
	slow := make(chan struct{}) // the callback dawdles, so an unordered reply would overtake it
	defer obs.WatchRankDown(func(r int) {
		<-slow
		seen.Store(int64(r) + 1)
	})()
	for round := range 20 {
		rank := 1 + round%3
		dying, err := Open(ctx, srv.URL(), Config{Ranking: Explicit, Rank: rank, WorldSize: 8})
		if err != nil {
			t.Fatal(err)
		}
		_ = dying.Close()
		// Whoever takes the rank again can do so only after the store let it go (and queued
		// the event to obs); what it writes reaches obs after the event.
		var next Client
		for {
			if next, err = Open(ctx, srv.URL(), Config{Ranking: Explicit, Rank: rank, WorldSize: 8}); err == nil {
				break
			}
			time.Sleep(time.Millisecond)
		}
		key := fmt.Sprintf("after%d", round)
		if err := next.Set(ctx, key, []byte("x")); err != nil {
			t.Fatal(err)
		}
		go func() { time.Sleep(2 * time.Millisecond); slow <- struct{}{} }()
		if _, err := obs.Get(ctx, key, time.Second); err != nil {
			t.Fatal(err)
		}
		if got := seen.Load(); got != int64(rank)+1 {
			t.Fatalf("round %d: Get returned before the rank-down callback of rank %d ran (saw %d)", round, rank, got-1)
		}
		seen.Store(0)
		_ = next.Close()
		go func() { slow <- struct{}{} }() // next's own rank-down
		for seen.Load() == 0 {
			time.Sleep(time.Millisecond)
		}
		seen.Store(0)
	}
	// A callback that calls the store waits for at most awaitMax, then goes on.
	done := make(chan time.Duration, 1)
	defer obs.WatchRankDown(func(int) {
		start := time.Now()
		_, _ = obs.Add(ctx, "from-callback", 1)
		done <- time.Since(start)
	})()
	close(slow)
	c, err := Open(ctx, srv.URL(), Config{Ranking: Explicit, Rank: 5, WorldSize: 8})
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	select {
	case d := <-done:
		if d > 5*awaitMax {
			t.Fatalf("a store call from a callback took %v", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a store call from a rank-down callback deadlocked")
	}
}
