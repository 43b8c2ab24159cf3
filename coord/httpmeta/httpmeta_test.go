package httpmeta

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/hmc-go/hmc/status"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The client against the server: Mooncake's protocol, status codes included.
func TestClientServer(t *testing.T) {
	s, err := Listen("127.0.0.1:0", "")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !strings.HasSuffix(s.URL(), "/metadata") {
		t.Fatalf("URL %q", s.URL())
	}
	c, err := NewClient(s.URL(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	key := "mooncake/ram/127.0.0.1:1234 & ?=" // escaped in the query
	if _, err := c.Get(ctx, key); !errors.Is(err, ErrNotFound) || !errors.Is(err, status.ErrNotFound) {
		t.Fatalf("get of an absent key: %v", err)
	}
	if err := c.Put(ctx, key, []byte(`{"a":1}`)); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Get(ctx, key); err != nil || string(v) != `{"a":1}` {
		t.Fatalf("get: %q %v", v, err)
	}
	if err := c.Put(ctx, key, []byte(`{"a":2}`)); err != nil { // overwrite
		t.Fatal(err)
	}
	if v, _ := c.Get(ctx, key); string(v) != `{"a":2}` {
		t.Fatalf("after overwrite: %q", v)
	}
	if err := c.Put(ctx, "mooncake/rpc_meta/x", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if err := c.Put(ctx, "mooncake/rpc_meta/x", []byte("2")); !errors.Is(err, status.ErrProtocol) || !strings.Contains(err.Error(), "400") {
		t.Fatalf("duplicate rpc_meta: %v", err)
	}
	if err := c.Put(ctx, "mooncake/rpc_meta/x", []byte("1")); err != nil { // the same again: unchanged
		t.Fatalf("same rpc_meta again: %v", err)
	}
	if s.Len() != 2 {
		t.Fatalf("%d keys", s.Len())
	}
	if err := c.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, key); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	// No key, another method: 400, 405.
	for _, tc := range []struct {
		method, query string
		code          int
		url           string
	}{{"GET", "", 400, s.URL()}, {"GET", "?key=%20", 400, s.URL()}, {"POST", "?key=a", 405, s.URL()},
		{"GET", "", 200, strings.TrimSuffix(s.URL(), "/metadata") + "/health"}} {
		req, _ := http.NewRequest(tc.method, tc.url+tc.query, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.code {
			t.Errorf("%s %s: %d, want %d", tc.method, tc.query, resp.StatusCode, tc.code)
		}
	}
	http.DefaultClient.CloseIdleConnections()
}

func TestBadInput(t *testing.T) {
	for _, u := range []string{"", "127.0.0.1:8080", "tcp://127.0.0.1:1/x", "http:///metadata", "http://h:1/m?key=a"} {
		if _, err := NewClient(u, 0); !errors.Is(err, status.ErrInvalidConfig) {
			t.Errorf("NewClient(%q): %v", u, err)
		}
	}
	if _, err := Listen("127.0.0.1:0", "metadata"); !errors.Is(err, status.ErrInvalidConfig) {
		t.Errorf("path without /: %v", err)
	}
	c, _ := NewClient("http://127.0.0.1:1/metadata", 200*time.Millisecond)
	if _, err := c.Get(context.Background(), ""); !errors.Is(err, status.ErrInvalidConfig) {
		t.Errorf("empty key: %v", err)
	}
	// Nothing listens on port 1: an error at once, not a hang.
	if _, err := c.Get(context.Background(), "k"); err == nil || errors.Is(err, ErrNotFound) {
		t.Errorf("dead server: %v", err)
	}
	c.Close()
}
