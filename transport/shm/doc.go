// Package shm is HMC-Go's same-host transport: one-sided put and get as plain memory copies
// into and out of the target's ConnBuffer, mapped by the initiator.
//
// The target serves a Unix socket (an abstract name such as "@hmc-shm-2025" or a path). An
// initiator that connects receives, with SCM_RIGHTS, the memfd behind the target's host
// ConnBuffer, checks that its size is sealed, and maps it once; from then on Put and Get are
// copies done by the initiator alone: the target's CPU does nothing per transfer and works while
// the target is busy or blocked. Large copies are split across goroutines. The socket stays open
// as a liveness link: when the target exits, the mapping stays valid (the memory lives while
// mapped: no SIGBUS) and later transfers fail with ErrPeerClosed.
//
// Admission: both ends check the other's user (SO_PEERCRED) before anything is sent; only this
// process's user, or users listed in Config.AllowUIDs, get the descriptor.
//
// Registered regions (link version 2): an initiator asks the target on the link where a region
// of its table is (by key or address); a region with a memfd is mapped and cached, one without
// is reached with cross-memory attach; atomics run with sync/atomic on the mapping. A shared
// control page lets the owner's Deregister wait for peers' copies in flight without taking
// part in any of them.
//
// Memory ordering: a Put's copy completes before PutAsync returns; any later system call that
// tells the target (a control message on a socket) is ordered after those stores (x86-TSO, and
// the kernel's full barriers on socket send/receive on every architecture Go supports), so a
// target that receives the message sees the bytes. The wire format is in docs/wire/shm.md.
package shm
