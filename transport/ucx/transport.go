//go:build ucx && cgo

package ucx

/*
#cgo pkg-config: ucx
#include "hmc_ucx.h"
*/
import "C"

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/hmc-go/hmc/auth"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// Built says whether this binary has the UCX transport (build tag ucx, cgo).
const Built = true

// Config configures a UCX transport. The zero value lets UCX choose its transports (UCX_TLS and
// the other UCX_* variables of the environment apply).
type Config struct {
	// TLS restricts UCX's transports (UCX's TLS setting, e.g. "tcp" or "posix,cma,self"); it
	// overrides UCX_TLS. Empty: the environment's.
	TLS string
	// SpinTime is how long, in microseconds, the progress loop busy-polls after activity before
	// sleeping on the worker's event fd, and how long a Wait drives progress itself before it
	// blocks. Default 1000 (cmd/hmc and the C face take HMC_UCX_SPIN_US; a target serving
	// software-emulated RMA — UCX's shared-memory transports on memory UCX did not allocate —
	// must answer each fragment; a sleeping target costs a thread wake-up per fragment).
	SpinTime int
	// CloseTimeout bounds how long an endpoint's Close waits for its requests in flight to
	// complete or fail before it abandons the endpoint (see endpoint.Close). Zero: 30 s.
	CloseTimeout time.Duration
	// Auth authenticates the bootstrap link at connect (a shared secret, mutual TLS), which
	// hands out the worker address and rkeys: a peer that cannot prove it gets neither. UCX's
	// own traffic is neither authenticated nor encrypted by it.
	Auth auth.Config
	// PiecewiseVectors posts every piece of a vector put or get as its own put or get even
	// where UCX emulates RMA over tcp, instead of PUTV / GETV active messages (am.go): for
	// comparison.
	// HMC_UCX_PIECEWISE=1 in the environment sets it.
	PiecewiseVectors bool
	rdma             bool
}

// Resource is one UCX transport on one device, as UCT lists them.
type Resource struct{ Component, MD, Transport, Device string }

// Resources lists UCX's transports and devices (UCT's resource query).
func Resources() ([]Resource, error) {
	var st C.ucs_status_t
	s := C.hmc_resources(&st)
	defer C.free(unsafe.Pointer(s))
	if st != C.UCS_OK {
		return nil, fmt.Errorf("ucx: resource query: %s: %w", statusString(st), status.ErrFailed)
	}
	var out []Resource
	for _, line := range strings.Split(strings.TrimSpace(C.GoString(s)), "\n") {
		f := strings.Split(line, "\t")
		if len(f) == 4 {
			out = append(out, Resource{f[0], f[1], f[2], f[3]})
		}
	}
	return out, nil
}

// rdmaTLs are the UCX transports ConnType RDMA may use.
var rdmaTLs = []string{"rc", "ud", "dc"}

func isRDMA(tl string) bool {
	for _, p := range rdmaTLs {
		if strings.HasPrefix(tl, p) {
			return true
		}
	}
	return false
}

// NewRDMA returns the UCX transport restricted to RDMA transports (rc, ud, dc, on any verbs
// device), or ErrUnsupported naming what UCX has when it has none of them.
func NewRDMA(cfg Config) (transport.Transport, error) {
	rs, err := Resources()
	if err != nil {
		return nil, err
	}
	var have, names []string
	for _, r := range rs {
		names = append(names, r.Transport+"/"+r.Device)
		if isRDMA(r.Transport) {
			have = append(have, r.Transport+"/"+r.Device)
		}
	}
	if len(have) == 0 {
		return nil, fmt.Errorf("ucx: rdma: %w: no RDMA transport (rc, ud or dc on a verbs device) among UCX's resources [%s]",
			status.ErrUnsupported, strings.Join(names, " "))
	}
	cfg.TLS, cfg.rdma = "rc,ud,dc,self", true
	return New(cfg)
}

// DefaultConfig returns a Config with every default filled in.
func DefaultConfig() Config {
	c := Config{}
	c.setDefaults()
	return c
}

func (c *Config) setDefaults() {
	if c.SpinTime == 0 {
		c.SpinTime = 1000
	}
	if c.CloseTimeout == 0 {
		c.CloseTimeout = defaultCloseTimeout
	}
	if os.Getenv("HMC_UCX_PIECEWISE") == "1" {
		c.PiecewiseVectors = true
	}
}

// Validate rejects impossible settings.
func (c Config) Validate() error {
	if c.SpinTime < 0 || c.CloseTimeout < 0 {
		return fmt.Errorf("ucx: spin time %d us, close timeout %v: %w", c.SpinTime, c.CloseTimeout, status.ErrInvalidConfig)
	}
	if err := c.Auth.Validate(); err != nil {
		return fmt.Errorf("ucx: %w", err)
	}
	return nil
}

// New returns a UCX transport.
func New(cfg Config) (transport.Transport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	return &Transport{cfg: cfg}, nil
}

// Transport is the UCX transport. Its worker is created on first use and destroyed when the
// last server and endpoint close.
type Transport struct {
	cfg Config

	mu   sync.Mutex
	w    *worker                // guarded by mu
	refs int                    // servers and endpoints using w; guarded by mu
	live atomic.Pointer[worker] // w, for Progress without mu
}

// Progress drives the worker once from the calling goroutine (transport.Progresser): a process
// polling its buffer for a peer's put over tcp calls it in its loop, and the background loop
// stands aside meanwhile.
func (t *Transport) Progress() {
	if w := t.live.Load(); w != nil {
		w.users.Add(1)
		w.Poll()
	}
}

// Type returns transport.UCX (or RDMA for NewRDMA's).
func (t *Transport) Type() transport.ConnType {
	if t.cfg.rdma {
		return transport.RDMA
	}
	return transport.UCX
}

// acquire returns the worker, starting it if needed; release undoes one acquire.
func (t *Transport) acquire() (*worker, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.w == nil {
		w, err := startWorker(t.cfg)
		if err != nil {
			return nil, err
		}
		t.w = w
		t.live.Store(w)
	}
	t.refs++
	return t.w, nil
}

func (t *Transport) release() {
	t.mu.Lock()
	t.refs--
	var w *worker
	if t.refs == 0 {
		w, t.w = t.w, nil
		t.live.Store(nil)
	}
	t.mu.Unlock()
	if w != nil {
		w.stop()
	}
}

func statusString(st C.ucs_status_t) string { return C.GoString(C.ucs_status_string(st)) }

// ucsErr maps a UCX status to an error: peer failures and cancellations to ErrPeerClosed,
// the rest to ErrFailed, with UCX's text.
func ucsErr(what string, st C.ucs_status_t) error {
	base := status.ErrFailed
	switch st {
	case C.UCS_ERR_CONNECTION_RESET, C.UCS_ERR_ENDPOINT_TIMEOUT, C.UCS_ERR_UNREACHABLE, C.UCS_ERR_CANCELED,
		C.UCS_ERR_REJECTED, C.UCS_ERR_NOT_CONNECTED:
		base = status.ErrPeerClosed
	case C.UCS_ERR_UNSUPPORTED, C.UCS_ERR_NO_DEVICE, C.UCS_ERR_NO_RESOURCE:
		base = status.ErrUnsupported
	}
	return fmt.Errorf("ucx: %s: %s: %w", what, statusString(st), base)
}

// closeTimeout is Config.CloseTimeout (its default filled in by New).
func (t *Transport) closeTimeout() time.Duration { return t.cfg.CloseTimeout }

// defaultCloseTimeout bounds how long Close waits for requests in flight to complete or fail.
const defaultCloseTimeout = 30 * time.Second
