// Package mesh is what the fabric faces (Big Memory, the transfer engine, Share Memory) share
// to move bytes: one process's registered memory (a buffer.Table) served on every transport it
// was asked for, a Card that tells peers how to reach it, and endpoints to peers by rank,
// dialled on first use and tried in the caller's order of transports with fallback on error.
//
// A Card travels through the config store (or any channel) as JSON; a peer is on this host when
// its kernel boot id is ours, which is what lets a face map a co-located peer's memory
// (RegionSharer) instead of copying through a transport.
package mesh
