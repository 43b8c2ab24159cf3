// Package rpc is the small request/response channel of the fabric faces: a process asks a peer
// to act for it (Big Memory's copy agent, the transfer engine's hello and notifications). A
// connection carries one request at a time; a frame is a little-endian u32 length (at most
// MaxFrame) and JSON. Errors cross with their status code and, for the sentinels both sides
// name, the sentinel itself, so the caller's error wraps what the server met.
package rpc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/hmc-go/hmc/auth"
	"github.com/hmc-go/hmc/internal/fdconn"
	"github.com/hmc-go/hmc/status"
)

// MaxFrame bounds a frame.
const MaxFrame = 8 << 20

// Sentinel names an error both sides know.
type Sentinel struct {
	Name string
	Err  error
}

// base are the sentinels every channel knows.
var base = []Sentinel{{"out_of_range", status.ErrOutOfRange}, {"peer_closed", status.ErrPeerClosed},
	{"closed", status.ErrClosed}, {"permission", status.ErrPermission}, {"protocol", status.ErrProtocol}}

type request struct {
	Method string          `json:"m"`
	Body   json.RawMessage `json:"b,omitempty"`
}

type response struct {
	Code int             `json:"code"`
	Kind string          `json:"kind,omitempty"`
	Err  string          `json:"err,omitempty"`
	Body json.RawMessage `json:"b,omitempty"`
}

// Handler answers one request: method and its JSON body; the result is marshalled as the
// reply's body.
type Handler func(ctx context.Context, method string, body json.RawMessage) (any, error)

// Server serves requests on a TCP listener.
type Server struct {
	l         net.Listener
	h         Handler
	timeout   time.Duration
	secret    []byte
	sentinels []Sentinel
	wg        sync.WaitGroup

	mu       sync.Mutex
	conns    map[net.Conn]struct{} // guarded by mu
	blocking int                   // conns that are fdconn.Conns; guarded by mu
	closed   bool                  // guarded by mu
}

// Listen serves h on addr ("ip:port"; port 0 picks one). Each request runs with a context
// bounded by timeout. With a secret, only clients that prove it are served (package auth, proto "rpc"). extra
// are the face's own sentinels (checked before the base ones).
func Listen(addr string, h Handler, timeout time.Duration, secret []byte, extra ...Sentinel) (*Server, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("rpc: listen %s: %w: %w", addr, status.ErrFailed, err)
	}
	s := &Server{l: l, h: h, timeout: timeout, secret: secret, sentinels: append(extra, base...), conns: make(map[net.Conn]struct{})}
	inProcess.addServer(s)
	s.wg.Add(1)
	go s.accept() // owned by s: Close stops and waits
	return s, nil
}

// Addr returns the address peers dial.
func (s *Server) Addr() string { return s.l.Addr().String() }

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.l.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			_ = c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serve(c) // owned by s
	}
}

func (s *Server) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		if _, ok := c.(*fdconn.Conn); ok {
			s.blocking--
		}
		s.mu.Unlock()
		_ = c.Close()
	}()
	if _, err := auth.Server(c, auth.Config{Secret: s.secret}, "rpc", time.Now().Add(s.timeout)); err != nil {
		return // refused: auth told the client why
	}
	src := &connReader{c: c}
	r := bufio.NewReader(src)
	if len(s.secret) == 0 {
		_ = c.SetReadDeadline(time.Now().Add(s.timeout))
		if b, err := r.Peek(8); err != nil || auth.Refuse(c, b) != nil {
			return // gone, or a client that authenticates and this side does not
		}
		_ = c.SetReadDeadline(time.Time{})
	}
	for first := true; ; first = false {
		var req request
		if err := readFrame(r, &req); err != nil {
			return
		}
		if first { // the client registered itself before its first request (inProcess)
			c = s.offNetpoll(c)
			src.c = c
		}
		if err := writeFrame(c, s.answer(req.Method, req.Body)); err != nil {
			return
		}
	}
}

// answer runs the handler for one request, bounded by the server's timeout, and makes its
// reply.
func (s *Server) answer(method string, body json.RawMessage) response {
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	out, err := s.h(ctx, method, body)
	cancel()
	var resp response
	if err == nil && out != nil {
		resp.Body, err = json.Marshal(out)
	}
	if err != nil {
		resp = response{Code: int(status.CodeOf(err)), Kind: kind(s.sentinels, err), Err: err.Error()}
	}
	return resp
}

// enter counts a call made to s from this process (callLocal); false once s is closed.
func (s *Server) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	return true
}

// connReader reads the connection serve uses now (it leaves the netpoller after the first
// request, with bytes of the next ones perhaps in the bufio.Reader above).
type connReader struct{ c net.Conn }

func (r *connReader) Read(b []byte) (int, error) { return r.c.Read(b) }

// inProcess holds this process's servers and the addresses of its clients' connections to
// them. A call to such a server with the same secret is a function call (callLocal: with the
// KV master in the process, 144,000 exist calls/s against 55,000 over loopback); one that
// still goes over a socket (another secret, whose refusal the server must send) keeps both
// ends on the netpoller: there one thread runs the client, then the server, then the client,
// where blocking reads would wake a thread per message (29,000 exist calls/s against 52,000).
var inProcess = addrSet{clients: map[string]int{}, servers: map[string]*Server{}}

// localCalls lets calls to a server of this process skip the socket (tests of the wire turn
// it off).
var localCalls = true

type addrSet struct {
	mu      sync.Mutex
	clients map[string]int     // local addresses of clients' connections; guarded by mu
	servers map[string]*Server // by Addr; guarded by mu
}

func (a *addrSet) addServer(s *Server) {
	a.mu.Lock()
	a.servers[s.Addr()] = s
	a.mu.Unlock()
}

func (a *addrSet) removeServer(s *Server) {
	a.mu.Lock()
	if a.servers[s.Addr()] == s {
		delete(a.servers, s.Addr())
	}
	a.mu.Unlock()
}

// server returns this process's server at addr, or nil.
func (a *addrSet) server(addr string) *Server {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.servers[addr]
}

func (a *addrSet) addClient(k string) {
	a.mu.Lock()
	a.clients[k]++
	a.mu.Unlock()
}

func (a *addrSet) removeClient(k string) {
	a.mu.Lock()
	if a.clients[k]--; a.clients[k] <= 0 {
		delete(a.clients, k)
	}
	a.mu.Unlock()
}

func (a *addrSet) hasClient(k string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.clients[k] > 0
}

// maxBlockingConns is how many connections of a Server leave the netpoller (fdconn): each
// holds a thread while it waits for its next request; the connections past it park.
const maxBlockingConns = 64

// offNetpoll returns c's socket as an fdconn.Conn, which the kernel wakes directly when a
// request arrives (the netpoller's hand-off costs a wake-up per request), while fewer than
// maxBlockingConns do; c itself otherwise. The conns entry follows, so Close closes it.
func (s *Server) offNetpoll(c net.Conn) net.Conn {
	if inProcess.hasClient(c.RemoteAddr().String()) {
		return c // a client of this process: one thread may serve both ends with no wake-up
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.blocking >= maxBlockingConns || s.closed {
		return c
	}
	fc, err := fdconn.New(c)
	if err != nil {
		return c
	}
	s.blocking++
	delete(s.conns, c)
	s.conns[fc] = struct{}{}
	return fc
}

func kind(ss []Sentinel, err error) string {
	for _, s := range ss {
		if errors.Is(err, s.Err) {
			return s.Name
		}
	}
	return ""
}

// Close stops serving and waits for the connections' goroutines.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	inProcess.removeServer(s)
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	err := s.l.Close()
	s.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// Client keeps one connection per server address, used by one request at a time.
type Client struct {
	timeout   time.Duration
	secret    []byte
	sentinels []Sentinel

	mu     sync.Mutex
	conns  map[string]*conn // guarded by mu
	closed bool             // guarded by mu
}

type conn struct {
	mu    sync.Mutex // one request at a time
	c     net.Conn
	r     *bufio.Reader
	fresh bool   // no answer read yet on an unauthenticated link: it may be a refusal
	local string // c's local address while it is in inProcess, else ""
}

// drop closes the connection; the next call dials again.
func (cc *conn) drop() {
	if cc.c == nil {
		return
	}
	_ = cc.c.Close()
	cc.c = nil
	if cc.local != "" {
		inProcess.removeClient(cc.local)
		cc.local = ""
	}
}

// NewClient returns a Client whose calls without a deadline are bounded by timeout; with a
// secret it proves it to servers and requires them to prove it back.
func NewClient(timeout time.Duration, secret []byte, extra ...Sentinel) *Client {
	return &Client{timeout: timeout, secret: secret, sentinels: append(extra, base...), conns: make(map[string]*conn)}
}

// Call sends method with req (JSON) to the server at addr and decodes its reply into resp
// (nil: ignored). A failed connection is dropped (the next call dials again) and reads as
// ErrPeerClosed; the server's error comes back wrapping its sentinel.
func (c *Client) Call(ctx context.Context, addr, method string, req, resp any) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return fmt.Errorf("rpc: %w", status.ErrClosed)
	}
	cc := c.conns[addr]
	if cc == nil {
		cc = &conn{}
		c.conns[addr] = cc
	}
	c.mu.Unlock()
	body, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("rpc: %s: %w: %w", method, status.ErrInvalidConfig, err)
	}
	local := inProcess.server(addr)
	if local != nil && localCalls && bytes.Equal(local.secret, c.secret) {
		return c.callLocal(ctx, local, addr, method, body, resp)
	}
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.c == nil {
		var d net.Dialer
		nc, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			if cerr := status.FromContext(ctx); cerr != nil {
				return cerr
			}
			return fmt.Errorf("rpc: %s: %w: %w", addr, status.ErrPeerClosed, err)
		}
		dl, ok := ctx.Deadline()
		if !ok {
			dl = time.Now().Add(c.timeout)
		}
		if _, err := auth.Client(nc, auth.Config{Secret: c.secret}, "rpc", dl); err != nil {
			_ = nc.Close()
			return fmt.Errorf("rpc: %s: %w", addr, err)
		}
		var conn net.Conn = nc
		if local != nil {
			cc.local = nc.LocalAddr().String()
			inProcess.addClient(cc.local) // before the first request: the server looks then
		} else if fc, err := fdconn.New(nc); err == nil {
			conn = fc // the answer wakes this thread directly (nc was closed)
		}
		cc.c, cc.r, cc.fresh = conn, bufio.NewReader(conn), len(c.secret) == 0
	}
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(c.timeout)
	}
	_ = cc.c.SetDeadline(dl)
	var out response
	err = writeFrame(cc.c, request{Method: method, Body: body})
	if err == nil && cc.fresh {
		cc.fresh = false
		if b, perr := cc.r.Peek(8); perr == nil {
			if aerr := auth.Refusal(b, addr); aerr != nil {
				cc.drop()
				return fmt.Errorf("rpc: %w", aerr) // the server demands a secret; this side has none
			}
		}
	}
	if err == nil {
		err = readFrame(cc.r, &out)
	}
	if err != nil {
		cc.drop()
		if cerr := status.FromContext(ctx); cerr != nil {
			return cerr
		}
		return fmt.Errorf("rpc: %s %s: %w: %w", addr, method, status.ErrPeerClosed, err)
	}
	return c.result(method, out, resp)
}

// result decodes a reply into resp (nil: ignored), or returns its error.
func (c *Client) result(method string, out response, resp any) error {
	if out.Code != 0 {
		return fmt.Errorf("%s: %w", out.Err, c.sentinel(out))
	}
	if resp != nil && len(out.Body) > 0 {
		if err := json.Unmarshal(out.Body, resp); err != nil {
			return fmt.Errorf("rpc: %s reply: %w: %w", method, status.ErrProtocol, err)
		}
	}
	return nil
}

// callLocal is Call to a server of this process with the same secret: the request is handed
// to its handler as the connection would hand it (the same JSON body, the server's own
// timeout, the reply's error encoding) without a socket, two system calls and two wake-ups
// per call. The caller's context and timeout bound its wait as they bound a read.
func (c *Client) callLocal(ctx context.Context, s *Server, addr, method string, body json.RawMessage, resp any) error {
	if !s.enter() {
		return fmt.Errorf("rpc: %s %s: %w: %w", addr, method, status.ErrPeerClosed, net.ErrClosed)
	}
	done := make(chan response, 1)
	go func() { // owned by s: its Close waits (enter)
		defer s.wg.Done()
		done <- s.answer(method, body)
	}()
	var timeout <-chan time.Time
	if _, ok := ctx.Deadline(); !ok {
		t := time.NewTimer(c.timeout)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case out := <-done:
		return c.result(method, out, resp)
	case <-ctx.Done():
		return status.FromContext(ctx)
	case <-timeout:
		return fmt.Errorf("rpc: %s %s: %w: %w", addr, method, status.ErrPeerClosed, os.ErrDeadlineExceeded)
	}
}

func (c *Client) sentinel(r response) error {
	for _, s := range c.sentinels {
		if s.Name == r.Kind {
			return s.Err
		}
	}
	return status.Code(r.Code).Err()
}

// Forget closes the connection to addr (its server went away).
func (c *Client) Forget(addr string) {
	c.mu.Lock()
	cc := c.conns[addr]
	delete(c.conns, addr)
	c.mu.Unlock()
	if cc != nil {
		cc.mu.Lock()
		cc.drop()
		cc.mu.Unlock()
	}
}

// Close closes every connection; later calls fail with ErrClosed.
func (c *Client) Close() {
	c.mu.Lock()
	c.closed = true
	conns := c.conns
	c.conns = map[string]*conn{}
	c.mu.Unlock()
	for _, cc := range conns {
		cc.mu.Lock()
		cc.drop()
		cc.mu.Unlock()
	}
}

func writeFrame(w io.Writer, v any) error {
	body, err := encode(v)
	if err != nil {
		return err
	}
	if len(body)-4 > MaxFrame {
		return fmt.Errorf("rpc: frame of %d bytes: %w", len(body)-4, status.ErrInvalidConfig)
	}
	binary.LittleEndian.PutUint32(body, uint32(len(body)-4))
	_, err = w.Write(body)
	return err
}

// encode is v's JSON after 4 bytes of room for the frame's length. Requests and responses are
// written field by field: their bodies are JSON that json.Marshal made already, and marshalling
// the envelope would validate and copy them again (the larger part of a batch call's cost).
func encode(v any) ([]byte, error) {
	b := make([]byte, 4, 64)
	switch f := v.(type) {
	case request:
		b = append(b, `{"m":`...)
		b = appendString(b, f.Method)
		return appendBody(b, f.Body), nil
	case response:
		b = append(b, `{"code":`...)
		b = strconv.AppendInt(b, int64(f.Code), 10)
		if f.Kind != "" {
			b = append(b, `,"kind":`...)
			b = appendString(b, f.Kind)
		}
		if f.Err != "" {
			b = append(b, `,"err":`...)
			b = appendString(b, f.Err)
		}
		return appendBody(b, f.Body), nil
	}
	body, err := json.Marshal(v)
	return append(b, body...), err
}

func appendString(b []byte, s string) []byte {
	q, _ := json.Marshal(s) // a string always marshals
	return append(b, q...)
}

func appendBody(b, body []byte) []byte {
	if len(body) > 0 {
		b = append(b, `,"b":`...)
		b = append(b, body...)
	}
	return append(b, '}')
}

func readFrame(r io.Reader, v any) error {
	var h [4]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return err
	}
	n := binary.LittleEndian.Uint32(h[:])
	if n > MaxFrame {
		return fmt.Errorf("rpc: frame of %d bytes: %w", n, status.ErrProtocol)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return err
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("rpc: frame: %w: %w", status.ErrProtocol, err)
	}
	return nil
}
