package comm

import "github.com/hmc-go/hmc/transport"

// Registry is the set of transports a Communicator may use (transport.Registry); package
// transport/stack builds the usual one from its configuration.
type Registry = transport.Registry

// NewRegistry returns an empty Registry.
func NewRegistry() *Registry { return transport.NewRegistry() }
