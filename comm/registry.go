package comm

import (
	"fmt"
	"maps"

	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/shm"
	"github.com/hmc-go/hmc/transport/tcp"
	"github.com/hmc-go/hmc/transport/ucx"
)

// Registry holds the transports a Communicator may use, one per ConnType, and for the kinds it
// lacks the reason (reported when a caller asks for one). Transports are built outside comm and
// injected through Config.Transports; DefaultRegistry builds the usual set. A Registry is
// filled before New and not changed after.
type Registry struct {
	trans   map[transport.ConnType]transport.Transport
	missing map[transport.ConnType]error
}

// NewRegistry returns an empty Registry.
func NewRegistry() *Registry {
	return &Registry{trans: map[transport.ConnType]transport.Transport{}, missing: map[transport.ConnType]error{}}
}

// Add registers t under its Type, replacing any transport of that type.
func (r *Registry) Add(t transport.Transport) {
	r.trans[t.Type()] = t
	delete(r.missing, t.Type())
}

// Unavailable records why kind ct cannot be used (an error wrapping status.ErrUnsupported).
func (r *Registry) Unavailable(ct transport.ConnType, why error) {
	if _, ok := r.trans[ct]; !ok {
		r.missing[ct] = why
	}
}

// Get returns the transport of kind ct, or an error saying why there is none.
func (r *Registry) Get(ct transport.ConnType) (transport.Transport, error) {
	if t, ok := r.trans[ct]; ok {
		return t, nil
	}
	if err := r.missing[ct]; err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("no %v transport registered: %w", ct, status.ErrUnsupported)
}

// DefaultRegistry builds the transports a Communicator uses unless told otherwise: TCP and
// shared memory always; UCX, and RDMA through it, in -tags ucx builds (RDMA also needs a
// device; the reason is recorded when not).
func DefaultRegistry(cfg Config) (*Registry, error) {
	cfg.inheritAuth()
	r := NewRegistry()
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

// snapshot returns copies of the registry's maps (the Communicator keeps its own).
func (r *Registry) snapshot() (map[transport.ConnType]transport.Transport, map[transport.ConnType]error) {
	return maps.Clone(r.trans), maps.Clone(r.missing)
}
