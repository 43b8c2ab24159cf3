// Package shmem is Share Memory: a symmetric heap over a fixed set of ranks, with OpenSHMEM-
// grade host operations — RMA, atomics, signals, point-to-point synchronisation, teams and
// collectives — on any Linux host (memfabric's SHM face gives the host only set-up; its data
// moves from Ascend kernels).
//
// Create is collective: every rank backs a block of the same size, and rank r's block is
// Base + r × Size in every process. A symmetric address is an offset in the block: Put(pe, off,
// src) writes rank pe's block at off. Ranks on the same host map each other's blocks at their
// global addresses, so their RMA and atomics are plain loads, stores and sync/atomic on shared
// memory (Ptr(pe) returns the block); other ranks are reached by one-sided RMA and remote
// atomics over TCP or UCX. Blocking RMA returns when the bytes are visible at the target;
// non-blocking RMA (PutNBI, GetNBI) completes at Quiet. Fence orders, here by completing
// (Quiet's guarantee is stronger than Fence needs, and costs nothing extra for blocking RMA).
//
// Teams (World, SplitStrided, Split2D) run Barrier, Sync, Broadcast, FCollect, AllToAll and
// Reduce through flags and scratch in a private part of the heap, not the store. The store is
// used only to set up, and for memfabric's control-plane extras: ControlBarrier,
// ControlAllGather, sub-groups by key, the atomic number allocator, exit broadcast.
package shmem
