// Package ucx is the UCX transport: one-sided put/get through libucp (UCX 1.13, Debian's
// libucx-dev), over whatever UCX picks from UCX_TLS — TCP, shared memory (posix, cma), or RDMA
// (rc, ud, dc) where a device exists. ConnType RDMA is this transport restricted to rc, ud and
// dc (NewRDMA).
//
// It needs cgo and the build tag ucx (`go build -tags ucx`); without them New and NewRDMA
// return a transport whose every call fails with status.ErrUnsupported saying so, and
// Resources reports the same, so the default build stays pure Go.
//
// Design (docs/wire/ucx.md has the bootstrap wire format):
//
//   - One ucp context per process and set of transports (shared by the Transports with the same
//     TLS), one worker per Transport, serialized by one mutex. Goroutines posting operations
//     call UCX themselves (one cgo call per put: put, flush, a round of progress); a goroutine
//     waiting for an Op drives progress itself (transport.Poller), and a process polling its
//     own memory for a peer's put calls Progress (transport.Progresser). A background loop
//     progresses when nobody else does (UCX over TCP needs the target to progress), stands
//     aside while others do, busy-polls for a short while after activity and then sleeps on
//     the worker's event fd.
//   - NewHostBuffer returns a ConnBuffer of memory UCX allocated in that shared context:
//     UCX's shared-memory transports map it into same-host initiators, whose puts become
//     copies into it (as in ucx_perftest, which allocates its buffers with UCX).
//   - A server maps its ConnBuffer with ucp_mem_map and serves a bootstrap TCP socket on its
//     data address: an initiator connects, says its rank, and receives the region's address,
//     size, packed rkey and the server's worker address; it then creates a ucp endpoint (peer
//     error handling) and unpacks the rkey. The bootstrap socket stays open as the liveness link:
//     when it ends, transfers fail with status.ErrPeerClosed.
//   - On a version-2 link the server also serves the process's region table (transport.RMA):
//     an initiator resolves a region by key or address on the bootstrap link, the server
//     registers it with UCX on first use and sends its rkey; atomics use ucp_atomic_op_nbx.
//     Deregistering revokes the rkey at every peer that holds it, and waits for them.
//   - Put = ucp_put_nbx + ucp_ep_flush_nbx (the put is visible at the target when the flush
//     completes); Get = ucp_get_nbx. Ranges are checked against the size the target declared
//     before anything is posted.
//   - Vectors (transport.VectorRMA): every piece posted in one call with one flush; where UCX
//     emulates RMA over tcp, as active messages instead (bootstrap version 3, am.go): a PUTV
//     carries a table of pieces and their bytes, one message per 2 MiB, copied into place by
//     the target after checking each piece against what the link was granted (a lone PUTV
//     goes as a rendezvous on version-4 links, received straight into the pieces), and
//     answered; a GETV carries the table and is answered with the pieces' bytes.
//   - Over tcp, UCX 1.13 emulates RMA with active messages of at most UCX_TCP_TX_SEG_SIZE, each
//     answered by a completion message. The context asks for 64 KiB segments (UCX's default
//     is 8 KiB; its receive segments are 64 KiB) unless UCX_TCP_TX_SEG_SIZE or
//     UCX_TCP_RX_SEG_SIZE is set: a 64 KiB put is one message and one answer, not eight.
//   - The transport's resources (worker, loop) live while a server or endpoint uses them and
//     are torn down (endpoints flushed, then closed with ucp_ep_close_nbx, memory unmapped,
//     worker destroyed) when the last one closes; the context when its last worker and buffer
//     are gone.
//
// Closing: an endpoint's Close lets every request it gave UCX complete (land, or fail when the
// target is gone) before it closes the UCX endpoint. UCX 1.13 crashes when a forced close purges
// a queued zero-copy RMA request (SIGSEGV in ucp_mem_rereg_mds from uct_tcp_ep_pending_purge),
// so a forced close must never find one; a target that neither completes nor fails them within
// Config.CloseTimeout leaves the endpoint (and its worker) abandoned instead of freed under UCX.
// Staged transfers' goroutines belong to their endpoint, whose Close waits for them.
//
// Signals: libucs installs handlers for SIGSEGV, SIGBUS, SIGILL and SIGFPE in its library
// constructor (UCX_ERROR_SIGNALS), before the Go runtime starts. The runtime then installs its
// own and forwards to UCX's only the faults that happen in C code: a fault in Go code is still
// a Go panic, but a fault inside UCX prints UCX's C backtrace, which ends at the cgo boundary
// and hides the Go call that led there (and which goroutines were doing what). So UCX may not
// keep those handlers in a process we start: the hmc command and this module's test binaries
// call ExecWithoutErrorSignals first, which re-executes the program once with
// UCX_ERROR_SIGNALS set empty (an explicit UCX_ERROR_SIGNALS in the environment is kept).
// Programs that load libhmc.so (C, Python) keep UCX's handlers unless they set the variable
// themselves; nothing else in the process depends on them.
//
// Files: transport.go (Config, Transport, errors), worker.go (the worker and who progresses
// it), server.go (the target), endpoint.go (the initiator: posting, flush coalescing, Close),
// am.go (vector puts as active messages),
// staging.go (device regions through a registered ring), context.go (the shared ucp context
// and UCX-allocated buffers); every C function the Go side calls is in hmc_ucx.c.
//
// Memory UCX cannot register (GPU memory: Debian's UCX has no CUDA support) is refused with
// status.ErrUnsupported.
package ucx
