// Package bm is Big Memory, memfabric's global memory pool, on any Linux host: every process
// (rank) of a world contributes a slice of DRAM (and, with a GPU, of device memory) to one
// global virtual address space, in which any process copies bytes between its own memory and
// any rank's slice, or between two slices, by address.
//
// The layout is the same in every process: rank r's DRAM slice starts at Base + r × Stride,
// reserved with no access at a deterministic base (40 TiB up, as upstream) so a global address
// (GVA) names the same byte everywhere. The local slice is real memory mapped at its GVA, so C
// and Python callers dereference local GVAs; ranks on the same host map each other's slices at
// their GVAs too, so any co-located GVA is a plain load or store (upstream offers that only on
// Ascend super-nodes). Remote slices are reached by one-sided put and get over the transports
// the ranks share (shared memory, UCX/RDMA, TCP), chosen by data-op flags and tag tables with
// fallback on error.
//
// Life cycle, as upstream's smem_bm_*: Init (store, rank), Create (purely local: reserve the
// space, back the slice), Join (publish the slice and enter the group: peers map or reach it),
// Copy / CopyBatch (+ Wait for ASYNC), Leave, Destroy, and Fabric.Close (smem_bm_uninit).
// Membership follows the group engine (coord/group): a rank that dies is removed everywhere,
// its slice unmapped, and copies to it fail with ErrRankDown; a rank that rejoins is reachable
// again.
//
// Deliberate differences from upstream: RankByGVA divides by the stride; a batch's direction
// is resolved per element; L2GH and GH2L work; G2G between two remote ranks works (the
// source rank is asked to write to the destination, so the bytes cross the network once);
// Wait succeeds when nothing is pending; Destroy frees the DRAM slice.
package bm
