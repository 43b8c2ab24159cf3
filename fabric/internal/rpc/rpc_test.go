package rpc

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/hmc-go/hmc/status"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var errMine = fmt.Errorf("%w: mine", status.ErrPeerClosed)

// TestCallAndErrors: replies and errors (sentinels both sides name) over the wire and through
// a call to a server of this process.
func TestCallAndErrors(t *testing.T) {
	for _, local := range []bool{false, true} {
		t.Run(fmt.Sprintf("local=%v", local), func(t *testing.T) {
			defer func(was bool) { localCalls = was }(localCalls)
			localCalls = local
			callAndErrors(t)
		})
	}
}

func callAndErrors(t *testing.T) {
	h := func(_ context.Context, method string, body json.RawMessage) (any, error) {
		switch method {
		case "echo":
			var s string
			if err := json.Unmarshal(body, &s); err != nil {
				return nil, err
			}
			return s + "!", nil
		case "range":
			return nil, fmt.Errorf("too far: %w", status.ErrOutOfRange)
		case "mine":
			return nil, fmt.Errorf("custom: %w", errMine)
		}
		return nil, fmt.Errorf("no %q: %w", method, status.ErrNotFound)
	}
	srv, err := Listen("127.0.0.1:0", h, time.Second, nil, Sentinel{"mine", errMine})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	c := NewClient(time.Second, nil, Sentinel{"mine", errMine})
	defer c.Close()
	ctx := context.Background()
	var out string
	if err := c.Call(ctx, srv.Addr(), "echo", "hi", &out); err != nil || out != "hi!" {
		t.Fatalf("echo: %q %v", out, err)
	}
	for method, want := range map[string]error{"range": status.ErrOutOfRange, "mine": errMine, "other": status.ErrNotFound} {
		if err := c.Call(ctx, srv.Addr(), method, nil, nil); !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", method, err, want)
		}
	}
	srv.Close()
	if err := c.Call(ctx, srv.Addr(), "echo", "x", &out); !errors.Is(err, status.ErrPeerClosed) {
		t.Fatalf("call to a closed server: %v", err)
	}
}

// TestLocalCallBounds: a call to a server of this process waits no longer than its context
// (the handler runs on, as it would behind a socket), and Close waits for that handler.
func TestLocalCallBounds(t *testing.T) {
	release := make(chan struct{})
	h := func(context.Context, string, json.RawMessage) (any, error) {
		<-release
		return "late", nil
	}
	srv, err := Listen("127.0.0.1:0", h, 5*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := NewClient(time.Second, nil)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := c.Call(ctx, srv.Addr(), "slow", nil, nil); !errors.Is(err, status.ErrTimeout) || time.Since(start) > 2*time.Second {
		t.Fatalf("call past its context: %v after %v", err, time.Since(start))
	}
	closed := make(chan struct{})
	go func() { srv.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while a handler ran")
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	<-closed
	if err := c.Call(context.Background(), srv.Addr(), "slow", nil, nil); !errors.Is(err, status.ErrPeerClosed) {
		t.Fatalf("call to the closed server: %v", err)
	}
}

// With a shared secret only a client that proves it is served, and a client with a secret
// refuses a server without one.
func TestSharedSecret(t *testing.T) {
	h := func(context.Context, string, json.RawMessage) (any, error) { return "yes", nil }
	srv, err := Listen("127.0.0.1:0", h, time.Second, []byte("s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	open, err := Listen("127.0.0.1:0", h, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	ctx := context.Background()
	for name, c := range map[string]struct {
		client *Client
		addr   string
		ok     bool
	}{
		"right secret":   {NewClient(time.Second, []byte("s3cret")), srv.Addr(), true},
		"wrong secret":   {NewClient(time.Second, []byte("guess")), srv.Addr(), false},
		"no secret":      {NewClient(time.Second, nil), srv.Addr(), false},
		"server without": {NewClient(time.Second, []byte("s3cret")), open.Addr(), false},
		"neither":        {NewClient(time.Second, nil), open.Addr(), true},
	} {
		var out string
		err := c.client.Call(ctx, c.addr, "q", nil, &out)
		c.client.Close()
		if c.ok != (err == nil) || (c.ok && out != "yes") || (!c.ok && !errors.Is(err, status.ErrPermission)) {
			t.Errorf("%s: %q %v", name, out, err)
		}
	}
}

// FuzzReadFrame: any bytes on a request socket are refused or decoded, never a panic or an
// allocation past MaxFrame.
func FuzzReadFrame(f *testing.F) {
	good := func(v any) []byte {
		var b bytes.Buffer
		_ = writeFrame(&b, v)
		return b.Bytes()
	}
	f.Add(good(request{Method: "copy", Body: json.RawMessage(`{"items":[]}`)}))
	f.Add(good(response{Code: 3, Kind: "out_of_range", Err: "x"}))
	huge := binary.LittleEndian.AppendUint32(nil, MaxFrame+1)
	f.Add(huge)
	f.Fuzz(func(t *testing.T, b []byte) {
		var req request
		_ = readFrame(bytes.NewReader(b), &req)
		var resp response
		_ = readFrame(bytes.NewReader(b), &resp)
	})
}

// FuzzEncode: the field-by-field encoding of requests and responses decodes to what
// json.Marshal's would, for any strings and bodies.
func FuzzEncode(f *testing.F) {
	f.Add("put_start", 0, "", "", `{"keys":["a","b"],"sizes":[1,2]}`)
	f.Add("x\"\u2028<>&\\", 7, "protocol", "bad \x00 input", `"s"`)
	f.Add("", -1, "", "", ``)
	f.Fuzz(func(t *testing.T, method string, code int, kind, msg, body string) {
		var raw json.RawMessage
		if body != "" {
			var anyv any
			if json.Unmarshal([]byte(body), &anyv) != nil {
				return
			}
			raw, _ = json.Marshal(anyv)
		}
		for _, v := range []any{request{Method: method, Body: raw}, response{Code: code, Kind: kind, Err: msg, Body: raw}} {
			got, err := encode(v)
			if err != nil {
				t.Fatal(err)
			}
			want, _ := json.Marshal(v)
			var a, b any
			if err := json.Unmarshal(got[4:], &a); err != nil {
				t.Fatalf("%q does not decode: %v", got[4:], err)
			}
			_ = json.Unmarshal(want, &b)
			if ja, jb := fmt.Sprint(a), fmt.Sprint(b); ja != jb {
				t.Fatalf("encoded %q, json.Marshal %q", got[4:], want)
			}
		}
	})
}
