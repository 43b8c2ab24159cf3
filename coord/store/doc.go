// Package store is the config store of the memory-pool layer: a small key/value service with
// blocking gets, atomic add/append/compare-and-swap, watches and connection liveness, on which
// rank assignment, barriers, allgathers and join/leave are built (package coord/group).
//
// A [Client] is opened from a URL:
//
//	tcp://127.0.0.1:7000           the embedded server (this package's [Server])
//	tcp://[::1]:7000               the same over IPv6
//	etcd://127.0.0.1:2379,h2:2379/job42  an etcd cluster (client/v3), keys under /job42/
//
// Both backends implement the same semantics, those of memfabric_hybrid's config store
// (docs/wire/store.md has the wire format of the embedded one):
//
//   - Set overwrites; creating a key wakes every Get waiting for it.
//   - Get returns at once ([ErrNotExist] if absent), waits up to a timeout ([ErrTimeout]) or waits
//     for the key to be created until the context ends ([Forever]).
//   - Add works on decimal integers; Add 0 is an atomic read; an absent key starts at 0.
//   - Append returns the new length; CompareAndSwap returns the previous value (an empty expected
//     value means "create if absent"); Write patches bytes at an offset, zero-filling.
//   - Watch fires once, when the key comes into existence.
//   - Ranks: explicit (Config.Rank), first-come automatic (AssignRank, lowest free rank, a dead
//     rank's id is reused) or by unique name (RankByName). When a client with a rank disappears
//     (closed, killed, silent past the heartbeat timeout, or its etcd lease expired) every
//     client's WatchRankDown callbacks receive the rank. A client that was only cut off takes
//     its rank back by itself once it reaches the store again (a new link, a new lease);
//     calls in between fail with [ErrIO] at once, and Live waits for the rank.
//
// Errors wrap the sentinels of this package, which carry memfabric's store codes ([CodeOf]) and
// match the HMC status sentinels (ErrNotExist is a status.ErrNotFound, ErrTimeout a
// status.ErrTimeout, ...).
//
// The embedded server keeps job state in memory and wipes it when its last client leaves, as
// upstream does. It can demand a shared secret (an HMAC-SHA256 challenge in both directions
// before any operation) and TLS 1.3 with client certificates; both are off by default.
package store
