package httpmeta

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/hmc-go/hmc/status"
)

// MaxValue bounds a value's size (a PUT body); Mooncake's segment descriptors are kilobytes.
const MaxValue = 16 << 20

// MaxKey bounds a key's length.
const MaxKey = 4096

// ErrNotFound is returned by Client.Get and Client.Delete for an absent key.
var ErrNotFound = fmt.Errorf("httpmeta: no such key: %w", status.ErrNotFound)

// Handler answers the protocol at any path it is mounted on; its zero value is not usable:
// see NewHandler.
type Handler struct {
	mu sync.Mutex
	kv map[string][]byte // guarded by mu
}

// NewHandler returns an empty key/value service.
func NewHandler() *Handler { return &Handler{kv: make(map[string][]byte)} }

// Len returns how many keys are stored.
func (h *Handler) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.kv)
}

// ServeHTTP answers GET, PUT and DELETE of ?key=.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := strings.TrimSpace(r.URL.Query().Get("key"))
	if key == "" || len(key) > MaxKey {
		http.Error(w, fmt.Sprintf("metadata key is required (1..%d bytes)", MaxKey), http.StatusBadRequest)
		return
	}
	switch r.Method {
	case http.MethodGet:
		h.mu.Lock()
		v, ok := h.kv[key]
		h.mu.Unlock()
		if !ok {
			http.Error(w, "metadata not found", http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(v)
	case http.MethodPut:
		v, err := io.ReadAll(io.LimitReader(r.Body, MaxValue+1))
		if err != nil {
			http.Error(w, "reading the value: "+err.Error(), http.StatusBadRequest)
			return
		}
		if len(v) > MaxValue {
			http.Error(w, fmt.Sprintf("value over %d bytes", MaxValue), http.StatusRequestEntityTooLarge)
			return
		}
		h.mu.Lock()
		old, exists := h.kv[key]
		if exists && strings.Contains(key, "rpc_meta") {
			h.mu.Unlock()
			if bytes.Equal(old, v) {
				_, _ = io.WriteString(w, "metadata unchanged")
				return
			}
			http.Error(w, "Duplicate rpc_meta key not allowed", http.StatusBadRequest)
			return
		}
		h.kv[key] = v
		h.mu.Unlock()
		_, _ = io.WriteString(w, "metadata updated")
	case http.MethodDelete:
		h.mu.Lock()
		_, ok := h.kv[key]
		delete(h.kv, key)
		h.mu.Unlock()
		if !ok {
			http.Error(w, "metadata not found", http.StatusNotFound)
			return
		}
		_, _ = io.WriteString(w, "metadata deleted")
	default:
		http.Error(w, "Method not allowed", http.StatusMethodNotAllowed)
	}
}

// Server serves a Handler over HTTP.
type Server struct {
	*Handler
	srv  *http.Server
	l    net.Listener
	path string
	done chan struct{}
}

// Listen serves the protocol at http://addr/path (addr "ip:port", port 0 picks one; path ""
// is /metadata), and GET /health ("OK"), as Mooncake's C++ metadata server.
func Listen(addr, path string) (*Server, error) {
	if path == "" {
		path = "/metadata"
	}
	if !strings.HasPrefix(path, "/") {
		return nil, fmt.Errorf("httpmeta: path %q does not start with /: %w", path, status.ErrInvalidConfig)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("httpmeta: listen on %q: %w: %w", addr, status.ErrInvalidConfig, err)
	}
	s := &Server{Handler: NewHandler(), l: l, path: path, done: make(chan struct{})}
	mux := http.NewServeMux()
	mux.Handle(path, s.Handler)
	mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "OK") })
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute}
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(l) // returns when closed
	}()
	return s, nil
}

// URL returns the metadata URL clients are given, http://ip:port/path.
func (s *Server) URL() string { return "http://" + s.l.Addr().String() + s.path }

// Close stops serving.
func (s *Server) Close() error {
	err := s.srv.Close()
	<-s.done
	return err
}

// Client talks to a metadata server at one URL.
type Client struct {
	url string
	hc  *http.Client
}

// NewClient checks rawURL (http://host:port/path or https://...) and returns its client; each
// request is bounded by its context and by timeout (0: 10 s).
func NewClient(rawURL string, timeout time.Duration) (*Client, error) {
	u, err := url.Parse(rawURL)
	if err == nil && (u.Scheme != "http" && u.Scheme != "https" || u.Host == "" || u.RawQuery != "") {
		err = errors.New("want http://host:port/path")
	}
	if err != nil {
		return nil, fmt.Errorf("httpmeta: metadata URL %q: %w: %w", rawURL, status.ErrInvalidConfig, err)
	}
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	return &Client{url: rawURL, hc: &http.Client{Timeout: timeout}}, nil
}

// URL returns the server's URL.
func (c *Client) URL() string { return c.url }

func (c *Client) do(ctx context.Context, method, key string, body []byte) ([]byte, error) {
	if key == "" || len(key) > MaxKey {
		return nil, fmt.Errorf("httpmeta: key of %d bytes (1..%d): %w", len(key), MaxKey, status.ErrInvalidConfig)
	}
	if len(body) > MaxValue {
		return nil, fmt.Errorf("httpmeta: value of %d bytes (max %d): %w", len(body), MaxValue, status.ErrInvalidConfig)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.url+"?key="+url.QueryEscape(key), bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("httpmeta: %w: %w", status.ErrInvalidConfig, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("httpmeta: %s %s: %w: %w", method, c.url, status.ErrTimeout, err)
		}
		return nil, fmt.Errorf("httpmeta: %s %s: %w: %w", method, c.url, status.ErrFailed, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxValue+1))
	if err != nil {
		return nil, fmt.Errorf("httpmeta: %s %s: %w: %w", method, c.url, status.ErrFailed, err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return nil, fmt.Errorf("%w: %q at %s", ErrNotFound, key, c.url)
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("httpmeta: %s %s key %q: HTTP %d %q: %w", method, c.url, key, resp.StatusCode,
			strings.TrimSpace(string(data[:min(len(data), 200)])), status.ErrProtocol)
	case len(data) > MaxValue:
		return nil, fmt.Errorf("httpmeta: value of %q over %d bytes: %w", key, MaxValue, status.ErrProtocol)
	}
	return data, nil
}

// Get returns key's value (ErrNotFound when absent).
func (c *Client) Get(ctx context.Context, key string) ([]byte, error) {
	return c.do(ctx, http.MethodGet, key, nil)
}

// Put sets key's value.
func (c *Client) Put(ctx context.Context, key string, value []byte) error {
	if value == nil {
		value = []byte{}
	}
	_, err := c.do(ctx, http.MethodPut, key, value)
	return err
}

// Delete removes key (ErrNotFound when absent).
func (c *Client) Delete(ctx context.Context, key string) error {
	_, err := c.do(ctx, http.MethodDelete, key, nil)
	return err
}

// Close releases idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }
