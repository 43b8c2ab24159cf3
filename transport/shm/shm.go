package shm

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/hmc-go/hmc/auth"
	"github.com/hmc-go/hmc/internal/peercred"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// Defaults for Config's zero fields.
const (
	DefaultParallelThreshold = 1 << 20
	DefaultPieceSize         = 512 << 10
	DefaultHandshakeTimeout  = 5 * time.Second
	DefaultDevicePinMax      = 16 << 30
)

// Config configures the shared-memory transport. The zero value of each field means its default.
type Config struct {
	// ParallelThreshold is the transfer size from which a copy is split across goroutines
	// (default 1 MiB).
	ParallelThreshold uint64
	// Workers is the number of goroutines a large copy uses (default GOMAXPROCS, at most 8).
	Workers int
	// PieceSize is the smallest unit the workers of a parallel copy claim (a transfer is cut
	// into about 4 pieces per worker), and the unit of Go's copy of cache-resident data when
	// glibc's memcpy cannot be loaded (default 512 KiB: Go's copy of 1 MiB and more uses
	// non-temporal stores, slower for cache-resident data, faster for huge buffers; env.md).
	PieceSize uint64
	// HugeCopy: transfers above HugeCopy/2 are copied with Go's copy (non-temporal stores, best
	// for data far larger than the caches), smaller ones with glibc's memcpy (default 64 MiB).
	HugeCopy uint64
	// HelperSpin is how long an endpoint's copy helpers keep polling for work after a job
	// before parking (default 200 µs): back-to-back large copies then find them awake instead
	// of paying a thread wake-up. 0 means the default; negative means never spin.
	HelperSpin time.Duration
	// HandshakeTimeout bounds the offer exchange (default 5 s).
	HandshakeTimeout time.Duration
	// DevicePinMax is the largest peer region an initiator with a GPU buffer page-locks for
	// its device at dial, or (a peer's registered region) at the first device copy into or out
	// of it (default 16 GiB; locking makes every page resident and costs about
	// 4 ms per 64 MiB on an H100 host). Larger regions are copied unlocked, at the driver's
	// pageable rate. Negative: never lock.
	DevicePinMax int64
	// AllowUIDs lists the users, besides this process's own, whose processes may connect to a
	// server (and serve an initiator). The kernel's record of the peer (SO_PEERCRED) is
	// checked before anything is sent: a process of any other user gets nothing, not even the
	// offer. Nil: this process's user only.
	AllowUIDs []uint32
	// Auth's secret, when set, is also demanded from every peer at connect, after its user
	// was admitted: the group's processes of one user are then told apart from the user's
	// other jobs. Its TLS is not used: the link never leaves the host, and the bytes move
	// through shared mappings that TLS could not cover.
	Auth auth.Config
	// Logger receives connection events; nil means silent.
	Logger *slog.Logger
}

// peers is the credential policy of Config.AllowUIDs.
func (c *Config) peers() peercred.Policy { return peercred.Policy{UIDs: c.AllowUIDs} }

// DefaultConfig returns a Config with every default filled in.
func DefaultConfig() Config {
	c := Config{}
	c.setDefaults()
	return c
}

func (c *Config) setDefaults() {
	if c.ParallelThreshold == 0 {
		c.ParallelThreshold = DefaultParallelThreshold
	}
	if c.PieceSize == 0 {
		c.PieceSize = DefaultPieceSize
	}
	if c.HugeCopy == 0 {
		c.HugeCopy = 64 << 20
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if c.HelperSpin == 0 {
		c.HelperSpin = 200 * time.Microsecond
	}
	if c.DevicePinMax == 0 {
		c.DevicePinMax = DefaultDevicePinMax
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate rejects impossible settings.
func (c Config) Validate() error {
	if c.Workers < 0 || c.Workers > 64 || c.HandshakeTimeout < 0 {
		return fmt.Errorf("shm: workers %d, handshake timeout %v: %w", c.Workers, c.HandshakeTimeout, status.ErrInvalidConfig)
	}
	if err := c.Auth.Validate(); err != nil {
		return fmt.Errorf("shm: %w", err)
	}
	return nil
}

// Transport is the shared-memory transport.
type Transport struct {
	cfg Config
}

// New returns a shared-memory transport.
func New(cfg Config) (*Transport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	return &Transport{cfg: cfg}, nil
}

// Type returns transport.SHM.
func (t *Transport) Type() transport.ConnType { return transport.SHM }

// SocketName returns the abstract Unix socket name under which a Communicator serves its
// buffer for TCP data port port: same-host initiators that know the port find it there.
func SocketName(port int) string { return fmt.Sprintf("@hmc-shm-%d", port) }

var _ transport.Transport = (*Transport)(nil)
