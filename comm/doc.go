// Package comm provides the Communicator: one local ConnBuffer bound to many peers, with
// one-sided put/get (blocking, non-blocking with Wait, and pipelined), streaming send/receive of
// payloads of any size and memory type through the buffer, and rank-addressed control messages.
//
// Peers have two names, as in upstream HMC: the (ip, data port) address used by Put and Get,
// and the rank used by the control plane. Both are learned at ConnectTo, and on the target side
// from each initiator's handshake. Every blocking call takes a context; no call exits or signals
// the process.
package comm
