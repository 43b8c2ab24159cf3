// Package startup is what the fabric faces (Big Memory, Share Memory, the transfer engine) do
// the same way when they start: default and check the settings they share, join the config
// store (serving it when this process may: upstream's "store racing"; or by name, as the
// transfer engine), set up their groups, and make the host copier (the one piece of a
// transport the faces use directly).
package startup

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/hmc-go/hmc/comm"
	"github.com/hmc-go/hmc/coord/group"
	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport/shm"
)

// DefaultTimeout is upstream's init and control-operation timeout.
const DefaultTimeout = 120 * time.Second

// Settings are what every face's Config carries.
type Settings struct {
	InitTimeout, ControlTimeout time.Duration
	// StartStore lets this process serve the store when the URL's address is local and free.
	StartStore bool
	// BindIP is the address data servers listen on ("" : 127.0.0.1, the faces' default).
	BindIP string
	// Secret and TLS secure the store link (and its server when this process starts it).
	Secret []byte
	TLS    *tls.Config
	// Transports builds the transports; nil: transport/stack's defaults.
	Transports *comm.Registry
	// Logger receives events; nil discards them.
	Logger *slog.Logger
}

// Fill gives zero timeouts upstream's default and a nil Logger a silent one.
func (s *Settings) Fill() {
	if s.InitTimeout == 0 {
		s.InitTimeout = DefaultTimeout
	}
	if s.ControlTimeout == 0 {
		s.ControlTimeout = DefaultTimeout
	}
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate refuses negative timeouts and a bind address that is not an IP, naming the face.
func (s Settings) Validate(face string) error {
	if s.InitTimeout < 0 || s.ControlTimeout < 0 {
		return fmt.Errorf("%s: negative timeout (init %v, control %v): %w", face, s.InitTimeout, s.ControlTimeout, status.ErrInvalidConfig)
	}
	if s.BindIP != "" && net.ParseIP(s.BindIP) == nil {
		return fmt.Errorf("%s: bind address %q is not an IP: %w", face, s.BindIP, status.ErrInvalidConfig)
	}
	return nil
}

// Member is how this process takes its place in the store's world.
type Member struct {
	World int  // ranks in the world
	Rank  int  // this process's rank, unless Auto
	Auto  bool // take the lowest free rank
}

// OpenStore joins the store at url as m: it serves the store itself when s.StartStore is set,
// the URL is a local tcp:// address, and this process is (or may be) rank 0 — the first such
// process serves, the others connect. A store whose world differs from m.World is refused.
func OpenStore(ctx context.Context, face, url string, s Settings, m Member) (store.Client, *store.Server, error) {
	if url == "" {
		return nil, nil, fmt.Errorf("%s: empty store URL: %w", face, status.ErrInvalidConfig)
	}
	cfg := store.Config{Ranking: store.Auto, WorldSize: m.World, Secret: s.Secret, TLS: s.TLS, Logger: s.Logger}
	if !m.Auto {
		cfg.Ranking, cfg.Rank = store.Explicit, m.Rank
	}
	var (
		c   store.Client
		srv *store.Server
		err error
	)
	if s.StartStore && (m.Auto || m.Rank == 0) && LocalStoreURL(url) {
		c, srv, err = store.ServeOrJoin(ctx, url, store.ServerConfig{WorldSize: m.World, Secret: s.Secret, TLS: s.TLS, Logger: s.Logger}, cfg)
	} else {
		c, err = store.Open(ctx, url, cfg)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%s: init: %w", face, err)
	}
	if w := c.WorldSize(); w != 0 && w != m.World {
		_ = c.Close()
		if srv != nil {
			_ = srv.Close()
		}
		return nil, nil, fmt.Errorf("%s: the store's world has %d ranks, not %d: %w", face, w, m.World, status.ErrInvalidConfig)
	}
	return c, srv, nil
}

// OpenStoreByName takes the rank the store keeps for name under prefix (a stable slot: the
// same name gets the same rank back, store.RankByName) and opens a client holding it: how a
// face whose members are known by name rather than by rank (the transfer engine) joins.
func OpenStoreByName(ctx context.Context, face, url string, s Settings, prefix, name string) (store.Client, int, error) {
	cfg := store.Config{Secret: s.Secret, TLS: s.TLS, Logger: s.Logger}
	c, err := store.Open(ctx, url, cfg)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: metadata store: %w", face, err)
	}
	// The unranked link stays open until the ranked one is up: a store whose last client
	// leaves wipes the job's keys, the slot just taken included.
	defer c.Close()
	rank, err := store.RankByName(ctx, store.Prefixed(c, prefix), name, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: slot for %s: %w", face, name, err)
	}
	cfg.Ranking, cfg.Rank = store.Explicit, rank
	// The slot is this name's: a holder the store still counts live is this name's previous
	// engine (closed, or a process restarted under the same name) whose departure the store has
	// not seen yet. Asked again until it has, for up to rankHeldWait.
	wait := time.Now().Add(rankHeldWait)
	for {
		kv, err := store.Open(ctx, url, cfg)
		if err == nil {
			return kv, rank, nil
		}
		if !errors.Is(err, store.ErrRankHeld) || time.Now().After(wait) {
			return nil, 0, fmt.Errorf("%s: metadata store: %w", face, err)
		}
		select {
		case <-ctx.Done():
			return nil, 0, fmt.Errorf("%s: metadata store: %w", face, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// rankHeldWait bounds how long OpenStoreByName waits for its slot's previous holder to go.
const rankHeldWait = 5 * time.Second

// JoinGroup sets up the face's group called name on the store link c: size members, ranks
// 0..size-1, for a static world (0: members join and leave, as Big Memory's), with the control
// timeout for its collectives.
func JoinGroup(ctx context.Context, c store.Client, name string, size int, s Settings) (*group.Group, error) {
	return group.New(ctx, c, name, group.Config{Size: size, Timeout: s.ControlTimeout, Logger: s.Logger})
}

// LocalStoreURL says whether a tcp:// store URL names an address of this host, which this
// process may then serve.
func LocalStoreURL(url string) bool {
	scheme, rest, ok := strings.Cut(url, "://")
	if !ok || (scheme != "tcp" && scheme != "tcp6") {
		return false
	}
	host, _, err := net.SplitHostPort(rest)
	if err != nil {
		return false
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return true
	}
	return comm.IsLocalIP(host)
}

// Copier copies host memory with helper goroutines from 1 MiB (shared memory's copier).
type Copier = shm.Copier

// NewCopier returns a Copier with the shared-memory transport's defaults.
func NewCopier() (*Copier, error) { return shm.NewCopier(shm.DefaultConfig()) }
