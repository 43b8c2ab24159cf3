package bench

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/hmc-go/hmc/comm"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// The ping-pong measures what ucx_perftest's ucp_put_lat measures: each side puts a counter into
// the other's buffer and waits for the peer's answer to land in its own; the latency is half the
// round trip. Each side polls its own memory for the answer, as ucp_put_lat does; with
// Config.Notify (TCP) it is woken by the transport's write notification
// (comm.Config.OnRemoteWrite) instead, which costs a goroutine wake-up per message. The puts'
// completions are collected one iteration later, off the critical path.

// seqAt atomically loads the u64 at the start of a host buffer (8-byte aligned: buffers are
// page-aligned).
func seqAt(b []byte) uint64 { return atomic.LoadUint64((*uint64)(unsafe.Pointer(&b[0]))) }

// arrivals is signalled (without blocking) by the Communicator's OnRemoteWrite hook whenever a
// peer's put lands in the buffer, so the ping-pong waits for data instead of spinning.
type arrivals chan struct{}

func newArrivals() arrivals { return make(arrivals, 1) }

func (a arrivals) notify(_, _ uint64) {
	select {
	case a <- struct{}{}:
	default:
	}
}

// await returns when b holds want. With notified (the peer's puts reach us through a transport
// that calls OnRemoteWrite) it sleeps until signalled; the check after each wake-up makes a
// stale signal harmless. Otherwise it spins on the memory (which shared memory and UCX write
// one-sidedly, and TCP's server goroutine writes), progressing the Communicator (UCX over tcp
// needs it) and yielding, and sleeps a little now and then so the runtime can poll the
// network. Either way it checks alive every 100 ms, so a peer that died ends the wait with an
// error instead of a hang.
func (a arrivals) await(ctx context.Context, c *comm.Communicator, b []byte, want uint64, notified bool, alive func() error) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for i := 0; seqAt(b) != want; i++ {
		if notified {
			select {
			case <-a:
			case <-tick.C:
				if err := alive(); err != nil {
					return err
				}
			case <-ctx.Done():
				return status.FromContext(ctx)
			}
			continue
		}
		if i&1023 == 1023 {
			if err := status.FromContext(ctx); err != nil {
				return err
			}
			select {
			case <-tick.C:
				if err := alive(); err != nil {
					return err
				}
			default:
			}
			time.Sleep(time.Microsecond)
		}
		c.Progress() // UCX over tcp: the peer's put lands when we progress
		runtime.Gosched()
	}
	return nil
}

// peerAlive returns a check that rank's control link is up.
func peerAlive(c *comm.Communicator, rank uint32) func() error {
	return func() error {
		if !c.Ctrl().HasPeer(rank) {
			return fmt.Errorf("ping-pong: rank %d's control link is gone: %w", rank, status.ErrPeerClosed)
		}
		return nil
	}
}

// namedBy returns the kind of data server whose port names a process serving ct: TCP's names
// the server for TCP, SHM and AUTO (comm.Communicator.DataAddr(AUTO)); UCX and RDMA serve on
// their own port.
func namedBy(ct transport.ConnType) transport.ConnType {
	if ct == transport.UCX || ct == transport.RDMA {
		return ct
	}
	return transport.AUTO
}

// pingNotify, in a ping command's Off, asks the server to wait by notification too.
const pingNotify = 1

// notifies says whether a put over ct reaches the target through code that calls
// OnRemoteWrite: TCP's server. SHM and UCX (RDMA) write the target's memory one-sidedly.
func notifies(ct transport.ConnType) bool { return ct == transport.TCP }

// Each side watches offset 0 of its own buffer, which only the peer writes, and stages its
// outgoing counter at stageOff.
const stageOff = 4096

// bounce puts seq from local[stageOff, +size) to the peer's offset 0 and returns the op id to
// wait for later.
func bounce(ctx context.Context, c *comm.Communicator, ip string, port int, size, seq uint64, ct transport.ConnType) (uint64, error) {
	b, err := c.Buffer().Slice(stageOff, size)
	if err != nil {
		return 0, err
	}
	atomic.StoreUint64((*uint64)(unsafe.Pointer(&b[0])), seq)
	return c.Peer(ip, port, ct).PutNB(ctx, stageOff, 0, size)
}

// pong is the server side of n ping-pong iterations with the client at ip:port.
func pong(ctx context.Context, c *comm.Communicator, arr arrivals, ip string, port int, n uint64, ct transport.ConnType, notified bool) error {
	region := c.Buffer().Bytes()
	size := uint64(8)
	var prev uint64
	for seq := uint64(1); seq <= n; seq++ {
		if err := arr.await(ctx, c, region, seq, notified, peerAlive(c, clientRank)); err != nil {
			return err
		}
		id, err := bounce(ctx, c, ip, port, size, seq, ct)
		if err != nil {
			return err
		}
		if prev != 0 {
			if err := c.Wait(ctx, prev); err != nil {
				return err
			}
		}
		prev = id
	}
	return c.Wait(ctx, prev)
}

// pingpong measures 8-byte messages (the counter), whatever the size asked for: larger sizes
// measure bandwidth, which put and get do.
func (r *runner) pingpong(uint64) (Result, error) {
	cfg, c, ctx := r.cfg, r.c, r.ctx
	const size = 8
	iters := cfg.Iters
	if iters == 0 {
		iters = 10000
	}
	total := uint64(iters + cfg.Warmup)
	myPort := portOf(c.DataAddr(namedBy(cfg.Transport)))
	// Start from zero on both sides, then let the server enter its loop.
	clear(r.buf.Bytes()[:16])
	if err := c.Peer(cfg.PeerIP, cfg.DataPort, cfg.Transport).Put(ctx, 0, 0, 16); err != nil {
		return Result{}, err
	}
	if err := c.CtrlSend(ctx, serverRank, cmdPing); err != nil {
		return Result{}, err
	}
	route, err := c.Peer(cfg.PeerIP, cfg.DataPort, cfg.Transport).Route()
	if err != nil {
		return Result{}, err
	}
	// Our puts reach the server over route; its answers reach us over the same kind.
	notified := cfg.Notify && notifies(route)
	var flags uint64
	if notified {
		flags |= pingNotify
	}
	if err := c.Ctrl().SendStruct(ctx, serverRank, command{Off: flags, Len: total, Port: uint32(myPort), Mem: uint32(route)}); err != nil {
		return Result{}, err
	}
	region := r.buf.Bytes()
	lat := make([]time.Duration, 0, iters)
	var prev uint64
	for seq := uint64(1); seq <= total; seq++ {
		start := time.Now()
		id, err := bounce(ctx, c, cfg.PeerIP, cfg.DataPort, size, seq, cfg.Transport)
		if err != nil {
			return Result{}, err
		}
		if err := r.arr.await(ctx, c, region, seq, notified, peerAlive(c, serverRank)); err != nil {
			return Result{}, err
		}
		if seq > uint64(cfg.Warmup) {
			lat = append(lat, time.Since(start)/2)
		}
		if prev != 0 {
			if err := c.Wait(ctx, prev); err != nil {
				return Result{}, err
			}
		}
		prev = id
		if cfg.Progress != nil && seq > uint64(cfg.Warmup) {
			cfg.Progress(size, int(seq)-cfg.Warmup, iters)
		}
	}
	if err := c.Wait(ctx, prev); err != nil {
		return Result{}, err
	}
	if _, err := c.CtrlRecv(ctx, serverRank); err != nil { // the server's end-of-command reply
		return Result{}, fmt.Errorf("ping-pong end: %w", err)
	}
	return summarize(cfg, size, lat), nil
}

// localIPFor returns the local address used to reach peer (127.0.0.1 for loopback peers).
func localIPFor(peer string) string {
	c, err := net.Dial("udp", net.JoinHostPort(peer, "9"))
	if err != nil {
		return "127.0.0.1"
	}
	defer c.Close()
	return hostOf(c.LocalAddr().String())
}
