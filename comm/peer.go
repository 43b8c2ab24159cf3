package comm

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// Peer is a handle on one remote process: its data address with the transport asked for
// (Communicator.Peer), and its rank on the control plane once known (PeerByRank, or learned
// from the connection). Operations take the Peer instead of (ip, port, conntype); the endpoint
// per transport is found, or dialled back to a peer that connected to us, on first use. A Peer
// is a small value-like handle: copying it is fine, and it owns nothing that needs closing
// (Disconnect closes the connection it names).
type Peer struct {
	c    *Communicator
	ip   string
	port int
	ct   transport.ConnType
}

// Peer returns the handle of the process serving data at ip:port, reached over ct (AUTO: shared
// memory on this host, else TCP). Nothing is dialled until an operation needs it.
func (c *Communicator) Peer(ip string, port int, ct transport.ConnType) *Peer {
	return &Peer{c: c, ip: ip, port: port, ct: ct}
}

// PeerByRank returns the handle of the process with control rank rank: one this Communicator
// connected to (ConnectTo) or that connected to it. ErrNotFound if neither.
func (c *Communicator) PeerByRank(rank uint32) (*Peer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, pe := range c.eps {
		if pe.rank == rank {
			ct := k.conn
			if ct == transport.SHM {
				ct = transport.AUTO // shared memory was AUTO's pick (or asked for; AUTO finds it again)
			}
			return &Peer{c: c, ip: k.ip, port: k.port, ct: ct}, nil
		}
	}
	for k, a := range c.accepted {
		if a.rank == rank && a.listenPort != 0 {
			return &Peer{c: c, ip: a.ip, port: a.listenPort, ct: k.conn}, nil
		}
	}
	return nil, fmt.Errorf("comm: no peer with rank %d: %w", rank, status.ErrNotFound)
}

// String names the peer ("10.0.0.2:2025/auto").
func (p *Peer) String() string { return fmt.Sprintf("%s:%d/%v", p.ip, p.port, p.ct) }

// Rank returns the peer's control rank, from its connection (ErrNotFound before one exists).
func (p *Peer) Rank() (uint32, error) { return p.c.peerRank(p.ip, p.port, p.ct) }

// Route returns the transport that carries transfers to the peer (for AUTO, the one chosen).
func (p *Peer) Route() (transport.ConnType, error) { return p.c.route(p.ip, p.port, p.ct) }

// Put copies local[localOff, +n) of the ConnBuffer to the peer's buffer at remoteOff; it
// returns when the bytes are visible there.
func (p *Peer) Put(ctx context.Context, localOff, remoteOff, n uint64) error {
	return p.track("put", n, time.Now(), p.c.put(ctx, p.ip, p.port, localOff, remoteOff, n, p.ct))
}

// Get copies the peer's buffer [remoteOff, +n) into local[localOff, +n).
func (p *Peer) Get(ctx context.Context, localOff, remoteOff, n uint64) error {
	return p.track("get", n, time.Now(), p.c.get(ctx, p.ip, p.port, localOff, remoteOff, n, p.ct))
}

// PutNB starts a Put and returns its id for Communicator.Wait.
func (p *Peer) PutNB(ctx context.Context, localOff, remoteOff, n uint64) (uint64, error) {
	return p.c.putNB(ctx, p.ip, p.port, localOff, remoteOff, n, p.ct)
}

// GetNB starts a Get and returns its id for Communicator.Wait.
func (p *Peer) GetNB(ctx context.Context, localOff, remoteOff, n uint64) (uint64, error) {
	return p.c.getNB(ctx, p.ip, p.port, localOff, remoteOff, n, p.ct)
}

// PutFrom puts src (any host memory of the caller's) to the peer's buffer at remoteOff.
// src is read in place by the transport (one-sided RMA: the zero-copy form of staging it into
// the ConnBuffer and calling Put), so it must not change until PutFrom returns.
func (p *Peer) PutFrom(ctx context.Context, src []byte, remoteOff uint64) error {
	return p.rw(ctx, "put_from", true, src, transport.Remote{Key: transport.DefaultRegion, Addr: remoteOff})
}

// GetTo gets len(dst) bytes of the peer's buffer at remoteOff into dst.
func (p *Peer) GetTo(ctx context.Context, dst []byte, remoteOff uint64) error {
	return p.rw(ctx, "get_to", false, dst, transport.Remote{Key: transport.DefaultRegion, Addr: remoteOff})
}

// PutPipeline puts local[localOff, +n) to the peer at remoteOff in chunks of chunk bytes with at
// most maxInflight in flight (0: defaults), returning when all are visible.
func (p *Peer) PutPipeline(ctx context.Context, localOff, remoteOff, n, chunk uint64, maxInflight int) error {
	return p.track("put_pipeline", n, time.Now(), p.c.putPipeline(ctx, p.ip, p.port, localOff, remoteOff, n, chunk, maxInflight, p.ct))
}

// GetPipeline is PutPipeline's reverse.
func (p *Peer) GetPipeline(ctx context.Context, localOff, remoteOff, n, chunk uint64, maxInflight int) error {
	return p.track("get_pipeline", n, time.Now(), p.c.getPipeline(ctx, p.ip, p.port, localOff, remoteOff, n, chunk, maxInflight, p.ct))
}

// SendDataTo streams src (any size, any memory type) to the peer, which receives it with
// RecvDataFrom (see the stream protocol in docs/wire/stream.md).
func (p *Peer) SendDataTo(ctx context.Context, src Data) error {
	start := time.Now()
	return p.track("send_data", src.Len, start, p.c.sendDataTo(ctx, p.ip, p.port, src, p.ct))
}

// RecvDataFrom receives a stream the peer sends with SendDataTo into dst and returns its size.
func (p *Peer) RecvDataFrom(ctx context.Context, dst Data) (uint64, error) {
	start := time.Now()
	n, err := p.c.recvDataFrom(ctx, p.ip, p.port, dst, p.ct)
	return n, p.track("recv_data", n, start, err)
}

// Check returns nil if a data connection to the peer exists or can be made back to it (it
// connected to us), else ErrNotFound.
func (p *Peer) Check() error { return p.c.checkConn(p.ip, p.port, p.ct) }

// track tells the Communicator's Observer, if any, that op on n bytes started at start ended
// with err, and returns err.
func (p *Peer) track(op string, n uint64, start time.Time, err error) error {
	if o := p.c.cfg.Observer; o != nil {
		route, rerr := p.c.route(p.ip, p.port, p.ct)
		if rerr != nil {
			route = p.ct
		}
		o.Observe(op, route, net.JoinHostPort(p.ip, strconv.Itoa(p.port)), n, time.Since(start), err)
	}
	return err
}

// rma returns the peer's endpoint as a transport.RMA.
func (p *Peer) rma(ctx context.Context) (transport.RMA, error) {
	ep, err := p.c.endpoint(ctx, p.ip, p.port, p.ct)
	if err != nil {
		return nil, err
	}
	r, ok := ep.(transport.RMA)
	if !ok {
		return nil, fmt.Errorf("comm: peer %v: its transport reaches only the buffer: %w", p, status.ErrUnsupported)
	}
	return r, nil
}

// Write copies src to the peer's registered memory at dst (a region key and offset, or an
// address in the peer; transport.DefaultRegion names its ConnBuffer) and returns when the bytes
// are visible there.
func (p *Peer) Write(ctx context.Context, src []byte, dst transport.Remote) error {
	return p.rw(ctx, "write", true, src, dst)
}

// Read copies len(dst) bytes of the peer's registered memory at src into dst.
func (p *Peer) Read(ctx context.Context, dst []byte, src transport.Remote) error {
	return p.rw(ctx, "read", false, dst, src)
}

// rw moves b to (write) or from the peer's memory at r with RMA and waits for it; op names it
// in errors and to the Observer.
func (p *Peer) rw(ctx context.Context, op string, write bool, b []byte, r transport.Remote) error {
	start := time.Now()
	rma, err := p.rma(ctx)
	if err == nil {
		var o *transport.Op
		if write {
			o, err = rma.WriteAsync(ctx, b, r)
		} else {
			o, err = rma.ReadAsync(ctx, b, r)
		}
		if err == nil {
			err = o.Wait(ctx)
		}
		if err != nil {
			err = fmt.Errorf("comm: %s %d bytes, peer %v at %+v: %w", op, len(b), p, r, err)
		}
	}
	return p.track(op, uint64(len(b)), start, err)
}

// Atomic runs op on the aligned 64-bit word of the peer's registered memory at dst and returns
// the word's previous value.
func (p *Peer) Atomic(ctx context.Context, op buffer.AtomicOp, dst transport.Remote, operand, compare uint64) (old uint64, err error) {
	defer func(start time.Time) { p.track("atomic", 8, start, err) }(time.Now())
	r, err := p.rma(ctx)
	if err != nil {
		return 0, err
	}
	if old, err = r.Atomic(ctx, op, dst, operand, compare); err != nil {
		return 0, fmt.Errorf("comm: %v on %v at %+v: %w", op, p, dst, err)
	}
	return old, nil
}

// CtrlSend sends tag to the peer on the control plane (its rank, from the connection).
func (p *Peer) CtrlSend(ctx context.Context, tag uint64) error {
	r, err := p.Rank()
	if err != nil {
		return err
	}
	return p.c.CtrlSend(ctx, r, tag)
}

// CtrlRecv receives the next tag the peer sent.
func (p *Peer) CtrlRecv(ctx context.Context) (uint64, error) {
	r, err := p.Rank()
	if err != nil {
		return 0, err
	}
	return p.c.CtrlRecv(ctx, r)
}

// Disconnect closes the data connection to the peer (the next operation dials again).
func (p *Peer) Disconnect() error { return p.c.disconnect(p.ip, p.port, p.ct) }
