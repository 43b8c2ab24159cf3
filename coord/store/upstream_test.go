package store

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"
)

// The server answers as upstream's AccStoreServer does, byte for byte (its C++ client parses
// them so): Get's value and CompareAndSwap's previous value packed in a message, everything
// else a bare body ("success", the decimal result of Add and Append, "<not exist>", error text),
// and no answer at all to the rank-down subscription. The fixtures are written from upstream's
// smem_tcp_config_store_server.cpp (SetHandler, GetHandler, AddHandler, RemoveHandler,
// AppendHandler, WriteHandler, CasHandler, WatchRankStateHandler).
func TestRepliesMatchUpstream(t *testing.T) {
	srv, err := Listen("tcp://127.0.0.1:0", ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	c, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(connectReq{Rank: noRankWire}.encode()); err != nil {
		t.Fatal(err)
	}
	var res [2]byte
	if _, err := io.ReadFull(c, res[:]); err != nil || res != [2]byte{} {
		t.Fatalf("connect: % x %v", res, err)
	}
	seq := uint32(10)
	ask := func(m *message) {
		seq++
		if _, err := c.Write(m.frame(seq, 0)); err != nil {
			t.Fatal(err)
		}
	}
	bare := func(code Code, body string) []byte { return bareFrame(seq, code, body) }
	packed := func(op Op, userDef int64, v []byte) []byte {
		return (&message{Op: op, UserDef: userDef, Values: [][]byte{v}}).frame(seq, CodeSuccess)
	}
	expect := func(what string, want []byte) {
		t.Helper()
		got := make([]byte, len(want))
		if _, err := io.ReadFull(c, got); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s:\n got % x\nwant % x", what, got, want)
		}
	}
	k := func(s string) [][]byte { return [][]byte{[]byte(s)} }
	vals := func(v ...string) [][]byte {
		var out [][]byte
		for _, s := range v {
			out = append(out, []byte(s))
		}
		return out
	}
	ask(&message{Op: OpWatchRankDown, Keys: k(rankDownKey)}) // no answer: the next frame is Set's
	watchSeq := seq
	ask(&message{Op: OpSet, Keys: k("key"), Values: vals("value")})
	expect("set", bare(CodeSuccess, "success"))
	ask(&message{Op: OpGet, Keys: k("key")})
	expect("get", packed(OpGet, 0, []byte("value")))
	ask(&message{Op: OpGet, Keys: k("none")})
	expect("get absent", bare(CodeNotExist, "<not exist>"))
	ask(&message{Op: OpGet, UserDef: 1, Keys: k("none")})
	expect("get timed out", bare(CodeTimeout, "<timeout>"))
	ask(&message{Op: OpAdd, Keys: k("n"), Values: vals("5")})
	expect("add (create)", bare(CodeSuccess, "5"))
	ask(&message{Op: OpAdd, Keys: k("n"), Values: vals("-2")})
	expect("add", bare(CodeSuccess, "3"))
	ask(&message{Op: OpAppend, Keys: k("a"), Values: vals("xy")})
	expect("append (create)", bare(CodeSuccess, "2"))
	ask(&message{Op: OpAppend, Keys: k("a"), Values: vals("zzz")})
	expect("append", bare(CodeSuccess, "5"))
	ask(&message{Op: OpCAS, Keys: k("c"), Values: vals("", "one")})
	expect("cas absent", packed(OpCAS, 0, []byte{}))
	ask(&message{Op: OpCAS, Keys: k("c"), Values: vals("one", "two")})
	expect("cas", packed(OpCAS, casExisted, []byte("one")))
	ask(&message{Op: OpCAS, Keys: k("c"), Values: vals("nope", "three")})
	expect("cas refused", packed(OpCAS, casExisted, []byte("two")))
	w := make([]byte, 4+2)
	binary.LittleEndian.PutUint32(w, 3)
	copy(w[4:], "hi")
	ask(&message{Op: OpWrite, Keys: k("w"), Values: [][]byte{w}})
	expect("write", bare(CodeSuccess, "success"))
	ask(&message{Op: OpRemove, Keys: k("w")})
	expect("remove", bare(CodeSuccess, "success"))
	ask(&message{Op: OpRemove, Keys: k("w")})
	expect("remove absent", bare(CodeNotExist, "not exist"))
	if watchSeq == seq {
		t.Fatal("no request after the subscription")
	}
	// Our client reads all of these, and upstream's bare and packed forms, through its API.
	cl, err := Open(t.Context(), srv.URL(), Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if n, err := cl.Add(t.Context(), "n", 10); err != nil || n != 13 {
		t.Fatalf("Add: %d %v", n, err)
	}
	if prev, err := cl.CompareAndSwap(t.Context(), "c", []byte("two"), []byte("")); err != nil || string(prev) != "two" {
		t.Fatalf("CAS: %q %v", prev, err)
	}
	if prev, err := cl.CompareAndSwap(t.Context(), "c", []byte(""), []byte("x")); err != nil || prev == nil || len(prev) != 0 {
		t.Fatalf("CAS on an empty value: %q (nil %v) %v, want an empty, non-nil previous value", prev, prev == nil, err)
	}
}
