//go:build !ucx || !cgo

package ucx

import (
	"fmt"
	"time"

	"github.com/hmc-go/hmc/auth"
	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// Built says whether this binary has the UCX transport (build tag ucx, cgo).
const Built = false

var errNotBuilt = fmt.Errorf("ucx: %w: this binary was built without UCX (go build -tags ucx, with cgo and libucx-dev)", status.ErrUnsupported)

// Config configures the transport (see the ucx build).
type Config struct {
	TLS          string
	SpinTime     int
	CloseTimeout time.Duration
	Auth         auth.Config
}

// DefaultConfig returns the zero Config (no UCX in this build).
func DefaultConfig() Config { return Config{} }

// Validate rejects impossible settings.
func (c Config) Validate() error {
	if c.SpinTime < 0 || c.CloseTimeout < 0 {
		return fmt.Errorf("ucx: spin time %d us, close timeout %v: %w", c.SpinTime, c.CloseTimeout, status.ErrInvalidConfig)
	}
	return c.Auth.Validate()
}

// New returns a transport whose calls fail with ErrUnsupported (no UCX in this build).
func New(Config) (transport.Transport, error) { return nil, errNotBuilt }

// NewRDMA returns ErrUnsupported (no UCX in this build).
func NewRDMA(Config) (transport.Transport, error) { return nil, errNotBuilt }

// Resource is one UCX transport on one device.
type Resource struct{ Component, MD, Transport, Device string }

// Resources returns ErrUnsupported (no UCX in this build).
func Resources() ([]Resource, error) { return nil, errNotBuilt }

// NewHostBuffer returns ErrUnsupported (no UCX in this build).
func NewHostBuffer(uint64, Config) (*buffer.ConnBuffer, error) { return nil, errNotBuilt }

// ExecWithoutErrorSignals does nothing: without UCX no handler is installed.
func ExecWithoutErrorSignals() error { return nil }

// DeviceMemory says how UCX moves device memory here: not at all in a build without UCX.
func DeviceMemory() string { return "not in this build (no UCX): tcp and shm carry device memory" }
