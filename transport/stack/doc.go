// Package stack builds the set of transports a Communicator and the fabric faces use, from one
// configuration of each: TCP and same-host shared memory always, UCX and RDMA through it in
// -tags ucx builds (RDMA also needs a device; the reason is recorded when not). It is the one
// place above the transports that names them; package comm takes the Registry it returns.
package stack
