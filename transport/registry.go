package transport

import (
	"fmt"
	"maps"

	"github.com/hmc-go/hmc/status"
)

// Registry holds the transports a Communicator may use, one per ConnType, and for the kinds it
// lacks the reason (reported when a caller asks for one). Package transport/stack builds the
// usual set from its configuration; a caller may also build one by hand. A Registry is filled
// before it is handed to a Communicator and not changed after.
type Registry struct {
	trans   map[ConnType]Transport
	missing map[ConnType]error
}

// NewRegistry returns an empty Registry.
func NewRegistry() *Registry {
	return &Registry{trans: map[ConnType]Transport{}, missing: map[ConnType]error{}}
}

// Add registers t under its Type, replacing any transport of that type.
func (r *Registry) Add(t Transport) {
	r.trans[t.Type()] = t
	delete(r.missing, t.Type())
}

// Unavailable records why kind ct cannot be used (an error wrapping status.ErrUnsupported).
func (r *Registry) Unavailable(ct ConnType, why error) {
	if _, ok := r.trans[ct]; !ok {
		r.missing[ct] = why
	}
}

// Get returns the transport of kind ct, or an error saying why there is none.
func (r *Registry) Get(ct ConnType) (Transport, error) {
	if t, ok := r.trans[ct]; ok {
		return t, nil
	}
	if err := r.missing[ct]; err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("no %v transport registered: %w", ct, status.ErrUnsupported)
}

// Snapshot returns copies of the registry's transports and of its reasons for the kinds it
// lacks (a Communicator keeps its own).
func (r *Registry) Snapshot() (map[ConnType]Transport, map[ConnType]error) {
	return maps.Clone(r.trans), maps.Clone(r.missing)
}
