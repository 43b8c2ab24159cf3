// Package comm provides the Communicator: one local ConnBuffer (and a table of other registered
// regions) bound to many peers, with one-sided put/get (blocking, non-blocking with Wait, and
// pipelined), RMA and remote atomics on the peers' registered memory, streaming send/receive of
// payloads of any size and memory type through the buffer, and rank-addressed control messages.
//
// Operations take a Peer: Communicator.Peer names one by its (ip, data port) address and the
// transport to reach it (AUTO picks shared memory on this host, else TCP), PeerByRank by the
// rank the control plane knows it by; both names are learned at ConnectTo, and on the target
// side from each initiator's handshake. The transports are injected through a Registry
// (package transport/stack builds TCP, shared memory and UCX; comm names none of them). Every
// blocking call takes a context; no
// call exits or signals the process.
package comm
