package kv

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/hmc-go/hmc/fabric/internal/rpc"
	"github.com/hmc-go/hmc/status"
)

// ServerConfig configures the master's service.
type ServerConfig struct {
	// Addr is where clients reach the master ("ip:port"; port 0 picks one).
	Addr string
	// ClientTTL is how long a client may go without a heartbeat before the master counts it
	// dead and drops its segments (default 10 s; clients beat every ClientTTL/4).
	ClientTTL time.Duration
	// Timeout bounds each request (default 10 s).
	Timeout time.Duration
	// Secret, when set, admits only clients that prove it.
	Secret []byte
}

// Server serves a Master to clients over the fabric's request channel.
type Server struct {
	m    *Master
	cfg  ServerConfig
	srv  *rpc.Server
	stop chan struct{}
	wg   sync.WaitGroup

	mu    sync.Mutex
	beats map[string]time.Time // client -> last heartbeat; guarded by mu
}

// Serve starts serving m.
func Serve(m *Master, cfg ServerConfig) (*Server, error) {
	if cfg.ClientTTL <= 0 {
		cfg.ClientTTL = 10 * time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	s := &Server{m: m, cfg: cfg, stop: make(chan struct{}), beats: map[string]time.Time{}}
	srv, err := rpc.Listen(cfg.Addr, s.handle, cfg.Timeout, cfg.Secret)
	if err != nil {
		return nil, fmt.Errorf("kv: master: %w", err)
	}
	s.srv = srv
	s.wg.Add(1)
	go s.reap() // owned by s: Close stops it
	return s, nil
}

// Addr is the address clients dial.
func (s *Server) Addr() string { return s.srv.Addr() }

// Close stops serving.
func (s *Server) Close() error {
	close(s.stop)
	s.wg.Wait()
	return s.srv.Close()
}

// reap counts clients without a heartbeat for ClientTTL dead: their segments leave the pool.
func (s *Server) reap() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.ClientTTL / 4)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case now := <-t.C:
			s.mu.Lock()
			var dead []string
			for c, at := range s.beats {
				if now.Sub(at) > s.cfg.ClientTTL {
					dead = append(dead, c)
					delete(s.beats, c)
				}
			}
			s.mu.Unlock()
			for _, c := range dead {
				s.m.ClientDown(c)
			}
		}
	}
}

// left is how long a lease ending at until lasts from now, by the master's clock.
func (s *Server) left(until time.Time) time.Duration {
	if until.IsZero() {
		return 0
	}
	return until.Sub(s.m.cfg.Now())
}

func (s *Server) beat(client string) {
	s.mu.Lock()
	s.beats[client] = time.Now()
	s.mu.Unlock()
}

// call is one request's body: the fields each method uses.
type call struct {
	Client   string  `json:"client,omitempty"`
	Key      string  `json:"key,omitempty"`
	Size     uint64  `json:"size,omitempty"`
	Replicas int     `json:"replicas,omitempty"`
	Prefer   string  `json:"prefer,omitempty"`
	Segment  Segment `json:"segment"`
	Pattern  string  `json:"pattern,omitempty"`
	Force    bool    `json:"force,omitempty"`
	Upsert   bool    `json:"upsert,omitempty"`
	// Keys and Sizes are a batch method's objects (Sizes: batch_put_start's).
	Keys  []string `json:"keys,omitempty"`
	Sizes []uint64 `json:"sizes,omitempty"`
}

// item is one object's answer in a batch reply.
type item struct {
	Code    Code     `json:"code,omitempty"`
	Msg     string   `json:"msg,omitempty"`
	Buffers []Buffer `json:"buffers,omitempty"`
	// Lease is how long the get's lease lasts from when the master answered (a duration, not
	// a time: clients on other hosts need not share the master's clock).
	Lease time.Duration `json:"lease,omitempty"`
	Yes   bool          `json:"yes,omitempty"`
}

func itemOf(err error) item {
	if err == nil {
		return item{}
	}
	it := item{Code: CodeOf(err), Msg: err.Error()}
	if e, ok := err.(*Error); ok {
		it.Msg = e.Msg
	}
	return it
}

// maxBatch bounds a batch request's objects.
const maxBatch = 1 << 16

// reply is every answer: Mooncake's code and what was wrong, and the method's results.
type reply struct {
	Code    Code          `json:"code"`
	Msg     string        `json:"msg,omitempty"`
	Buffers []Buffer      `json:"buffers,omitempty"`
	Lease   time.Duration `json:"lease,omitempty"` // as item.Lease
	N       uint64        `json:"n,omitempty"`
	Yes     bool          `json:"yes,omitempty"`
	// TTL is the master's ClientTTL (in mount and heartbeat replies): clients beat well within
	// it.
	TTL time.Duration `json:"ttl,omitempty"`
	// Items are a batch method's answers, one per key in order.
	Items []item `json:"items,omitempty"`
}

func answer(r reply, err error) (any, error) {
	if err != nil {
		r.Code = CodeOf(err)
		r.Msg = err.Error()
		if e, ok := err.(*Error); ok {
			r.Msg = e.Msg
		}
	}
	return r, nil
}

func (s *Server) handle(_ context.Context, method string, body json.RawMessage) (any, error) {
	var c call
	if err := json.Unmarshal(body, &c); err != nil {
		return nil, fmt.Errorf("kv: %s: %w: %w", method, status.ErrProtocol, err)
	}
	if c.Client != "" {
		s.beat(c.Client)
	}
	m := s.m
	switch method {
	case "heartbeat":
		return reply{TTL: s.cfg.ClientTTL}, nil
	case "mount":
		c.Segment.Client = c.Client
		return answer(reply{TTL: s.cfg.ClientTTL}, m.MountSegment(c.Segment))
	case "unmount":
		return answer(reply{}, m.UnmountSegment(c.Client, c.Segment.Name))
	case "put_start":
		start := m.PutStart
		if c.Upsert {
			start = m.UpsertStart
		}
		bufs, err := start(c.Client, c.Key, c.Size, c.Replicas, c.Prefer)
		return answer(reply{Buffers: bufs}, err)
	case "put_end":
		return answer(reply{}, m.PutEnd(c.Client, c.Key))
	case "put_revoke":
		return answer(reply{}, m.PutRevoke(c.Client, c.Key))
	case "get":
		bufs, lease, err := m.GetReplicaList(c.Key)
		return answer(reply{Buffers: bufs, Lease: s.left(lease)}, err)
	case "exist":
		return reply{Yes: m.Exist(c.Key)}, nil
	case "size":
		n, err := m.Size(c.Key)
		return answer(reply{N: n}, err)
	case "remove":
		return answer(reply{}, m.Remove(c.Key, c.Force))
	case "remove_regex":
		n, err := m.RemoveByRegex(c.Pattern, c.Force)
		return answer(reply{N: uint64(n)}, err)
	case "remove_all":
		return reply{N: uint64(m.RemoveAll(c.Force))}, nil
	case "batch_put_start", "batch_put_end", "batch_put_revoke", "batch_get", "batch_exist", "batch_remove":
		return s.batch(method, c)
	case "leave":
		s.mu.Lock()
		delete(s.beats, c.Client)
		s.mu.Unlock()
		m.ClientDown(c.Client)
		return reply{}, nil
	}
	return nil, fmt.Errorf("kv: no method %q: %w", method, status.ErrProtocol)
}

// batch answers a batch method: one item per key, in order, each with its own code.
func (s *Server) batch(method string, c call) (any, error) {
	if len(c.Keys) > maxBatch {
		return answer(reply{}, fail(InvalidParams, "%s of %d keys (at most %d)", method, len(c.Keys), maxBatch))
	}
	if method == "batch_put_start" && len(c.Sizes) != len(c.Keys) {
		return answer(reply{}, fail(InvalidParams, "%s: %d keys, %d sizes", method, len(c.Keys), len(c.Sizes)))
	}
	m := s.m
	items := make([]item, len(c.Keys))
	for i, k := range c.Keys {
		var err error
		switch method {
		case "batch_put_start":
			start := m.PutStart
			if c.Upsert {
				start = m.UpsertStart
			}
			items[i].Buffers, err = start(c.Client, k, c.Sizes[i], c.Replicas, c.Prefer)
		case "batch_put_end":
			err = m.PutEnd(c.Client, k)
		case "batch_put_revoke":
			err = m.PutRevoke(c.Client, k)
		case "batch_get":
			var lease time.Time
			items[i].Buffers, lease, err = m.GetReplicaList(k)
			items[i].Lease = s.left(lease)
		case "batch_exist":
			items[i].Yes = m.Exist(k)
		case "batch_remove":
			err = m.Remove(k, c.Force)
		}
		if err != nil {
			items[i] = itemOf(err)
		}
	}
	return reply{Items: items}, nil
}
