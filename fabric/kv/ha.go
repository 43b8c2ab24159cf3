package kv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hmc-go/hmc/coord/store"
)

// HAConfig configures a master that keeps the pool's state in a config store (embedded or
// etcd) and leads when no other master does: several masters on one store elect one leader,
// and a standby takes over, with every segment and object, when the leader's rank goes down.
type HAConfig struct {
	// Store is the config store's URL (tcp://host:port or etcd://host:port[,…][/prefix]).
	Store string
	// Pool names the pool in the store (default "default"): its keys are kv/<pool>/….
	Pool string
	// Master and Server configure the master this process serves while it leads (Server.Addr:
	// where; port 0 picks one, published in the store for clients).
	Master MasterConfig
	Server ServerConfig
	// Heartbeat is the store link's liveness period (default 500 ms): a leader gone this many
	// times three is replaced.
	Heartbeat time.Duration
	// SnapshotEvery is how many log entries a leader writes between snapshots of the pool
	// (default 1024); older entries are then removed.
	SnapshotEvery int
	// Secret authenticates the store link (with the store's own).
	Secret []byte
	// Logger receives leadership events; nil discards them.
	Logger *slog.Logger
}

// HA is a master in a group of masters on one store: a standby, or the leader.
type HA struct {
	cfg    HAConfig
	st     store.Client
	prefix string
	stop   chan struct{}
	wg     sync.WaitGroup

	mu   sync.Mutex
	srv  *Server // while leading; guarded by mu
	mine []byte  // the leader key's value while leading; guarded by mu
}

// StartHA joins the masters of cfg.Pool on cfg.Store and stands by, leading when it can.
func StartHA(ctx context.Context, cfg HAConfig) (*HA, error) {
	if cfg.Pool == "" {
		cfg.Pool = "default"
	}
	if strings.ContainsAny(cfg.Pool, "/ ") {
		return nil, fail(InvalidParams, "pool name %q (no '/' or space)", cfg.Pool)
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 500 * time.Millisecond
	}
	if cfg.SnapshotEvery <= 0 {
		cfg.SnapshotEvery = 1024
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	st, err := store.Open(ctx, cfg.Store, store.Config{Ranking: store.Auto, WorldSize: store.MaxWorldSize, Heartbeat: cfg.Heartbeat, Secret: cfg.Secret})
	if err != nil {
		return nil, fmt.Errorf("kv: master's store %s: %w", cfg.Store, err)
	}
	h := &HA{cfg: cfg, st: st, prefix: poolPrefix(cfg.Pool), stop: make(chan struct{})}
	h.wg.Add(1)
	go h.run() // owned by h: Close stops it
	return h, nil
}

func poolPrefix(pool string) string { return "kv/" + pool + "/" }

// Leading reports whether this master leads now, and where it serves.
func (h *HA) Leading() (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.srv == nil {
		return "", false
	}
	return h.srv.Addr(), true
}

// Close stops standing by, and serving if it leads (the others take over).
func (h *HA) Close() error {
	close(h.stop)
	h.wg.Wait()
	h.mu.Lock()
	srv := h.srv
	h.srv = nil
	h.mu.Unlock()
	var err error
	if srv != nil {
		err = srv.Close()
	}
	return errors.Join(err, h.st.Close())
}

// run looks at the leader key every half heartbeat: absent, or naming a rank that is not
// live, this master tries to lead; leading, it steps down when it loses the store or the key
// names another master (it was counted dead and replaced: a newer epoch leads).
func (h *HA) run() {
	defer h.wg.Done()
	t := time.NewTicker(h.cfg.Heartbeat / 2)
	defer t.Stop()
	for {
		h.mu.Lock()
		srv, mine := h.srv, h.mine
		h.mu.Unlock()
		switch {
		case srv == nil:
			h.tryLead()
		case srv.leading() != nil:
			h.stepDown(srv, srv.leading())
		default:
			ctx, cancel := context.WithTimeout(context.Background(), h.cfg.Heartbeat)
			cur, err := h.st.Get(ctx, h.prefix+"leader", 0)
			cancel()
			if err == nil && !bytes.Equal(cur, mine) {
				h.stepDown(srv, fmt.Errorf("the leader key names %q now", cur))
			}
		}
		select {
		case <-h.stop:
			return
		case <-t.C:
		}
	}
}

func (h *HA) stepDown(srv *Server, why error) {
	h.cfg.Logger.Warn("kv master: stepping down", "err", why)
	lost := error(&Error{Code: RPCFail, Msg: fmt.Sprintf("this master no longer leads: %v", why)})
	srv.lost.lost.CompareAndSwap(nil, &lost)
	_ = srv.Close()
	h.mu.Lock()
	h.srv, h.mine = nil, nil
	h.mu.Unlock()
}

// tryLead takes the leader key when it is free or names a dead rank, with a new epoch: it
// serves (answering nothing yet), claims the key, loads the pool's state from the store (the
// latest snapshot, then every epoch's log after it, each up to the end its successor recorded),
// records where the previous epoch's log ends (entries a deposed leader writes after that are
// never read), and answers.
func (h *HA) tryLead() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*h.cfg.Heartbeat+10*time.Second)
	defer cancel()
	cur, err := h.st.Get(ctx, h.prefix+"leader", 0)
	var prevEpoch int64
	switch {
	case errors.Is(err, store.ErrNotExist):
		cur = nil
	case err != nil:
		return
	default:
		rank, _, epoch, ok := parseLeader(cur)
		if !ok {
			return
		}
		prevEpoch = epoch
		if rank != h.st.Rank() { // else this process's own claim from before a step-down
			if live, err := h.st.RankLive(ctx, rank); err != nil || live {
				return
			}
		}
	}
	epoch, err := h.st.Add(ctx, h.prefix+"epoch", 1)
	if err != nil {
		return
	}
	m := NewMaster(h.cfg.Master)
	m.setJournal(true)
	j := &journal{st: h.st, prefix: h.prefix, every: h.cfg.SnapshotEvery, m: m, epoch: epoch}
	scfg := h.cfg.Server
	scfg.journal = j
	srv, err := Serve(m, scfg)
	if err != nil {
		h.cfg.Logger.Warn("kv master: serving", "err", err)
		return
	}
	mine := []byte(fmt.Sprintf("%d %s %d", h.st.Rank(), srv.Addr(), epoch))
	if prev, err := h.st.CompareAndSwap(ctx, h.prefix+"leader", cur, mine); err != nil || !bytes.Equal(prev, cur) {
		_ = srv.Close()
		return
	}
	old, err := loadPool(ctx, h.st, h.prefix, m, prevEpoch)
	if err == nil && prevEpoch > 0 {
		end := old[len(old)-1] // the previous epoch's, as far as this leader applied it
		err = h.st.Set(ctx, fmt.Sprintf("%send/%d", h.prefix, prevEpoch), []byte(strconv.FormatInt(end.last, 10)))
	}
	if err != nil {
		h.cfg.Logger.Warn("kv master: loading the pool's state", "err", err)
		_ = srv.Close()
		_, _ = h.st.CompareAndSwap(ctx, h.prefix+"leader", mine, cur) // let another try, or this one again
		return
	}
	j.old, j.mine = old, mine
	m.graceLeases()
	now := time.Now()
	srv.mu.Lock()
	for _, c := range m.clients() {
		srv.beats[c] = now // inherited clients get a ClientTTL to find the new leader
	}
	srv.mu.Unlock()
	h.mu.Lock()
	h.srv, h.mine = srv, mine
	h.mu.Unlock()
	srv.markReady()
	h.cfg.Logger.Info("kv master: leading", "addr", srv.Addr(), "epoch", epoch, "objects", m.Stats().Objects)
}

// parseLeader reads the leader key's value: "<rank> <addr> <epoch>".
func parseLeader(v []byte) (rank int, addr string, epoch int64, ok bool) {
	f := strings.Fields(string(v))
	if len(f) != 3 {
		return 0, "", 0, false
	}
	r, err1 := strconv.Atoi(f[0])
	e, err2 := strconv.ParseInt(f[2], 10, 64)
	return r, f[1], e, err1 == nil && err2 == nil && e > 0
}

// journal is a leader's log in the store: in epoch E, its n-th entry under
// kv/<pool>/log/<E>/<n> (one writer per epoch: no shared counter); every SnapshotEvery entries
// a snapshot (kv/<pool>/snap names the latest, its chunks under kv/<pool>/snap/<E>/<n>/<i>)
// after which the entries it holds, older epochs' and the previous snapshot's chunks are
// removed.
type journal struct {
	st       store.Store
	prefix   string
	every    int
	m        *Master
	epoch    int64
	seq      int64      // the last entry written
	snapSeq  int64      // the last snapshot's
	old      []logRange // older epochs' entries, removed after the first snapshot
	lastSnap *snapHead  // the snapshot this one replaces
	mine     []byte     // the leader key's value naming this leader
	wg       sync.WaitGroup
}

// logRange is epoch's entries 1..last.
type logRange struct{ epoch, last int64 }

// snapChunk bounds one chunk of a snapshot (below etcd's default request limit).
const snapChunk = 512 << 10

type snapHead struct {
	Epoch  int64 `json:"epoch"`
	Seq    int64 `json:"seq"`
	Chunks int   `json:"chunks"`
}

func (j *journal) key(epoch, seq int64) string {
	return fmt.Sprintf("%slog/%d/%d", j.prefix, epoch, seq)
}

func (j *journal) write(ctx context.Context, e entry) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if err := j.st.Set(ctx, j.key(j.epoch, j.seq+1), b); err != nil {
		return err
	}
	j.seq++
	if j.seq-j.snapSeq < int64(j.every) {
		return nil
	}
	sn := j.m.snapshot()
	all, err := json.Marshal(sn)
	if err != nil {
		return err
	}
	head := snapHead{Epoch: j.epoch, Seq: j.seq}
	for off := 0; off < len(all); off += snapChunk {
		k := fmt.Sprintf("%ssnap/%d/%d/%d", j.prefix, j.epoch, j.seq, head.Chunks)
		if err := j.st.Set(ctx, k, all[off:min(off+snapChunk, len(all))]); err != nil {
			return err
		}
		head.Chunks++
	}
	hb, _ := json.Marshal(head)
	// A deposed leader must not replace the snapshot its successor will start from: the head is
	// written only while the leader key still names this one (a window of one store round trip).
	if cur, err := j.st.Get(ctx, j.prefix+"leader", 0); err != nil || !bytes.Equal(cur, j.mine) {
		return fmt.Errorf("kv: not writing a snapshot: the leader key is %q (%v)", cur, err)
	}
	if err := j.st.Set(ctx, j.prefix+"snap", hb); err != nil {
		return err
	}
	var gone []string // what the snapshot makes unneeded
	for i := j.snapSeq + 1; i <= j.seq; i++ {
		gone = append(gone, j.key(j.epoch, i))
	}
	for _, r := range j.old {
		for i := int64(1); i <= r.last; i++ {
			gone = append(gone, j.key(r.epoch, i))
		}
		gone = append(gone, fmt.Sprintf("%send/%d", j.prefix, r.epoch))
	}
	if p := j.lastSnap; p != nil {
		for i := 0; i < p.Chunks; i++ {
			gone = append(gone, fmt.Sprintf("%ssnap/%d/%d/%d", j.prefix, p.Epoch, p.Seq, i))
		}
	}
	j.old, j.snapSeq, j.lastSnap = nil, j.seq, &head
	j.wg.Add(1)
	go func() { // owned by j: its server's Close waits for it
		defer j.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, k := range gone { // best effort: a leftover is never read again
			_ = j.st.Remove(ctx, k)
		}
	}()
	return nil
}

// loadPool reads the pool's latest snapshot and every later log entry into m: the entries of
// each epoch from the snapshot's to lastEpoch, up to the end recorded for it (where its
// successor stopped reading; the last epoch has none: all of it). It returns each epoch's range
// as applied.
func loadPool(ctx context.Context, st store.Store, prefix string, m *Master, lastEpoch int64) ([]logRange, error) {
	from, fromSeq := int64(1), int64(0)
	hb, err := st.Get(ctx, prefix+"snap", 0)
	switch {
	case errors.Is(err, store.ErrNotExist):
	case err != nil:
		return nil, err
	default:
		var h snapHead
		if err := json.Unmarshal(hb, &h); err != nil {
			return nil, fmt.Errorf("kv: snapshot head: %w", err)
		}
		var all []byte
		for i := 0; i < h.Chunks; i++ {
			b, err := st.Get(ctx, fmt.Sprintf("%ssnap/%d/%d/%d", prefix, h.Epoch, h.Seq, i), 0)
			if err != nil {
				return nil, fmt.Errorf("kv: snapshot %d/%d chunk %d: %w", h.Epoch, h.Seq, i, err)
			}
			all = append(all, b...)
		}
		var sn snapshot
		if err := json.Unmarshal(all, &sn); err != nil {
			return nil, fmt.Errorf("kv: snapshot %d/%d: %w", h.Epoch, h.Seq, err)
		}
		m.restore(sn)
		from, fromSeq = h.Epoch, h.Seq
	}
	var ranges []logRange
	for e := from; e <= lastEpoch; e++ {
		bound := int64(math.MaxInt64)
		if b, err := st.Get(ctx, fmt.Sprintf("%send/%d", prefix, e), 0); err == nil {
			if bound, err = strconv.ParseInt(string(b), 10, 64); err != nil {
				return nil, fmt.Errorf("kv: the end of epoch %d: %q", e, b)
			}
		} else if !errors.Is(err, store.ErrNotExist) {
			return nil, err
		}
		i := int64(1)
		if e == from {
			i = fromSeq + 1
		}
		for ; i <= bound; i++ {
			b, err := st.Get(ctx, fmt.Sprintf("%slog/%d/%d", prefix, e, i), 0)
			if errors.Is(err, store.ErrNotExist) {
				break // the epoch's leader wrote no more
			}
			if err != nil {
				return nil, err
			}
			var en entry
			if err := json.Unmarshal(b, &en); err != nil {
				return nil, fmt.Errorf("kv: log entry %d/%d: %w", e, i, err)
			}
			m.apply(en)
		}
		ranges = append(ranges, logRange{epoch: e, last: i - 1})
	}
	if len(ranges) == 0 {
		ranges = append(ranges, logRange{epoch: lastEpoch})
	}
	return ranges, nil
}

// LeaderOf returns the address of the pool's leading master, as the store says.
func LeaderOf(ctx context.Context, st store.Store, pool string) (string, error) {
	if pool == "" {
		pool = "default"
	}
	v, err := st.Get(ctx, poolPrefix(pool)+"leader", 0)
	if err != nil {
		return "", err
	}
	_, addr, _, ok := parseLeader(v)
	if !ok {
		return "", fmt.Errorf("kv: leader key %q: %w", v, store.ErrFailed)
	}
	return addr, nil
}

// leaderState is whether a leader lost its log: it then stops answering (its clients turn to
// the next leader).
type leaderState struct {
	lost atomic.Pointer[error]
}
