package bm

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/hmc-go/hmc/status"
)

// The copy agent: each rank of an object serves a small request socket on which a peer asks
// it to copy between global addresses, so a G2G copy between two other ranks is done by the
// source's owner (one network crossing) instead of through the caller. A request is a frame
// (u32 little-endian length, then JSON) carrying the elements; the reply is a frame with the
// status code and error text. Requests name only global addresses of the object: an agent
// copies nothing that its rank's Copy would refuse.

// maxAgentFrame bounds a request (a batch of 64 Ki elements fits).
const maxAgentFrame = 8 << 20

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

type agentResp struct {
	Code int    `json:"code"` // 0: done
	Kind string `json:"kind,omitempty"`
	Err  string `json:"err,omitempty"`
}

// finer are the sentinels a reply names beyond its status code.
var finer = []struct {
	name string
	err  error
}{{"rank_down", ErrRankDown}, {"out_of_range", status.ErrOutOfRange}, {"peer_closed", status.ErrPeerClosed},
	{"closed", status.ErrClosed}, {"permission", status.ErrPermission}}

func errKind(err error) string {
	for _, f := range finer {
		if errors.Is(err, f.err) {
			return f.name
		}
	}
	return ""
}

func (r agentResp) sentinel() error {
	for _, f := range finer {
		if f.name == r.Kind {
			return f.err
		}
	}
	return status.Code(r.Code).Err()
}

type agent struct {
	b  *BigMemory
	l  net.Listener
	wg sync.WaitGroup

	mu     sync.Mutex
	conns  map[net.Conn]struct{} // served; guarded by mu
	dialed map[int]*agentConn    // to peers, by rank; guarded by mu
	closed bool                  // guarded by mu
}

type agentConn struct {
	mu   sync.Mutex // one request at a time
	addr string
	c    net.Conn
	r    *bufio.Reader
}

func startAgent(b *BigMemory) (*agent, error) {
	ip := b.f.cfg.BindIP
	if ip == "" {
		ip = "127.0.0.1"
	}
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return nil, fmt.Errorf("bm: copy agent: %w: %w", status.ErrFailed, err)
	}
	a := &agent{b: b, l: l, conns: make(map[net.Conn]struct{}), dialed: make(map[int]*agentConn)}
	a.wg.Add(1)
	go a.accept() // owned by a: close stops and waits
	return a, nil
}

func (a *agent) addr() string { return a.l.Addr().String() }

func (a *agent) accept() {
	defer a.wg.Done()
	for {
		c, err := a.l.Accept()
		if err != nil {
			return
		}
		a.mu.Lock()
		if a.closed {
			a.mu.Unlock()
			_ = c.Close()
			return
		}
		a.conns[c] = struct{}{}
		a.wg.Add(1)
		a.mu.Unlock()
		go a.serve(c) // owned by a
	}
}

func (a *agent) serve(c net.Conn) {
	defer a.wg.Done()
	defer func() {
		a.mu.Lock()
		delete(a.conns, c)
		a.mu.Unlock()
		_ = c.Close()
	}()
	r := bufio.NewReader(c)
	for {
		var req agentReq
		if err := readFrame(r, &req); err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), a.b.ctl)
		err := a.b.runForwarded(ctx, req.Items)
		cancel()
		resp := agentResp{}
		if err != nil {
			resp.Code, resp.Kind, resp.Err = int(status.CodeOf(err)), errKind(err), err.Error()
		}
		if err := writeFrame(c, resp); err != nil {
			return
		}
	}
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

// forward asks rank to run a batch of G2G copies from its slice.
func (b *BigMemory) forward(ctx context.Context, rank int, ps []fwdItem) error {
	m, err := b.member(rank)
	if err != nil {
		return err
	}
	a := b.agent
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return fmt.Errorf("bm: %w", status.ErrClosed)
	}
	ac := a.dialed[rank]
	if ac == nil || ac.addr != m.d.Agent {
		ac = &agentConn{addr: m.d.Agent}
		a.dialed[rank] = ac
	}
	a.mu.Unlock()
	ac.mu.Lock()
	defer ac.mu.Unlock()
	if ac.c == nil {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", ac.addr)
		if err != nil {
			return b.rankErr(rank, fmt.Errorf("bm: rank %d's copy agent: %w: %w", rank, status.ErrPeerClosed, err))
		}
		ac.c, ac.r = c, bufio.NewReader(c)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = ac.c.SetDeadline(dl)
	} else {
		_ = ac.c.SetDeadline(time.Now().Add(b.ctl))
	}
	var resp agentResp
	err = writeFrame(ac.c, agentReq{Items: ps})
	if err == nil {
		err = readFrame(ac.r, &resp)
	}
	if err != nil {
		_ = ac.c.Close()
		ac.c = nil
		if cerr := status.FromContext(ctx); cerr != nil {
			return cerr
		}
		return b.rankErr(rank, fmt.Errorf("bm: rank %d's copy agent: %w: %w", rank, status.ErrPeerClosed, err))
	}
	if resp.Code != 0 {
		return fmt.Errorf("bm: rank %d copying: %s: %w", rank, resp.Err, resp.sentinel())
	}
	return nil
}

func writeFrame(w io.Writer, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	buf := make([]byte, 4+len(body))
	binary.LittleEndian.PutUint32(buf, uint32(len(body)))
	copy(buf[4:], body)
	_, err = w.Write(buf)
	return err
}

func readFrame(r io.Reader, v any) error {
	var h [4]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return err
	}
	n := binary.LittleEndian.Uint32(h[:])
	if n > maxAgentFrame {
		return fmt.Errorf("bm: agent frame of %d bytes: %w", n, status.ErrProtocol)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return err
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("bm: agent frame: %w: %w", status.ErrProtocol, err)
	}
	return nil
}

func (a *agent) close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	a.closed = true
	for c := range a.conns {
		_ = c.Close()
	}
	var dialed []*agentConn
	for _, ac := range a.dialed {
		dialed = append(dialed, ac)
	}
	a.mu.Unlock()
	err := a.l.Close()
	for _, ac := range dialed {
		ac.mu.Lock()
		if ac.c != nil {
			_ = ac.c.Close()
		}
		ac.mu.Unlock()
	}
	a.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
