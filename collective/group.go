package collective

import (
	"context"
	"encoding/binary"
	"fmt"
	"sort"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/comm"
	"github.com/hmc-go/hmc/ctrl"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// Member is one process of a group: its rank and where its Communicator serves.
type Member struct {
	Rank     uint32
	IP       string
	DataPort int
	CtrlPort int // the control plane's TCP port
}

// Group is this process's view of a group. It is not safe for concurrent collectives.
type Group struct {
	c       *comm.Communicator
	members []Member // sorted by rank, ranks 0..world-1
	rank    int
	ct      transport.ConnType
	seq     uint64 // collectives run so far, to keep their messages apart
}

// msgColl carries the collectives' "data is there" notices (an internal control type).
const msgColl = ctrl.FirstInternalType + 0x10

// New makes a group of members (ranks 0..n-1, each once) in which this process has rank. The
// Communicator must already serve (InitServer) at this member's address. Lower ranks connect to
// higher ones (one control link per pair); the higher side reaches the lower one through the
// data connection it accepted. The call returns when every link is up.
func New(ctx context.Context, c *comm.Communicator, members []Member, rank uint32, ct transport.ConnType) (*Group, error) {
	ms := append([]Member(nil), members...)
	sort.Slice(ms, func(i, j int) bool { return ms[i].Rank < ms[j].Rank })
	for i, m := range ms {
		if m.Rank != uint32(i) {
			return nil, fmt.Errorf("collective: ranks must be 0..%d, each once (got %d at %d): %w", len(ms)-1, m.Rank, i, status.ErrInvalidConfig)
		}
	}
	if int(rank) >= len(ms) {
		return nil, fmt.Errorf("collective: rank %d in a group of %d: %w", rank, len(ms), status.ErrInvalidConfig)
	}
	g := &Group{c: c, members: ms, rank: int(rank), ct: ct}
	for _, m := range ms[rank+1:] {
		link := comm.CtrlLink{Transport: ctrl.TCP, IP: m.IP, Port: m.CtrlPort}
		if err := c.ConnectTo(ctx, m.Rank, rank, m.IP, m.DataPort, link, ct); err != nil {
			return nil, fmt.Errorf("collective: rank %d connecting to %d: %w", rank, m.Rank, err)
		}
	}
	// Everyone says hello to everyone: it returns once every control link exists both ways.
	for _, m := range ms {
		if m.Rank != rank {
			if err := g.notify(ctx, m.Rank, 0, 0); err != nil {
				return nil, err
			}
		}
	}
	for _, m := range ms {
		if m.Rank != rank {
			if err := g.expect(ctx, m.Rank, 0, 0); err != nil {
				return nil, err
			}
		}
	}
	return g, nil
}

// World returns the group size; Rank this process's rank.
func (g *Group) World() int { return len(g.members) }

// Rank returns this process's rank in the group.
func (g *Group) Rank() int { return g.rank }

func (g *Group) notify(ctx context.Context, peer uint32, seq, step uint64) error {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:], seq)
	binary.LittleEndian.PutUint64(b[8:], step)
	return g.c.Ctrl().Send(ctx, peer, msgColl, 0, b[:])
}

func (g *Group) expect(ctx context.Context, peer uint32, seq, step uint64) error {
	m, err := g.c.Ctrl().RecvType(ctx, peer, msgColl)
	if err != nil {
		return fmt.Errorf("collective: waiting for rank %d: %w", peer, err)
	}
	if len(m.Payload) != 16 || binary.LittleEndian.Uint64(m.Payload) != seq || binary.LittleEndian.Uint64(m.Payload[8:]) != step {
		return fmt.Errorf("collective: rank %d is out of step (want collective %d step %d): %w", peer, seq, step, status.ErrProtocol)
	}
	return nil
}

func (g *Group) peer(r int) Member {
	return g.members[(r%len(g.members)+len(g.members))%len(g.members)]
}

// Algo chooses an all-to-all algorithm.
type Algo int

// All-to-all algorithms.
const (
	Auto   Algo = iota // Direct for groups of up to 8, else Ring (as upstream)
	Direct             // every rank puts each block straight to its destination
	Ring               // blocks travel around the ring, one neighbour hop per step
)

// ParseAlgo reads "auto", "direct" or "ring".
func ParseAlgo(s string) (Algo, error) {
	switch s {
	case "auto", "":
		return Auto, nil
	case "direct":
		return Direct, nil
	case "ring":
		return Ring, nil
	}
	return 0, fmt.Errorf("collective: algorithm %q: %w", s, status.ErrInvalidConfig)
}

// ScratchSize is the scratch space Ring needs in every member's buffer for blocks of block bytes.
func ScratchSize(world int, block uint64) uint64 {
	return uint64(world) * uint64(world-1) / 2 * block
}

// AllToAll exchanges blocks: rank r's block j ([sendOff + j*block, +block) of its buffer) ends
// in rank j's buffer at recvOff + r*block. Every member calls it with the same offsets and block
// size. Ring also needs ScratchSize(world, block) bytes at scratchOff in every buffer. When it
// returns, this rank's receive area is complete.
func (g *Group) AllToAll(ctx context.Context, algo Algo, sendOff, recvOff, scratchOff, block uint64) error {
	w := uint64(len(g.members))
	buf := g.c.Buffer()
	if err := checkAreas(buf, w, sendOff, recvOff, block); err != nil {
		return err
	}
	if algo == Auto {
		algo = Direct
		if w > 8 {
			algo = Ring
		}
	}
	g.seq++
	if err := buf.CopyWithin(recvOff+uint64(g.rank)*block, sendOff+uint64(g.rank)*block, block); err != nil {
		return err
	}
	if w == 1 || block == 0 {
		return nil
	}
	switch algo {
	case Direct:
		return g.direct(ctx, sendOff, recvOff, block)
	case Ring:
		if err := buf.Check(scratchOff, ScratchSize(int(w), block)); err != nil {
			return fmt.Errorf("collective: ring scratch: %w", err)
		}
		return g.ring(ctx, sendOff, recvOff, scratchOff, block)
	}
	return fmt.Errorf("collective: algorithm %d: %w", algo, status.ErrInvalidConfig)
}

func checkAreas(buf *buffer.ConnBuffer, w, sendOff, recvOff, block uint64) error {
	if w != 0 && block > (1<<62)/w {
		return fmt.Errorf("collective: block of %d bytes: %w", block, status.ErrInvalidConfig)
	}
	if err := buf.Check(sendOff, w*block); err != nil {
		return fmt.Errorf("collective: send area: %w", err)
	}
	if err := buf.Check(recvOff, w*block); err != nil {
		return fmt.Errorf("collective: receive area: %w", err)
	}
	if sendOff < recvOff+w*block && recvOff < sendOff+w*block {
		return fmt.Errorf("collective: send and receive areas overlap: %w", status.ErrInvalidConfig)
	}
	return nil
}

func (g *Group) direct(ctx context.Context, sendOff, recvOff, block uint64) error {
	w := len(g.members)
	var ids []uint64
	for i := 1; i < w; i++ { // staggered: rank r starts with r+1, so not everyone hits rank 0 first
		m := g.peer(g.rank + i)
		id, err := g.c.Peer(m.IP, m.DataPort, g.ct).PutNB(ctx, sendOff+uint64(m.Rank)*block, recvOff+uint64(g.rank)*block, block)
		if err != nil {
			return err
		}
		ids = append(ids, id)
	}
	if err := g.c.Wait(ctx, ids...); err != nil {
		return err
	}
	for i := 1; i < w; i++ { // our blocks are visible at every peer: say so
		if err := g.notify(ctx, g.peer(g.rank+i).Rank, g.seq, 1); err != nil {
			return err
		}
	}
	for i := 1; i < w; i++ {
		if err := g.expect(ctx, g.peer(g.rank-i).Rank, g.seq, 1); err != nil {
			return err
		}
	}
	return nil
}

// ring: at step s (1..w-1) each rank puts one packet to its right neighbour: at step 1 its own
// w-1 blocks for ranks r+1..r+w-1; later the packet it received at step s-1 minus the block that
// was for itself. A packet from origin o at step s holds the blocks for o+s, ..., o+w-1; the
// receiver (o+s) keeps the first. Step s lands in its own scratch area, so no area is reused.
func (g *Group) ring(ctx context.Context, sendOff, recvOff, scratchOff, block uint64) error {
	w := len(g.members)
	buf := g.c.Buffer()
	right, left := g.peer(g.rank+1), g.peer(g.rank-1)
	area := func(s int) uint64 { // scratch offset of step s's packet (w-s blocks)
		off := scratchOff
		for k := 1; k < s; k++ {
			off += uint64(w-k) * block
		}
		return off
	}
	// Step 1's packet is our own blocks for r+1..r+w-1: they sit in the send area in rank
	// order, not ring order, so step 1 puts them one block at a time.
	for s := 1; s < w; s++ {
		n := uint64(w - s)
		var ids []uint64
		if s == 1 {
			for k := uint64(0); k < n; k++ {
				dst := (g.rank + 1 + int(k)) % w
				id, err := g.c.Peer(right.IP, right.DataPort, g.ct).PutNB(ctx, sendOff+uint64(dst)*block, area(1)+k*block, block)
				if err != nil {
					return err
				}
				ids = append(ids, id)
			}
		} else {
			// Forward what arrived at step s-1, less its first block (ours, already taken).
			id, err := g.c.Peer(right.IP, right.DataPort, g.ct).PutNB(ctx, area(s-1)+block, area(s), n*block)
			if err != nil {
				return err
			}
			ids = append(ids, id)
		}
		if err := g.c.Wait(ctx, ids...); err != nil {
			return err
		}
		if err := g.notify(ctx, right.Rank, g.seq, uint64(s)); err != nil {
			return err
		}
		if err := g.expect(ctx, left.Rank, g.seq, uint64(s)); err != nil {
			return err
		}
		origin := (g.rank - s + w) % w
		if err := buf.CopyWithin(recvOff+uint64(origin)*block, area(s), block); err != nil {
			return err
		}
	}
	return nil
}
