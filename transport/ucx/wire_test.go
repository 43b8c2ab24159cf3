package ucx

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/hmc-go/hmc/status"
)

func TestBootstrapRoundTrip(t *testing.T) {
	h := hello{rank: 7, listenPort: 4242, workerAddr: []byte("worker-address")}
	got, err := readHello(bytes.NewReader(h.encode()))
	if err != nil || got.rank != 7 || got.listenPort != 4242 || string(got.workerAddr) != "worker-address" {
		t.Fatalf("hello %+v %v", got, err)
	}
	w := welcome{version: version, rank: 3, regionAddr: 0x7f0000000000, regionSize: 1 << 30, rkey: []byte{1, 2, 3}, workerAddr: []byte{9}, token: 0xfeed}
	gw, err := readWelcome(bytes.NewReader(w.encode()))
	if err != nil || gw.rank != 3 || gw.regionAddr != w.regionAddr || gw.regionSize != w.regionSize || gw.token != 0xfeed ||
		!bytes.Equal(gw.rkey, w.rkey) || !bytes.Equal(gw.workerAddr, w.workerAddr) {
		t.Fatalf("welcome %+v %v", gw, err)
	}
	if b := h.encode(); string(b[:4]) != "HMCU" || binary.LittleEndian.Uint16(b[4:]) != version || len(b) != 20+14 {
		t.Fatalf("hello bytes % x", b)
	}
}

func TestBootstrapRejects(t *testing.T) {
	good := hello{rank: 1, listenPort: 1, workerAddr: []byte("a")}.encode()
	mut := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	cases := map[string][]byte{
		"magic":     mut(func(b []byte) []byte { b[0] = 'X'; return b }),
		"version":   mut(func(b []byte) []byte { b[4] = 0; return b }),
		"flags":     mut(func(b []byte) []byte { b[6] = 1; return b }),
		"port":      mut(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[12:], 70000); return b }),
		"empty":     mut(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[16:], 0); return b[:20] }),
		"huge":      mut(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[16:], 1<<30); return b }),
		"truncated": good[:len(good)-1],
		"short":     good[:10],
	}
	for name, b := range cases {
		if _, err := readHello(bytes.NewReader(b)); err == nil {
			t.Errorf("%s: accepted", name)
		} else if status.CodeOf(err) == status.Success {
			t.Errorf("%s: untyped %v", name, err)
		}
	}
	if v9, err := readHello(bytes.NewReader(mut(func(b []byte) []byte { b[4] = 9; return b }))); err != nil || v9.version != version {
		t.Errorf("a newer initiator: %+v %v", v9, err)
	}
	w := welcome{version: version, regionAddr: ^uint64(0) - 10, regionSize: 100, rkey: []byte{1}, workerAddr: []byte{1}, token: 1}.encode()
	if _, err := readWelcome(bytes.NewReader(w)); !errors.Is(err, status.ErrProtocol) {
		t.Errorf("wrapping region accepted: %v", err)
	}
	z := welcome{version: 3, regionAddr: 1 << 40, regionSize: 100, rkey: []byte{1}, workerAddr: []byte{1}}.encode()
	if _, err := readWelcome(bytes.NewReader(z)); !errors.Is(err, status.ErrProtocol) {
		t.Errorf("a version-3 welcome with link token 0 accepted: %v", err)
	}
	old := welcome{version: 2, regionAddr: 1 << 40, regionSize: 100, rkey: []byte{1}, workerAddr: []byte{1}, token: 7}.encode()
	if w2, err := readWelcome(bytes.NewReader(old)); err != nil || w2.token != 0 {
		t.Errorf("a version-2 welcome: %+v %v (it has no token)", w2, err)
	}
}

func FuzzReadHello(f *testing.F) {
	f.Add(hello{rank: 1, listenPort: 2, workerAddr: []byte("x")}.encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := readHello(bytes.NewReader(b))
		if err == nil && (len(h.workerAddr) == 0 || len(h.workerAddr) > maxBlob || h.listenPort > 65535) {
			t.Fatalf("accepted %+v", h)
		}
	})
}

// Region messages: whatever reads encodes back to the same bytes; a bad one is a typed error.
func FuzzLinkMsg(f *testing.F) {
	f.Add(linkMsg{typ: lmResolve, key: 3, id: 1, a: 64, b: 8}.encode())
	f.Add(linkMsg{typ: lmResolved, key: 3, id: 1, a: 1 << 40, b: 4096}.encode())
	f.Add(linkMsg{typ: lmRevoke, key: 3}.encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := readLinkMsg(bytes.NewReader(b), lmResolve, lmRevoked, lmResolved, lmRevoke)
		if err != nil {
			return
		}
		if again := m.encode(); !bytes.Equal(again, b[:linkMsgSize]) {
			t.Fatalf("% x re-encodes as % x", b[:linkMsgSize], again)
		}
	})
}

// The welcome: reading never panics, never allocates past maxBlob, and whatever reads encodes
// back to the bytes it came from.
func FuzzReadWelcome(f *testing.F) {
	f.Add(welcome{version: version, rank: 3, regionAddr: 1 << 40, regionSize: 4096, rkey: []byte{1, 2}, workerAddr: []byte{9}, token: 5}.encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		w, err := readWelcome(bytes.NewReader(b))
		if err != nil {
			return
		}
		if again := w.encode(); !bytes.Equal(again, b[:len(again)]) {
			t.Fatalf("welcome % x re-encodes as % x", b, again)
		}
	})
}
