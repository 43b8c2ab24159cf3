package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/comm"
	"github.com/hmc-go/hmc/coord/group"
	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/ctrl"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// A rank's buffer: slot r (written only by rank r) of slotSize bytes for each rank, then one
// atomic word per rank, then this rank's staging and landing areas.
const (
	slotSize  = 2 << 20
	maxRanks  = 16
	wordsOff  = maxRanks * slotSize
	stageOff  = wordsOff + 4096
	landOff   = stageOff + slotSize
	bufSize   = landOff + slotSize
	opTimeout = 10 * time.Second
	hangAfter = 3 * opTimeout // an operation still running after this counts as a hang
)

// Stats is what a rank reports when it stops.
type Stats struct {
	Rank        int            `json:"rank"`
	Ops         map[string]int `json:"ops"`    // completed and verified, by operation
	Errors      map[string]int `json:"errors"` // surfaced as typed errors, by operation/status
	Bytes       uint64         `json:"bytes"`
	Corruptions int            `json:"corruptions"`
	Hangs       int            `json:"hangs"`
	Routes      map[string]int `json:"routes"` // connections made, by the transport AUTO took
	Notes       []string       `json:"notes,omitempty"`
}

// shadow is what this rank knows it left at one peer incarnation: its slot's pattern and its
// atomic word's value (-1: unknown, after an error left them unspecified).
type shadow struct {
	gen          string
	seed, n      uint64
	known        bool
	word         int64
	ip           string
	data, ctrlPt int
}

func rankMain(args []string) error {
	if len(args) != 5 {
		return fmt.Errorf("usage: soakd rank RANK WORLD STORE_URL IP STATS_FILE")
	}
	me, _ := strconv.Atoi(args[0])
	world, _ := strconv.Atoi(args[1])
	url, ip, statsFile := args[2], args[3], args[4]
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	st := &Stats{Rank: me, Ops: map[string]int{}, Errors: map[string]int{}, Routes: map[string]int{}}
	defer func() {
		b, _ := json.Marshal(st)
		_ = os.WriteFile(statsFile, b, 0o644)
	}()
	openCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	kv, err := store.Open(openCtx, url, store.Config{Ranking: store.Explicit, Rank: me, WorldSize: world})
	if err != nil {
		return err
	}
	defer kv.Close()
	buf, err := buffer.New(0, bufSize, memory.CPU)
	if err != nil {
		return err
	}
	defer buf.Close()
	c, err := comm.New(buf, comm.Config{}) // the transports' default lanes, as users get
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.InitServer(ip, 0, 0, "", transport.AUTO); err != nil {
		return err
	}
	gen := strconv.FormatUint(rand.Uint64(), 36)
	_, dp, _ := strings.Cut(c.DataAddr(transport.AUTO), ":")
	card := fmt.Sprintf("%s %s %d %s", ip, dp, c.CtrlAddr().Port, gen)
	if err := kv.Set(openCtx, fmt.Sprintf("card/%d", me), []byte(card)); err != nil {
		return err
	}
	g, err := group.New(openCtx, kv, "soak", group.DefaultConfig())
	if err != nil {
		return err
	}
	defer g.Close()
	if _, err := g.Join(openCtx); err != nil {
		return err
	}
	var inflight atomic.Int64 // unix ns when the running operation began; 0: none
	go func() {               // the watchdog: an operation past hangAfter is a hang
		counted := int64(0)
		for ctx.Err() == nil {
			time.Sleep(time.Second)
			if t := inflight.Load(); t != 0 && t != counted && time.Since(time.Unix(0, t)) > hangAfter {
				counted = t
				fmt.Fprintf(os.Stderr, "rank %d: an operation has run for %v\n", me, time.Since(time.Unix(0, t)))
				st.Hangs++
			}
		}
	}()
	local := buf.Bytes()
	peers := map[int]*shadow{}
	lastBarrier := time.Now()
	for ctx.Err() == nil {
		if time.Since(lastBarrier) > 5*time.Second {
			lastBarrier = time.Now()
			bctx, cancel := context.WithTimeout(ctx, opTimeout)
			inflight.Store(time.Now().UnixNano())
			// A rank cut off from the store long enough to be taken for dead is dropped from
			// the group and joins again by itself (coord/group): not_member errors until then.
			err := g.Barrier(bctx)
			inflight.Store(0)
			cancel()
			st.count("barrier", err)
			continue
		}
		p := rand.IntN(world)
		if p == me {
			continue
		}
		_, known := peers[p]
		sh, err := refresh(ctx, kv, c, peers, p, me)
		if err != nil {
			time.Sleep(20 * time.Millisecond) // not up (yet, or again)
			continue
		}
		peer := c.Peer(sh.ip, sh.data, transport.AUTO)
		if !known {
			route, _ := peer.Route()
			st.Routes[fmt.Sprintf("%v (%s)", route, map[bool]string{true: "same namespace", false: "across"}[sh.ip == ip])]++
		}
		octx, cancel := context.WithTimeout(ctx, opTimeout)
		inflight.Store(time.Now().UnixNano())
		op, err := step(octx, c, peer, sh, me, local, st)
		inflight.Store(0)
		cancel()
		if ctx.Err() != nil {
			break
		}
		st.count(op, err)
		if err != nil {
			sh.known, sh.word = false, -1
			_ = peer.Disconnect() // redialled (or found restarted) next time
			delete(peers, p)
		}
	}
	return nil
}

// refresh returns what this rank knows of peer p, connecting to it (again) if needed; a new
// incarnation of p (another gen in its card) starts from nothing.
func refresh(ctx context.Context, kv store.Client, c *comm.Communicator, peers map[int]*shadow, p, me int) (*shadow, error) {
	if sh, ok := peers[p]; ok {
		return sh, nil
	}
	gctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	v, err := kv.Get(gctx, fmt.Sprintf("card/%d", p), 0)
	if err != nil {
		return nil, err
	}
	var sh shadow
	if _, err := fmt.Sscanf(string(v), "%s %d %d %s", &sh.ip, &sh.data, &sh.ctrlPt, &sh.gen); err != nil {
		return nil, err
	}
	sh.word = -1
	link := comm.CtrlLink{Transport: ctrl.TCP, IP: sh.ip, Port: sh.ctrlPt}
	if err := c.ConnectTo(gctx, uint32(p), uint32(me), sh.ip, sh.data, link, transport.AUTO); err != nil {
		return nil, err
	}
	peers[p] = &sh
	return &sh, nil
}

func pattern(b []byte, seed uint64) {
	x := seed | 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
}

// step runs one random operation on peer and verifies what it can.
func step(ctx context.Context, c *comm.Communicator, peer *comm.Peer, sh *shadow, me int, local []byte, st *Stats) (string, error) {
	slot := uint64(me) * slotSize
	stage, land := local[stageOff:stageOff+slotSize], local[landOff:landOff+slotSize]
	verify := func(n uint64) error {
		if err := peer.Get(ctx, landOff, slot, n); err != nil {
			return err
		}
		st.Bytes += n
		pattern(stage[:n], sh.seed)
		for i := range n {
			if land[i] != stage[i] {
				st.Corruptions++
				st.Notes = append(st.Notes, fmt.Sprintf("%v: slot byte %d of %d differs", time.Now().Format(time.TimeOnly), i, n))
				return nil
			}
		}
		return nil
	}
	switch r := rand.IntN(10); {
	case r < 4: // put, then get it back
		n := 1 + rand.Uint64N(slotSize)
		sh.seed, sh.n = rand.Uint64(), n
		pattern(stage[:n], sh.seed)
		sh.known = false
		if err := peer.Put(ctx, stageOff, slot, n); err != nil {
			return "put", err
		}
		st.Bytes += n
		sh.known = true
		return "put", verify(n)
	case r < 6: // get: the slot still holds what this rank put
		if !sh.known {
			return "get", nil
		}
		return "get", verify(sh.n)
	case r < 8: // a batch: the slot put as 4 non-blocking pieces, waited together
		n := 4 + rand.Uint64N(slotSize-4)
		sh.seed, sh.n = rand.Uint64(), n
		pattern(stage[:n], sh.seed)
		sh.known = false
		q := n / 4
		var ids []uint64
		var first error
		for i := range uint64(4) {
			end := (i + 1) * q
			if i == 3 {
				end = n
			}
			id, err := peer.PutNB(ctx, stageOff+i*q, slot+i*q, end-i*q)
			if err != nil {
				first = err
				break
			}
			ids = append(ids, id)
		}
		for _, id := range ids {
			if err := c.Wait(ctx, id); err != nil && first == nil {
				first = err
			}
		}
		if first != nil {
			return "batch", first
		}
		st.Bytes += n
		sh.known = true
		return "batch", verify(n)
	default: // fetch-add on this rank's word: the old value is what this rank left there
		dst := transport.Remote{Key: transport.DefaultRegion, Addr: wordsOff + 8*uint64(me)}
		old, err := peer.Atomic(ctx, buffer.AtomicFetchAdd, dst, 1, 0)
		if err != nil {
			return "atomic", err
		}
		if sh.word >= 0 && int64(old) != sh.word {
			st.Corruptions++
			st.Notes = append(st.Notes, fmt.Sprintf("atomic word: old %d, want %d", old, sh.word))
		}
		sh.word = int64(old) + 1
		return "atomic", nil
	}
}

func (st *Stats) count(op string, err error) {
	if err == nil {
		st.Ops[op]++
		return
	}
	k := op + "/" + statusName(err)
	if st.Errors[k] == 0 || os.Getenv("SOAK_VERBOSE") != "" {
		fmt.Fprintf(os.Stderr, "rank %d: %s: %v\n", st.Rank, k, err)
	}
	st.Errors[k]++
}

func statusName(err error) string {
	for _, s := range []struct {
		err  error
		name string
	}{{status.ErrTimeout, "timeout"}, {status.ErrPeerClosed, "peer_closed"}, {status.ErrClosed, "closed"},
		{status.ErrNotFound, "not_found"}, {status.ErrPermission, "permission"}, {status.ErrProtocol, "protocol"},
		{status.ErrCanceled, "canceled"}, {group.ErrNotMember, "not_member"}, {status.ErrInvalidConfig, "invalid_config"}, {status.ErrFailed, "failed"}} {
		if errors.Is(err, s.err) {
			return s.name
		}
	}
	return "untyped"
}
