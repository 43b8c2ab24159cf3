// Package kv is a distributed KV-cache pool on the fabric, with Mooncake Store's model and API:
// clients mount memory segments (host DRAM, later device memory) into the pool, a master places
// each object's replicas in those segments, and clients move the bytes themselves with the
// transfer engine — no byte of an object goes through the master.
//
// This first part is the master's state: segments and their allocators, objects and their
// replicas (in flight while a put writes them, complete after), leases (a get pins an object
// against eviction and removal for a TTL), eviction of the least recently used objects at a
// high-water mark (never a leased object, never one being written), and the cleanup of a dead
// client's segments. Its errors carry Mooncake Store's error codes (Code), which the Python face
// returns as they are.
package kv
