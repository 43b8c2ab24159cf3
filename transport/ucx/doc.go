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
//   - One ucp context and worker per Transport, owned by one goroutine locked to its OS thread
//     (the progress loop): every UCX call runs there, other goroutines hand it work and wake it
//     with ucp_worker_signal. It progresses the worker for initiators and targets alike (UCX
//     over TCP needs the target to progress), busy-polls for a short while after activity and
//     then sleeps on the worker's event fd.
//   - A server maps its ConnBuffer with ucp_mem_map and serves a bootstrap TCP socket on its
//     data address: an initiator connects, says its rank, and receives the region's address,
//     size, packed rkey and the server's worker address; it then creates a ucp endpoint (peer
//     error handling) and unpacks the rkey. The bootstrap socket stays open as the liveness link:
//     when it ends, transfers fail with status.ErrPeerClosed.
//   - Put = ucp_put_nbx + ucp_ep_flush_nbx (the put is visible at the target when the flush
//     completes); Get = ucp_get_nbx. Ranges are checked against the size the target declared
//     before anything is posted.
//   - The transport's resources (context, worker, loop) live while a server or endpoint uses
//     them and are torn down (endpoints closed with ucp_ep_close_nbx, memory unmapped, worker
//     destroyed) when the last one closes.
//
// Memory UCX cannot register (GPU memory: Debian's UCX has no CUDA support) is refused with
// status.ErrUnsupported.
package ucx
