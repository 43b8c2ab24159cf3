package store

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Forever as a Get wait means: wait for the key to be created until the context ends.
const Forever time.Duration = -1

// Limits shared by both backends.
const (
	MaxKeyLen    = 1024           // longest key a client sends (the server accepts 2048)
	MaxValueLen  = 8 << 20        // longest value (the frame body cap is 10 MiB)
	MaxWorldSize = 1024           // most ranks in one store
	NoRank       = -1             // Rank before one is assigned
	maxBody      = 10 << 20       // frame body cap, as upstream
	maxServerKey = 2 * MaxKeyLen  // key cap on the server side, as upstream
	autoRankKey  = "AutoRanking#" // GET on this key assigns a rank (upstream's special key)
	rankLiveKey  = "RankLive#"    // GET on this prefix + a rank: found iff a live link holds it (ours)
	rankDownKey  = "WATCH_RANK_DOWN_KEY"
)

// Store is the key/value part of a config store. Every method may block on the network and
// honours ctx; all are safe for concurrent use. Values returned are the caller's.
type Store interface {
	// Set stores value under key, waking every Get waiting for the key's creation.
	Set(ctx context.Context, key string, value []byte) error
	// Get returns key's value. wait == 0: ErrNotExist at once when absent; wait > 0: wait up to
	// that long for the key to be created (ErrTimeout); wait < 0 (Forever): until the key is
	// created or ctx ends.
	Get(ctx context.Context, key string, wait time.Duration) ([]byte, error)
	// Add adds delta to the decimal integer under key (absent = 0) and returns the new value.
	// Add(ctx, key, 0) is an atomic read. A value that is not a decimal integer is ErrFailed.
	Add(ctx context.Context, key string, delta int64) (int64, error)
	// Append appends value to key's value (creating it) and returns the new length.
	Append(ctx context.Context, key string, value []byte) (int64, error)
	// CompareAndSwap replaces key's value with value if it equals expected, or creates it if it
	// is absent and expected is empty. It returns the previous value (nil when absent): the swap
	// happened iff prev equals expected.
	CompareAndSwap(ctx context.Context, key string, expected, value []byte) (prev []byte, err error)
	// Write patches value into key's value at offset, growing and zero-filling it as needed.
	Write(ctx context.Context, key string, offset uint32, value []byte) error
	// Remove deletes key; ErrNotExist if it was absent.
	Remove(ctx context.Context, key string) error
}

// Client is a connection to a config store: a Store plus ranks and liveness.
type Client interface {
	Store
	// Rank returns this client's rank, NoRank before one is assigned.
	Rank() int
	// WorldSize returns the store's world size (0 when none was set).
	WorldSize() int
	// AssignRank gives this client the lowest free rank below the world size (first come,
	// first served; a dead client's rank is free again) and returns it. A client that has a
	// rank gets it back. A full world is ErrFailed.
	AssignRank(ctx context.Context) (int, error)
	// WatchRankDown calls fn with the rank of every client that goes away after this call
	// (closed, killed, or silent past the liveness timeout). Calls come one at a time from a
	// goroutine of the client; fn must not block for long. cancel stops the calls.
	WatchRankDown(fn func(rank int)) (cancel func())
	// RankLive reports whether a live client holds rank r now: a link that claimed it (the
	// embedded store; an older server answers false) or a lease that holds its key (etcd). A
	// rank-down report that arrives after the rank's process came back (or after a client that
	// was only cut off took its rank again) is then known for a past one.
	RankLive(ctx context.Context, r int) (bool, error)
	// Live returns nil once this client holds its rank in the store: its link is up (the
	// embedded store) or its lease holds its rank's key (etcd). A client cut off long enough
	// to be reported down takes its rank again by itself (a new link, a new lease); Live waits
	// for that, or ctx (ErrIO). A rank another client took meanwhile is ErrFailed. An unranked
	// client is live when it reaches the store.
	Live(ctx context.Context) error
	// Close ends the connection; the client's rank is reported down to the others. Pending
	// calls fail with ErrIO. Idempotent.
	Close() error
}

// Ranking says how a client gets its rank.
type Ranking int

// The ways to get a rank.
const (
	Unranked Ranking = iota // no rank (tools, observers); AssignRank can give one later
	Explicit                // Config.Rank, checked against the world size and the live ranks
	Auto                    // the lowest free rank, at connect (as AssignRank)
)

// Config configures a Client. The zero value is an unranked client with default timeouts.
type Config struct {
	// Ranking selects how the client gets a rank; Rank is the rank when it is Explicit.
	Ranking Ranking
	Rank    int
	// WorldSize bounds ranks (≤ MaxWorldSize); 0 takes the store's.
	WorldSize int
	// Secret, when set, authenticates client and server to each other (HMAC-SHA256 challenge).
	Secret []byte
	// TLS, when set, wraps the link in TLS (1.3 minimum is enforced).
	TLS *tls.Config
	// DialTimeout bounds connecting (retried every 100 ms until then). Default 30 s.
	DialTimeout time.Duration
	// Heartbeat is the liveness period: the embedded client pings this often, an etcd client's
	// lease lives 3 periods. Default 2 s.
	Heartbeat time.Duration
	// Logger receives connection events; nil discards them.
	Logger *slog.Logger
}

// DefaultConfig returns an unranked client's Config with every default filled in.
func DefaultConfig() Config {
	c, _ := (&Config{}).withDefaults() // the zero Config is valid
	return c
}

// Validate rejects impossible settings: a world size or explicit rank out of range, negative
// durations.
func (c Config) Validate() error {
	if c.WorldSize < 0 || c.WorldSize > MaxWorldSize {
		return fmt.Errorf("%w: world size %d outside 0..%d", ErrInvalidKey, c.WorldSize, MaxWorldSize)
	}
	if c.Ranking == Explicit && (c.Rank < 0 || c.Rank >= MaxWorldSize || (c.WorldSize > 0 && c.Rank >= c.WorldSize)) {
		return fmt.Errorf("%w: rank %d outside world of %d", ErrInvalidKey, c.Rank, c.WorldSize)
	}
	if c.DialTimeout < 0 || c.Heartbeat < 0 {
		return fmt.Errorf("%w: negative dial timeout %v or heartbeat %v", ErrInvalidKey, c.DialTimeout, c.Heartbeat)
	}
	return nil
}

func (c *Config) withDefaults() (Config, error) {
	cfg := *c
	if err := cfg.Validate(); err != nil {
		return cfg, err
	}
	if cfg.Ranking != Explicit {
		cfg.Rank = NoRank
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 30 * time.Second
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.TLS != nil {
		cfg.TLS = cfg.TLS.Clone()
		cfg.TLS.MinVersion = tls.VersionTLS13
	}
	return cfg, nil
}

// Open connects to the store at url (tcp://host:port or etcd://host:port[,host:port][/prefix]).
func Open(ctx context.Context, url string, cfg Config) (Client, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	scheme, rest, ok := strings.Cut(url, "://")
	if !ok {
		return nil, fmt.Errorf("%w: store url %q: want tcp://host:port or etcd://host:port", ErrInvalidKey, url)
	}
	switch scheme {
	case "tcp", "tcp6":
		addr, err := ParseTCPAddr(rest)
		if err != nil {
			return nil, err
		}
		tc, err := dialTCP(ctx, addr, c)
		if err != nil {
			return nil, err
		}
		return tc, nil
	case "etcd":
		ec, err := openEtcd(ctx, rest, c)
		if err != nil {
			return nil, err
		}
		return ec, nil
	}
	return nil, fmt.Errorf("%w: store url %q: unknown scheme %q", ErrInvalidKey, url, scheme)
}

// ParseTCPAddr checks the host:port part of a tcp:// URL: an IPv4 address or a bracketed IPv6
// address (a name is accepted too) and a port 1..65535.
func ParseTCPAddr(hostport string) (string, error) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return "", fmt.Errorf("%w: store address %q: %w", ErrInvalidKey, hostport, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return "", fmt.Errorf("%w: store address %q: bad port", ErrInvalidKey, hostport)
	}
	if host == "" {
		return "", fmt.Errorf("%w: store address %q: no host", ErrInvalidKey, hostport)
	}
	return net.JoinHostPort(host, port), nil
}

func checkKey(key string) error {
	if key == "" || len(key) > MaxKeyLen {
		return fmt.Errorf("%w: key of %d bytes (1..%d)", ErrInvalidKey, len(key), MaxKeyLen)
	}
	return nil
}

func checkValue(v []byte) error {
	if len(v) > MaxValueLen {
		return fmt.Errorf("%w: value of %d bytes (max %d)", ErrInvalidMessage, len(v), MaxValueLen)
	}
	return nil
}

// Prefixed returns a view of c whose keys are prefix+key (nested views concatenate, as
// upstream's key wrappers). Ranks and liveness are c's; Close closes c.
func Prefixed(c Client, prefix string) Client {
	if p, ok := c.(*prefixed); ok {
		return &prefixed{Client: p.Client, prefix: p.prefix + prefix}
	}
	return &prefixed{Client: c, prefix: prefix}
}

type prefixed struct {
	Client
	prefix string
}

func (p *prefixed) Set(ctx context.Context, key string, value []byte) error {
	return p.Client.Set(ctx, p.prefix+key, value)
}
func (p *prefixed) Get(ctx context.Context, key string, wait time.Duration) ([]byte, error) {
	return p.Client.Get(ctx, p.prefix+key, wait)
}
func (p *prefixed) Add(ctx context.Context, key string, delta int64) (int64, error) {
	return p.Client.Add(ctx, p.prefix+key, delta)
}
func (p *prefixed) Append(ctx context.Context, key string, value []byte) (int64, error) {
	return p.Client.Append(ctx, p.prefix+key, value)
}
func (p *prefixed) CompareAndSwap(ctx context.Context, key string, expected, value []byte) ([]byte, error) {
	return p.Client.CompareAndSwap(ctx, p.prefix+key, expected, value)
}
func (p *prefixed) Write(ctx context.Context, key string, offset uint32, value []byte) error {
	return p.Client.Write(ctx, p.prefix+key, offset, value)
}
func (p *prefixed) Remove(ctx context.Context, key string) error {
	return p.Client.Remove(ctx, p.prefix+key)
}

// Watch calls fn once with key's value when key comes into existence (at once if it exists),
// from a goroutine it starts; fn gets the error instead if the store fails first. stop ends the
// watch (fn is then not called) and waits for the goroutine.
func Watch(s Store, key string, fn func(value []byte, err error)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // owned by the returned stop
		defer wg.Done()
		v, err := s.Get(ctx, key, Forever)
		if ctx.Err() != nil {
			return
		}
		fn(v, err)
	}()
	return func() { cancel(); wg.Wait() }
}

// RankByName returns the rank registered for name, registering the lowest unused one if the
// name is new (the transfer engine's "rank by unique id"): the same name always gets the same
// rank, across clients and restarts, while the store keeps its state. Ranks are dense from 0;
// worldSize > 0 bounds them (ErrFailed past it).
//
// Slot r is the key "rank_by_name#<r>" holding the name; slots are claimed in order by
// create-if-absent CompareAndSwap and never released, so a name's slot always comes before the
// first free one and a scan from 0 finds it. "rank_by_name/<name>" caches the answer.
func RankByName(ctx context.Context, s Store, name string, worldSize int) (int, error) {
	key := "rank_by_name/" + name
	if err := checkKey(key); err != nil {
		return NoRank, err
	}
	if v, err := s.Get(ctx, key, 0); err == nil {
		return strconv.Atoi(string(v))
	} else if !errors.Is(err, ErrNotExist) {
		return NoRank, err
	}
	limit := MaxWorldSize
	if worldSize > 0 {
		limit = worldSize
	}
	for r := 0; r < limit; r++ {
		prev, err := s.CompareAndSwap(ctx, "rank_by_name#"+strconv.Itoa(r), nil, []byte(name))
		if err != nil {
			return NoRank, err
		}
		if prev == nil || string(prev) == name {
			if err := s.Set(ctx, key, []byte(strconv.Itoa(r))); err != nil {
				return NoRank, err
			}
			return r, nil
		}
	}
	return NoRank, fmt.Errorf("%w: rank for %q: world of %d is full", ErrFailed, name, limit)
}
