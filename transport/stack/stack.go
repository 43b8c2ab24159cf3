package stack

import (
	"fmt"
	"log/slog"

	"github.com/hmc-go/hmc/auth"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/shm"
	"github.com/hmc-go/hmc/transport/tcp"
	"github.com/hmc-go/hmc/transport/ucx"
)

// Config configures each transport. The zero value of each field means its default.
type Config struct {
	// TCP configures the TCP transport.
	TCP tcp.Config
	// SHM configures the same-host shared-memory transport.
	SHM shm.Config
	// UCX configures the UCX transport and RDMA through it (builds with -tags ucx).
	UCX ucx.Config
	// Auth authenticates every link of each transport whose own Auth is zero.
	Auth auth.Config
	// Logger receives each transport's events when its own Logger is nil; nil: silent.
	Logger *slog.Logger
}

// DefaultConfig returns a Config with every transport's defaults filled in.
func DefaultConfig() Config {
	return Config{TCP: tcp.DefaultConfig(), SHM: shm.DefaultConfig(), UCX: ucx.DefaultConfig()}
}

// Validate rejects impossible settings.
func (c Config) Validate() error {
	for _, err := range []error{c.Auth.Validate(), c.TCP.Validate(), c.SHM.Validate(), c.UCX.Validate()} {
		if err != nil {
			return fmt.Errorf("stack: %w", err)
		}
	}
	return nil
}

// New builds the transports: TCP and shared memory always; UCX, and RDMA through it, in -tags
// ucx builds (for a kind that cannot be had the Registry records why).
func New(cfg Config) (*transport.Registry, error) {
	for _, a := range []*auth.Config{&cfg.TCP.Auth, &cfg.SHM.Auth, &cfg.UCX.Auth} {
		if !a.Enabled() {
			*a = cfg.Auth
		}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.TCP.Logger == nil {
		cfg.TCP.Logger = cfg.Logger
	}
	if cfg.SHM.Logger == nil {
		cfg.SHM.Logger = cfg.Logger
	}
	r := transport.NewRegistry()
	t, err := tcp.New(cfg.TCP)
	if err != nil {
		return nil, err
	}
	r.Add(t)
	sh, err := shm.New(cfg.SHM)
	if err != nil {
		return nil, err
	}
	r.Add(sh)
	if u, err := ucx.New(cfg.UCX); err == nil {
		r.Add(u)
	} else {
		r.Unavailable(transport.UCX, err)
	}
	if ucx.Built {
		if rd, err := ucx.NewRDMA(cfg.UCX); err == nil {
			r.Add(rd)
		} else {
			r.Unavailable(transport.RDMA, err)
		}
	} else {
		r.Unavailable(transport.RDMA, fmt.Errorf("%w: RDMA goes through UCX, which this binary was built without (go build -tags ucx)", status.ErrUnsupported))
	}
	return r, nil
}

// SHMSocketName is the name of the shared-memory transport's socket for data port port (the
// TCP port it pairs with): peers find it from the port alone.
func SHMSocketName(port int) string { return shm.SocketName(port) }
