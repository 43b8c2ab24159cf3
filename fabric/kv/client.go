package kv

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/fabric/internal/rpc"
	"github.com/hmc-go/hmc/fabric/trans"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/transport"
)

// ClientConfig configures a pool client.
type ClientConfig struct {
	// Master is the master's address ("ip:port"), or the config store its masters lead in
	// (tcp://… or etcd://…: the client follows the pool's leader there, see StartHA).
	Master string
	// Pool names the pool in the store when Master is a store (default "default").
	Pool string
	// UniqueID is this client's transfer engine id ("ip:port"; port 0 picks one): peers move
	// bytes to and from its segment through it.
	UniqueID string
	// Metadata is the transfer engine's metadata URL (default trans.P2P).
	Metadata string
	// SegmentSize is the memory this client lends to the pool (0: none, a client that only
	// puts and gets).
	SegmentSize uint64
	// SegmentMemory is where the segment lives: CPU (the default: shareable host memory) or a
	// device's memory (memory.NvidiaGPU, memory.AMDGPU) on SegmentDevice, registered with the
	// transfer engine as device memory (peers on this host reach it by IPC, others through
	// staging).
	SegmentMemory memory.Type
	SegmentDevice int
	// Kinds are the transports, in order (default: the transfer engine's).
	Kinds []transport.ConnType
	// Heartbeat is how often the client tells the master it lives (default 2 s, and at most a
	// quarter of the master's ClientTTL, which the master tells it; a silent client is dropped).
	Heartbeat time.Duration
	// Timeout bounds each call to the master and each transfer (default 10 s).
	Timeout time.Duration
	// Secret, when set, is proved to the master and to peers.
	Secret []byte
}

// Client puts and gets objects of the pool, moving their bytes itself with its transfer
// engine. Its methods are safe for concurrent use.
type Client struct {
	cfg     ClientConfig
	e       *trans.Engine
	rpc     *rpc.Client
	id      string // the engine's unique id: the client's name at the master
	segment string // the segment it lends at start, "" for none (puts prefer it); guarded by segMu

	segMu   sync.Mutex
	segs    map[string]*lent // the segments it lends, by name; guarded by segMu
	nextSeg int              // guarded by segMu
	stop    chan struct{}
	wg      sync.WaitGroup
	once    sync.Once

	bufMu sync.Mutex
	bufs  map[uint64]uint64 // registered buffers: address -> size; guarded by bufMu

	st       store.Client // the masters' store (HA), nil for one master at cfg.Master
	masterMu sync.Mutex
	master   string // the master's address now; guarded by masterMu
}

// NewClient starts a client: its transfer engine, its segment (mounted at the master) and
// its heartbeat.
func NewClient(ctx context.Context, cfg ClientConfig) (_ *Client, err error) {
	if cfg.Master == "" {
		return nil, fail(InvalidParams, "no master address")
	}
	if cfg.Metadata == "" {
		cfg.Metadata = trans.P2P
	}
	if cfg.UniqueID == "" {
		cfg.UniqueID = "127.0.0.1:0"
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 2 * time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	tc := trans.DefaultConfig()
	tc.UniqueID, tc.Timeout, tc.Secret = cfg.UniqueID, cfg.Timeout, cfg.Secret
	if cfg.Kinds != nil {
		tc.Kinds = cfg.Kinds
	}
	e, err := trans.Create(ctx, cfg.Metadata, tc)
	if err != nil {
		return nil, err
	}
	c := &Client{cfg: cfg, e: e, id: e.UniqueID(), rpc: rpc.NewClient(cfg.Timeout, cfg.Secret), stop: make(chan struct{}), master: cfg.Master}
	defer func() {
		if err != nil {
			c.rpc.Close()
			if c.st != nil {
				_ = c.st.Close()
			}
			_ = e.Close()
			c.freeDevices()
		}
	}()
	if strings.Contains(cfg.Master, "://") {
		if c.st, err = store.Open(ctx, cfg.Master, store.Config{Secret: cfg.Secret}); err != nil {
			return nil, &Error{Code: RPCFail, Msg: fmt.Sprintf("the masters' store %s: %v", cfg.Master, err)}
		}
		if c.master, err = c.leader(ctx); err != nil {
			return nil, err
		}
	}
	var r reply
	if cfg.SegmentSize > 0 {
		l, err := c.lend(cfg.SegmentSize, cfg.SegmentMemory, cfg.SegmentDevice)
		if err != nil {
			return nil, err
		}
		c.segment = c.id
		c.segs = map[string]*lent{c.segment: l}
		if r, err = c.call(ctx, "mount", call{Segment: Segment{Name: c.segment, Base: l.base, Size: l.size}}); err != nil {
			return nil, err
		}
	} else if r, err = c.call(ctx, "heartbeat", call{}); err != nil {
		return nil, err
	}
	if r.TTL > 0 { // beat at least four times within the master's ClientTTL
		c.cfg.Heartbeat = min(c.cfg.Heartbeat, r.TTL/4)
	}
	c.wg.Add(1)
	go c.heartbeat() // owned by c: Close stops it
	return c, nil
}

// lent is a segment the client lends: size bytes at base, host memory from the engine or a
// device's (dev, its allocator).
type lent struct {
	base, size uint64
	dev        *memory.Memory
}

// lend allocates a segment: host memory from the engine (populated now, as RDMA registration
// does), or device memory registered with it.
func (c *Client) lend(size uint64, t memory.Type, device int) (*lent, error) {
	if t == memory.Default || t == memory.CPU {
		base, err := c.e.Malloc(size)
		if err != nil {
			return nil, err
		}
		memory.Prefault(memory.HostSlice(memory.Ptr(base), size))
		return &lent{base: base, size: size}, nil
	}
	m, err := memory.New(device, t)
	if err != nil {
		return nil, fail(InvalidParams, "a %v segment on device %d: %v", t, device, err)
	}
	b, err := m.Alloc(size)
	if err == nil {
		err = c.e.Register(uint64(b.Ptr()), size)
	}
	if err != nil {
		_ = m.Close()
		return nil, fail(InvalidParams, "a %v segment of %d bytes on device %d: %v", t, size, device, err)
	}
	return &lent{base: uint64(b.Ptr()), size: size, dev: m}, nil
}

// free gives a segment's memory back (its registration first).
func (c *Client) free(ctx context.Context, l *lent) error {
	if l.dev == nil {
		return c.e.Free(ctx, l.base)
	}
	return errors.Join(c.e.Deregister(ctx, l.base), l.dev.Close())
}

// freeDevices closes the device segments' allocators (after the engine: no peer reaches them).
func (c *Client) freeDevices() (err error) {
	c.segMu.Lock()
	defer c.segMu.Unlock()
	for _, l := range c.segs {
		if l.dev != nil {
			err = errors.Join(err, l.dev.Close())
		}
	}
	return err
}

// MountSegment lends one more segment of size bytes at location ("" or "cpu": host memory;
// "cuda:N", "hip:N": device N's memory) and returns its name (Mooncake's
// allocate_and_mount_segment).
func (c *Client) MountSegment(ctx context.Context, size uint64, location string) (string, error) {
	t, dev, err := parseLocation(location)
	if err != nil {
		return "", err
	}
	if size == 0 {
		return "", fail(InvalidParams, "a segment of 0 bytes")
	}
	l, err := c.lend(size, t, dev)
	if err != nil {
		return "", err
	}
	c.segMu.Lock()
	c.nextSeg++
	name := fmt.Sprintf("%s#%d", c.id, c.nextSeg)
	if c.segs == nil {
		c.segs = map[string]*lent{}
	}
	c.segs[name] = l
	c.segMu.Unlock()
	if _, err := c.call(ctx, "mount", call{Segment: Segment{Name: name, Base: l.base, Size: l.size}}); err != nil {
		c.segMu.Lock()
		delete(c.segs, name)
		c.segMu.Unlock()
		return "", errors.Join(err, c.free(context.WithoutCancel(ctx), l))
	}
	return name, nil
}

// UnmountSegment takes a segment this client lends out of the pool (its objects without
// another replica go), waits grace for readers still reading it, and frees its memory
// (Mooncake's unmount_and_free_segment).
func (c *Client) UnmountSegment(ctx context.Context, name string, grace time.Duration) error {
	c.segMu.Lock()
	l, ok := c.segs[name]
	c.segMu.Unlock()
	if !ok {
		return fail(SegmentNotFound, "segment %q is not this client's", name)
	}
	if _, err := c.call(ctx, "unmount", call{Segment: Segment{Name: name}}); err != nil {
		return err
	}
	c.segMu.Lock()
	delete(c.segs, name)
	if name == c.segment {
		c.segment = ""
	}
	c.segMu.Unlock()
	select {
	case <-time.After(grace):
	case <-ctx.Done():
	}
	return c.free(context.WithoutCancel(ctx), l)
}

// parseLocation reads Mooncake's segment locations: "", "cpu", "cuda[:N]", "hip[:N]".
func parseLocation(loc string) (memory.Type, int, error) {
	kind, num, hasNum := strings.Cut(loc, ":")
	dev := 0
	if hasNum {
		n, err := strconv.Atoi(num)
		if err != nil || n < 0 {
			return 0, 0, fail(InvalidParams, "location %q: a device number after the colon", loc)
		}
		dev = n
	}
	switch kind {
	case "", "cpu":
		return memory.CPU, 0, nil
	case "cuda":
		return memory.NvidiaGPU, dev, nil
	case "hip":
		return memory.AMDGPU, dev, nil
	}
	return 0, 0, fail(InvalidParams, "location %q (cpu, cuda:N or hip:N)", loc)
}

// ID is the client's name at the master (its transfer engine's unique id).
func (c *Client) ID() string { return c.id }

func (c *Client) heartbeat() {
	defer c.wg.Done()
	t := time.NewTicker(c.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Timeout)
			_, _ = c.call(ctx, "heartbeat", call{}) // a missed beat is retried at the next tick
			cancel()
		}
	}
}

// call asks the master; a reply's code other than OK is the error. Following a pool's leader
// in a store, a master that does not answer (or no longer leads) is replaced by the one the
// store names next, until ctx ends: a takeover costs the caller time, not an error.
func (c *Client) call(ctx context.Context, method string, q call) (reply, error) {
	r, _, err := c.callAt(ctx, method, q)
	return r, err
}

// callAt is call, and says when the attempt that got the reply was sent (a get's lease counts
// from the master's answer, so from no earlier than that).
func (c *Client) callAt(ctx context.Context, method string, q call) (reply, time.Time, error) {
	q.Client = c.id
	c.masterMu.Lock()
	addr := c.master
	c.masterMu.Unlock()
	var r reply
	sent := time.Now()
	err := c.rpc.Call(ctx, addr, method, q, &r)
	for c.st != nil && (err != nil || r.Code == RPCFail) && ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
		if a, lerr := c.leader(ctx); lerr == nil && a != addr {
			c.rpc.Forget(addr)
			addr = a
			c.masterMu.Lock()
			c.master = a
			c.masterMu.Unlock()
		}
		r = reply{}
		sent = time.Now()
		err = c.rpc.Call(ctx, addr, method, q, &r)
	}
	if err != nil {
		return r, sent, &Error{Code: RPCFail, Msg: fmt.Sprintf("%s at master %s: %v", method, addr, err)}
	}
	if r.Code != OK {
		return r, sent, &Error{Code: r.Code, Msg: r.Msg}
	}
	return r, sent, nil
}

// leader is the address of the pool's leading master, waiting for one to lead.
func (c *Client) leader(ctx context.Context) (string, error) {
	for {
		a, err := LeaderOf(ctx, c.st, c.cfg.Pool)
		if err == nil {
			return a, nil
		}
		select {
		case <-ctx.Done():
			return "", &Error{Code: RPCFail, Msg: fmt.Sprintf("no master leads pool %q in %s: %v", c.cfg.Pool, c.cfg.Master, err)}
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Put stores value under key in replicas replicas (at least 1): the master places them (this
// client's own segment first), this client writes every replica, and the object becomes
// visible when all are written. A key that exists is refused (ObjectAlreadyExists).
func (c *Client) Put(ctx context.Context, key string, value []byte, replicas int) error {
	defer runtime.KeepAlive(value)
	return c.BatchPut(ctx, []Item{{Key: key, Parts: []Span{SpanOf(value)}}}, PutOptions{Replicas: replicas})[0]
}

// Get returns a copy of key's value (one call to the master: see GetWith).
func (c *Client) Get(ctx context.Context, key string) ([]byte, error) {
	var buf []byte
	n, err := c.GetWith(ctx, key, func(size uint64) (Span, error) {
		buf = make([]byte, size)
		return SpanOf(buf), nil
	})
	if err != nil {
		return nil, err
	}
	return buf[:n], nil
}

// GetInto reads key's value into dst and returns its length (InvalidParams when dst is
// shorter, as Mooncake's get_into). See BatchGet.
func (c *Client) GetInto(ctx context.Context, key string, dst []byte) (int, error) {
	defer runtime.KeepAlive(dst)
	n, errs := c.BatchGet(ctx, []Item{{Key: key, Parts: []Span{SpanOf(dst)}}})
	return int(n[0]), errs[0]
}

// Exist says whether key names a complete object.
func (c *Client) Exist(ctx context.Context, key string) (bool, error) {
	r, err := c.call(ctx, "exist", call{Key: key})
	return r.Yes, err
}

// Ping asks the master whether it answers (a heartbeat).
func (c *Client) Ping(ctx context.Context) error {
	_, err := c.call(ctx, "heartbeat", call{})
	return err
}

// Size is key's value's size.
func (c *Client) Size(ctx context.Context, key string) (uint64, error) {
	r, err := c.call(ctx, "size", call{Key: key})
	return r.N, err
}

// Remove deletes key (ObjectHasLease while a get's lease lasts, unless force: then a reader
// within its lease may read space reused since).
func (c *Client) Remove(ctx context.Context, key string, force bool) error {
	_, err := c.call(ctx, "remove", call{Key: key, Force: force})
	return err
}

// RemoveByRegex deletes every object whose key matches pattern (leased ones only if force) and
// returns how many.
func (c *Client) RemoveByRegex(ctx context.Context, pattern string, force bool) (int, error) {
	r, err := c.call(ctx, "remove_regex", call{Pattern: pattern, Force: force})
	return int(r.N), err
}

// RemoveAll deletes every object (leased ones only if force) and returns how many.
func (c *Client) RemoveAll(ctx context.Context, force bool) (int, error) {
	r, err := c.call(ctx, "remove_all", call{Force: force})
	return int(r.N), err
}

// Close leaves the pool (its segment and the objects only it held go) and stops the client.
func (c *Client) Close() error {
	var err error
	c.once.Do(func() {
		close(c.stop)
		c.wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Timeout)
		_, lerr := c.call(ctx, "leave", call{})
		cancel()
		c.rpc.Close()
		if c.st != nil {
			lerr = errors.Join(lerr, c.st.Close())
		}
		err = errors.Join(lerr, c.e.Close(), c.freeDevices())
	})
	return err
}

// Engine is the client's transfer engine (tools and benchmarks move bytes beside the pool's).
func (c *Client) Engine() *trans.Engine { return c.e }

// Replicas returns key's replicas (and leases it, as a get does).
func (c *Client) Replicas(ctx context.Context, key string) ([]Buffer, error) {
	r, err := c.call(ctx, "get", call{Key: key})
	return r.Buffers, err
}
