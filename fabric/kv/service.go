package kv

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
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

	journal *journal // a leader's log (HA); nil: the state lives in this process only
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

	jmu     sync.Mutex // orders changes and their log entries (HA)
	lost    leaderState
	waiting atomic.Bool // a new leader loading the pool's state: it answers nothing yet
}

// errTakingOver answers requests that reach a new leader before it has loaded the pool.
var errTakingOver = &Error{Code: RPCFail, Msg: "this master is taking over the pool and does not serve yet"}

// markReady lets a new leader answer.
func (s *Server) markReady() { s.waiting.Store(false) }

// leading is nil while the server may answer: always without a journal, and with one until
// a log write failed.
func (s *Server) leading() error {
	if p := s.lost.lost.Load(); p != nil {
		return *p
	}
	return nil
}

// change runs f, a change of the pool, and with a journal logs what it did (the keys it removed,
// then f's entry) before the answer goes out: what a client was told is in the log. A log
// write that fails ends this master's leadership.
func (s *Server) change(f func() entry) error {
	j := s.cfg.journal
	if j == nil {
		f()
		return nil
	}
	s.jmu.Lock()
	defer s.jmu.Unlock()
	if err := s.leading(); err != nil {
		return err
	}
	e := f()
	e.Removed = s.m.drainRemoved()
	if e.Op == "" && len(e.Removed) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
	defer cancel()
	if err := j.write(ctx, e); err != nil {
		lost := error(&Error{Code: RPCFail, Msg: fmt.Sprintf("this master no longer leads: logging a change: %v", err)})
		s.lost.lost.Store(&lost)
		return lost
	}
	return nil
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
	s.waiting.Store(cfg.journal != nil) // a leader answers once it has loaded the pool (markReady)
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
	err := s.srv.Close()
	if j := s.cfg.journal; j != nil {
		j.wg.Wait()
	}
	return err
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
				_ = s.change(func() entry {
					s.m.ClientDown(c)
					return entry{Op: "down", Client: c}
				})
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
	var it item
	it.Code, it.Msg = codeAndMsg(err)
	return it
}

// err is the item's failure as an Error, nil for OK.
func (it item) err() error {
	if it.Code == OK {
		return nil
	}
	return &Error{Code: it.Code, Msg: it.Msg}
}

// codeAndMsg is err's Mooncake code and what was wrong, for a reply (OK and "" for nil).
func codeAndMsg(err error) (Code, string) {
	if err == nil {
		return OK, ""
	}
	if e, ok := err.(*Error); ok {
		return e.Code, e.Msg
	}
	return CodeOf(err), err.Error()
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
		r.Code, r.Msg = codeAndMsg(err)
	}
	return r, nil
}

func (s *Server) handle(_ context.Context, method string, body json.RawMessage) (any, error) {
	var c call
	if err := json.Unmarshal(body, &c); err != nil {
		return nil, fmt.Errorf("kv: %s: %w: %w", method, status.ErrProtocol, err)
	}
	if s.waiting.Load() {
		return answer(reply{}, errTakingOver)
	}
	if err := s.leading(); err != nil {
		return answer(reply{}, err)
	}
	if c.Client != "" {
		s.beat(c.Client)
	}
	m := s.m
	var r reply
	var err error
	switch method {
	case "heartbeat":
		return reply{TTL: s.cfg.ClientTTL}, nil
	case "get":
		bufs, lease, err := m.GetReplicaList(c.Key)
		return answer(reply{Buffers: bufs, Lease: s.left(lease)}, err)
	case "exist":
		return reply{Yes: m.Exist(c.Key)}, nil
	case "size":
		n, err := m.Size(c.Key)
		return answer(reply{N: n}, err)
	case "batch_get", "batch_exist":
		return s.batch(method, c)
	case "batch_put_start", "batch_put_end", "batch_put_revoke", "batch_remove":
		var out any
		jerr := s.change(func() entry {
			var e entry
			out, e = s.batchChange(method, c)
			return e
		})
		if jerr != nil {
			return answer(reply{}, jerr)
		}
		return out, nil
	case "mount", "unmount", "put_start", "put_end", "put_revoke", "remove", "remove_regex", "remove_all", "leave":
	default:
		return nil, fmt.Errorf("kv: no method %q: %w", method, status.ErrProtocol)
	}
	jerr := s.change(func() (e entry) {
		switch method {
		case "mount":
			c.Segment.Client = c.Client
			r.TTL = s.cfg.ClientTTL
			if err = m.MountSegment(c.Segment); err == nil {
				e = entry{Op: "mount", Segment: c.Segment}
			}
		case "unmount":
			if err = m.UnmountSegment(c.Client, c.Segment.Name); err == nil {
				e = entry{Op: "unmount", Segment: Segment{Name: c.Segment.Name}}
			}
		case "put_start":
			start := m.PutStart
			if c.Upsert {
				start = m.UpsertStart
			}
			if r.Buffers, err = start(c.Client, c.Key, c.Size, c.Replicas, c.Prefer); err == nil {
				e = entry{Op: "start", Client: c.Client, Objects: []placed{{Key: c.Key, Size: c.Size, Replicas: r.Buffers}}}
			}
		case "put_end":
			if err = m.PutEnd(c.Client, c.Key); err == nil {
				e = entry{Op: "end", Client: c.Client, Keys: []string{c.Key}}
			}
		case "put_revoke":
			err = m.PutRevoke(c.Client, c.Key)
		case "remove":
			err = m.Remove(c.Key, c.Force)
		case "remove_regex":
			var n int
			n, err = m.RemoveByRegex(c.Pattern, c.Force)
			r.N = uint64(n)
		case "remove_all":
			r.N = uint64(m.RemoveAll(c.Force))
		case "leave":
			s.mu.Lock()
			delete(s.beats, c.Client)
			s.mu.Unlock()
			m.ClientDown(c.Client)
			e = entry{Op: "down", Client: c.Client}
		}
		return e
	})
	if jerr != nil {
		return answer(reply{}, jerr)
	}
	return answer(r, err)
}

// batchChange runs a batch method that changes the pool and returns its answer and log entry.
func (s *Server) batchChange(method string, c call) (any, entry) {
	out, _ := s.batch(method, c)
	r, ok := out.(reply)
	if !ok || len(r.Items) != len(c.Keys) {
		return out, entry{}
	}
	var e entry
	switch method {
	case "batch_put_start":
		e = entry{Op: "start", Client: c.Client}
		for i, it := range r.Items {
			if it.Code == OK {
				e.Objects = append(e.Objects, placed{Key: c.Keys[i], Size: c.Sizes[i], Replicas: it.Buffers})
			}
		}
	case "batch_put_end":
		e = entry{Op: "end", Client: c.Client}
		for i, it := range r.Items {
			if it.Code == OK {
				e.Keys = append(e.Keys, c.Keys[i])
			}
		}
	}
	return out, e
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
