package bm

import (
	"context"
	"encoding/json"
	"fmt"
	"net"

	"github.com/hmc-go/hmc/fabric/internal/rpc"
	"github.com/hmc-go/hmc/status"
)

// The copy agent: each rank of an object serves a request socket (fabric/internal/rpc) on
// which a peer asks it to copy, so a G2G copy between two other ranks is done by the source's
// owner (one network crossing) instead of through the caller, and another rank's HBM is
// reached through its owner's GPU copies. Requests name only global addresses of the object
// and the requester's own registered memory: an agent copies nothing that its rank's Copy would
// refuse (docs/wire/bm.md).

// copyMethod is the agent's one request.
const copyMethod = "copy"

type agentReq struct {
	Items []fwdItem `json:"items"`
}

// fwdItem is one forwarded copy. An end with a rank (SrcRank/DstRank ≥ 0) is an address
// the requester registered in its own table (its staging buffer), not a GVA.
type fwdItem struct {
	Src     uint64 `json:"src"`
	Dst     uint64 `json:"dst"`
	Size    uint64 `json:"n"`
	SrcRank int    `json:"src_rank"`
	DstRank int    `json:"dst_rank"`
}

// fwd is a forwarded GVA-to-GVA copy.
func fwd(src, dst, n uint64) fwdItem {
	return fwdItem{Src: src, Dst: dst, Size: n, SrcRank: -1, DstRank: -1}
}

var rankDown = rpc.Sentinel{Name: "rank_down", Err: ErrRankDown}

type agent struct {
	srv    *rpc.Server
	client *rpc.Client
}

func startAgent(b *BigMemory) (*agent, error) {
	ip := b.f.cfg.BindIP
	if ip == "" {
		ip = "127.0.0.1"
	}
	h := func(ctx context.Context, method string, body json.RawMessage) (any, error) {
		if method != copyMethod {
			return nil, fmt.Errorf("bm: agent: no method %q: %w", method, status.ErrProtocol)
		}
		var req agentReq
		if err := json.Unmarshal(body, &req); err != nil {
			return nil, fmt.Errorf("bm: agent: %w: %w", status.ErrProtocol, err)
		}
		return nil, b.runForwarded(ctx, req.Items)
	}
	srv, err := rpc.Listen(net.JoinHostPort(ip, "0"), h, b.ctl, b.f.cfg.Secret, rankDown)
	if err != nil {
		return nil, fmt.Errorf("bm: copy agent: %w", err)
	}
	return &agent{srv: srv, client: rpc.NewClient(b.ctl, b.f.cfg.Secret, rankDown)}, nil
}

func (a *agent) addr() string { return a.srv.Addr() }

func (a *agent) close() error {
	a.client.Close()
	return a.srv.Close()
}

// runForwarded runs a peer's request: every element must have an end in this rank's slices;
// the other may be an address the requester registered (its staging buffer).
func (b *BigMemory) runForwarded(ctx context.Context, ps []fwdItem) error {
	items := make([]item, 0, len(ps))
	for i, p := range ps {
		s, d, err := b.resolveForwarded(p)
		if err != nil {
			return fmt.Errorf("forwarded element %d: %w", i, err)
		}
		if s.rank != b.rank && d.rank != b.rank {
			return fmt.Errorf("forwarded element %d: neither end (ranks %d, %d) is this rank's (%d): %w", i, s.rank, d.rank, b.rank, status.ErrInvalidConfig)
		}
		items = append(items, item{s: s, d: d, n: p.Size, idx: i})
	}
	if len(items) == 0 {
		return nil
	}
	return b.run(ctx, items)
}

func (b *BigMemory) resolveForwarded(p fwdItem) (s, d end, err error) {
	if p.Size == 0 || p.Src+p.Size < p.Src || p.Dst+p.Size < p.Dst {
		return s, d, fmt.Errorf("bm: %d bytes: %w", p.Size, status.ErrInvalidConfig)
	}
	peerEnd := func(rank int, addr uint64) (end, error) {
		if rank == b.rank || rank >= b.f.world {
			return end{}, fmt.Errorf("bm: peer address of rank %d: %w", rank, status.ErrInvalidConfig)
		}
		return end{w: peerHost, addr: addr, rank: rank}, nil
	}
	if p.SrcRank >= 0 {
		s, err = peerEnd(p.SrcRank, p.Src)
	} else {
		s, err = b.global(p.Src, p.Size, false)
	}
	if err != nil {
		return s, d, err
	}
	if p.DstRank >= 0 {
		d, err = peerEnd(p.DstRank, p.Dst)
	} else {
		d, err = b.global(p.Dst, p.Size, false)
	}
	return s, d, err
}

// forward asks rank's agent to run copies with an end in its slices.
func (b *BigMemory) forward(ctx context.Context, rank int, ps []fwdItem) error {
	m, err := b.member(rank)
	if err != nil {
		return err
	}
	if err := b.agent.client.Call(ctx, m.d.Agent, copyMethod, agentReq{Items: ps}, nil); err != nil {
		return b.rankErr(rank, fmt.Errorf("bm: rank %d copying: %w", rank, err))
	}
	return nil
}
