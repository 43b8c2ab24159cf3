// Package trans is the transfer engine: one-sided reads and writes between registered buffers
// of named peers, for moving KV cache from prefill to decode workers. It offers what
// Mooncake's TransferEngine and memfabric's smem_trans_* offer, on any Linux host.
//
// A peer is named by its unique id "ip:port" (or "[v6]:port"), the address of its engine's
// request socket. Remote addresses are the peer's own virtual addresses: a transfer must lie
// in memory the peer registered (checked by the peer's transport, so a registration is
// usable the moment Register returns, and a write to unregistered memory fails). Transfers
// run over shared memory to peers on this host and TCP (or UCX) to others, one-sidedly: the
// peer's application takes no part. A completed write is visible in the peer's memory.
//
// Metadata: an embedded store (tcp://), etcd (etcd://, or Mooncake's bare host:port), Mooncake's
// HTTP metadata server (http://host:port/path), Redis (redis://host:port), or none at all (P2PHANDSHAKE or "": peers are
// asked for their card over their request socket, as Mooncake's P2P handshake). With a store,
// each engine takes a stable slot by its unique id and publishes its card; a peer whose store
// link dies is dropped at once. With metadata, a peer it does not list fails at once with
// status.ErrNotFound (docs/wire/metadata.md). Protocol maps Mooncake's protocol names. Either way a peer that fails a transfer is
// forgotten, so when it restarts under the same id the next transfer reaches the new process.
//
// Deliberate differences from upstream: registration takes the exact range (upstream rounds to
// 2 MiB, which would expose neighbouring memory and may cover unmapped pages) and needs no
// sleep (upstream sleeps 8 s); Deregister is real; any number of peers per batch call site.
package trans
