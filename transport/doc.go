// Package transport defines how bytes move one-sidedly between a local registered region and a
// peer's: the Transport, Server and Endpoint interfaces that every transport (tcp, shm, ucx,
// verbs) implements, the ConnType that names them, and Op, the completion handle of a
// non-blocking transfer.
//
// A transport never knows about ranks, sessions or the control plane: the comm package binds
// endpoints to peers.
package transport
