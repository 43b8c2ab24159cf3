package bm

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/hmc-go/hmc/comm"
	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/fabric/internal/startup"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
)

// Limits, as upstream's.
const (
	MaxWorldSize        = store.MaxWorldSize // SMEM_WORLD_SIZE_MAX
	SliceAlign   uint64 = 2 << 20            // every size is a multiple of 2 MiB
	MaxLocalDRAM uint64 = 2 << 40            // per rank
	MaxLocalHBM  uint64 = 64 << 30           // per rank
	MaxID               = 254                // object ids 0..MaxID (upstream's entity slots)
)

// Config configures Init (upstream's smem_bm_config_t).
type Config struct {
	// World is the number of ranks (1..1024); Device the GPU whose memory HBM slices use.
	// DefaultConfig: a world of 1, device 0.
	World, Device int
	// InitTimeout bounds Init (connecting to the store, getting a rank). Default 120 s.
	InitTimeout time.Duration
	// ControlTimeout bounds each control operation (join, leave, descriptor exchange). Default
	// 120 s.
	ControlTimeout time.Duration
	// StartStore lets this process start the store when the URL's address is free and local
	// (upstream's "store racing"). Default true (DefaultConfig).
	StartStore bool
	// AutoRanking takes the lowest free rank from the store; else Rank is this process's rank.
	// Default true, as upstream's code (its header says false).
	AutoRanking bool
	Rank        int
	// BindIP is the address this process's data servers listen on and peers dial (upstream's
	// hcomUrl). Default 127.0.0.1.
	BindIP string
	// Secret and TLS secure the store link (and its server when this process starts it); the
	// secret also authenticates the copy agent's requests and every data link (package auth).
	Secret []byte
	TLS    *tls.Config
	// Transports builds the transports; nil: transport/stack's defaults (stack.New).
	Transports *comm.Registry
	// Logger receives membership and connection events; nil discards them.
	Logger *slog.Logger
}

// DefaultConfig returns upstream's defaults (smem_bm_config_init).
func DefaultConfig() Config {
	return Config{World: 1, InitTimeout: startup.DefaultTimeout, ControlTimeout: startup.DefaultTimeout, StartStore: true, AutoRanking: true}
}

// Validate rejects impossible settings.
func (c Config) Validate() error {
	if err := c.settings().Validate("bm"); err != nil {
		return err
	}
	if !c.AutoRanking && (c.Rank < 0 || c.Rank >= MaxWorldSize) {
		return fmt.Errorf("bm: rank %d: %w", c.Rank, status.ErrInvalidConfig)
	}
	return nil
}

// Fabric is one process's membership of a Big Memory world: its store link and rank
// (upstream's smem_bm_init state, without the process-wide singleton). Objects are made with
// Create.
type Fabric struct {
	cfg      Config
	world    int
	deviceID int
	client   store.Client
	server   *store.Server // non-nil when this process serves the store
	log      *slog.Logger

	mu      sync.Mutex
	objects map[int]*BigMemory // guarded by mu
	closed  bool               // guarded by mu

	devOnce sync.Once
	dev     *memory.Memory // this process's GPU memory, opened on first use
	devErr  error
}

// Init connects to (or starts) the store at storeURL and takes a rank in a world of cfg.World
// ranks. Every face starts the same way: Init or Create(ctx, URL, Config).
func Init(ctx context.Context, storeURL string, cfg Config) (*Fabric, error) {
	worldSize, deviceID := cfg.World, cfg.Device
	set := cfg.settings()
	set.Fill()
	cfg.InitTimeout, cfg.ControlTimeout, cfg.Logger = set.InitTimeout, set.ControlTimeout, set.Logger
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if worldSize < 1 || worldSize > MaxWorldSize {
		return nil, fmt.Errorf("bm: world size %d (want 1..%d): %w", worldSize, MaxWorldSize, status.ErrInvalidConfig)
	}
	if !cfg.AutoRanking && cfg.Rank >= worldSize {
		return nil, fmt.Errorf("bm: rank %d in a world of %d: %w", cfg.Rank, worldSize, status.ErrInvalidConfig)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.InitTimeout)
	defer cancel()
	f := &Fabric{cfg: cfg, world: worldSize, deviceID: deviceID, objects: make(map[int]*BigMemory), log: cfg.Logger}
	var err error
	f.client, f.server, err = startup.OpenStore(ctx, "bm", storeURL, set, startup.Member{World: worldSize, Rank: cfg.Rank, Auto: cfg.AutoRanking})
	if err != nil {
		return nil, err
	}
	return f, nil
}

// settings are cfg's share of what every face is configured with.
func (cfg Config) settings() startup.Settings {
	return startup.Settings{InitTimeout: cfg.InitTimeout, ControlTimeout: cfg.ControlTimeout, StartStore: cfg.StartStore,
		BindIP: cfg.BindIP, Secret: cfg.Secret, TLS: cfg.TLS, Transports: cfg.Transports, Logger: cfg.Logger}
}

// Rank returns this process's rank (upstream's smem_bm_get_rank_id).
func (f *Fabric) Rank() int { return f.client.Rank() }

// WorldSize returns the world's size.
func (f *Fabric) WorldSize() int { return f.world }

// Store returns the store link, for the application's own rendezvous (keys outside the
// objects' namespaces).
func (f *Fabric) Store() store.Client { return f.client }

// Serving says whether this process serves the store.
func (f *Fabric) Serving() bool { return f.server != nil }

// device opens this process's GPU memory on first use.
func (f *Fabric) device() (*memory.Memory, error) {
	f.devOnce.Do(func() {
		f.dev, f.devErr = memory.New(f.deviceID, memory.NvidiaGPU)
		if f.devErr != nil {
			f.devErr = fmt.Errorf("bm: HBM needs GPU memory (CUDA device %d, or %s=1 to emulate one): %w",
				f.deviceID, memory.EmulateGPUEnv, f.devErr)
		}
	})
	return f.dev, f.devErr
}

// Close destroys every object still open and leaves the store (upstream's smem_bm_uninit).
func (f *Fabric) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	objs := make([]*BigMemory, 0, len(f.objects))
	for _, o := range f.objects {
		objs = append(objs, o)
	}
	f.mu.Unlock()
	var errs []error
	for _, o := range objs {
		errs = append(errs, o.Destroy(context.Background()))
	}
	errs = append(errs, f.client.Close())
	if f.server != nil {
		errs = append(errs, f.server.Close())
	}
	if f.dev != nil {
		errs = append(errs, f.dev.Close())
	}
	return errors.Join(errs...)
}
