// Package kv is a distributed KV-cache pool on the fabric, with Mooncake Store's model and API:
// clients mount memory segments (host DRAM, later device memory) into the pool, a master places
// each object's replicas in those segments, and clients move the bytes themselves with the
// transfer engine — no byte of an object goes through the master.
//
// Master is the pool's state: segments and their allocators, objects and their replicas (in
// flight while a put writes them, complete after), leases (a get pins an object against
// eviction and removal for a TTL), eviction of the least recently used objects at a high-water
// mark (never a leased object, never one being written), and the cleanup of a dead client's
// segments. Serve puts a Master on the fabric's request channel, with heartbeats: a client
// silent for ClientTTL is dead and its segments leave the pool. Client mounts a segment of its
// own memory (a transfer engine's shareable buffer), and puts and gets objects, writing and
// reading the replicas itself: a get reads its own segment's replica if it has one, else the
// others in turn, and returns bytes only when the read ended within the master's lease. Errors
// carry Mooncake Store's error codes (Code), which the Python face will return as they are.
//
// Still to come (issue 35): the master's state in the config store and standby masters under
// etcd, batch and zero-copy forms (put_from, get_into registered buffers, batch_*), the C and
// Python faces (mooncake.store.MooncakeDistributedStore), hmc kv master and hmc kv bench.
package kv
