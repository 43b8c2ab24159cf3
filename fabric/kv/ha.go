package kv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
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

	mu  sync.Mutex
	srv *Server // while leading; guarded by mu
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
// live, this master tries to lead; leading, it steps down when it loses the store.
func (h *HA) run() {
	defer h.wg.Done()
	t := time.NewTicker(h.cfg.Heartbeat / 2)
	defer t.Stop()
	for {
		h.mu.Lock()
		srv := h.srv
		h.mu.Unlock()
		if srv != nil && srv.leading() != nil {
			h.cfg.Logger.Warn("kv master: stepping down", "err", srv.leading())
			_ = srv.Close()
			h.mu.Lock()
			h.srv = nil
			h.mu.Unlock()
		} else if srv == nil {
			h.tryLead()
		}
		select {
		case <-h.stop:
			return
		case <-t.C:
		}
	}
}

// tryLead takes the leader key when it is free or names a dead rank: it loads the pool's
// state from the store, serves it, and claims the key (a standby that loses the race closes
// its server again).
func (h *HA) tryLead() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*h.cfg.Heartbeat+10*time.Second)
	defer cancel()
	cur, err := h.st.Get(ctx, h.prefix+"leader", 0)
	switch {
	case errors.Is(err, store.ErrNotExist):
		cur = nil
	case err != nil:
		return
	default:
		rank, _, ok := parseLeader(cur)
		if ok && rank == h.st.Rank() {
			break // this process's own claim from before a step-down: take it again
		}
		if live, err := h.st.RankLive(ctx, rank); !ok || err != nil || live {
			return
		}
	}
	m := NewMaster(h.cfg.Master)
	m.setJournal(true)
	seq, err := loadPool(ctx, h.st, h.prefix, m)
	if err != nil {
		h.cfg.Logger.Warn("kv master: loading the pool's state", "err", err)
		return
	}
	m.graceLeases()
	j := &journal{st: h.st, prefix: h.prefix, every: h.cfg.SnapshotEvery, m: m, seq: seq, snapSeq: seq}
	scfg := h.cfg.Server
	scfg.journal = j
	srv, err := Serve(m, scfg)
	if err != nil {
		h.cfg.Logger.Warn("kv master: serving", "err", err)
		return
	}
	now := time.Now()
	srv.mu.Lock()
	for _, c := range m.clients() {
		srv.beats[c] = now // inherited clients get a ClientTTL to find the new leader
	}
	srv.mu.Unlock()
	mine := []byte(strconv.Itoa(h.st.Rank()) + " " + srv.Addr())
	prev, err := h.st.CompareAndSwap(ctx, h.prefix+"leader", cur, mine)
	if err != nil || !bytes.Equal(prev, cur) {
		_ = srv.Close()
		return
	}
	h.cfg.Logger.Info("kv master: leading", "addr", srv.Addr(), "objects", m.Stats().Objects, "log", seq)
	h.mu.Lock()
	h.srv = srv
	h.mu.Unlock()
}

// parseLeader reads the leader key's value: "<rank> <addr>".
func parseLeader(v []byte) (int, string, bool) {
	r, addr, ok := strings.Cut(string(v), " ")
	n, err := strconv.Atoi(r)
	return n, addr, ok && err == nil && addr != ""
}

// journal is a leader's log in the store: entry n under kv/<pool>/log/<n>, n counted by
// kv/<pool>/seq, and every SnapshotEvery entries a snapshot (kv/<pool>/snap, its chunks under
// kv/<pool>/snap/<seq>/<i>) after which older entries are removed.
type journal struct {
	st      store.Store
	prefix  string
	every   int
	m       *Master
	seq     int64 // the last entry written
	snapSeq int64 // the last snapshot's
	wg      sync.WaitGroup
}

// snapChunk bounds one chunk of a snapshot (below etcd's default request limit).
const snapChunk = 512 << 10

type snapHead struct {
	Seq    int64 `json:"seq"`
	Chunks int   `json:"chunks"`
}

func (j *journal) write(ctx context.Context, e entry) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	seq, err := j.st.Add(ctx, j.prefix+"seq", 1)
	if err != nil {
		return err
	}
	if err := j.st.Set(ctx, fmt.Sprintf("%slog/%d", j.prefix, seq), b); err != nil {
		return err
	}
	j.seq = seq
	if seq-j.snapSeq < int64(j.every) {
		return nil
	}
	sn := j.m.snapshot()
	sn.Seq = seq
	all, err := json.Marshal(sn)
	if err != nil {
		return err
	}
	n := 0
	for off := 0; off < len(all); off += snapChunk {
		if err := j.st.Set(ctx, fmt.Sprintf("%ssnap/%d/%d", j.prefix, seq, n), all[off:min(off+snapChunk, len(all))]); err != nil {
			return err
		}
		n++
	}
	head, _ := json.Marshal(snapHead{Seq: seq, Chunks: n})
	if err := j.st.Set(ctx, j.prefix+"snap", head); err != nil {
		return err
	}
	from, to := j.snapSeq, seq
	j.snapSeq = seq
	j.wg.Add(1)
	go func() { // owned by j: its server's Close waits for it
		defer j.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for i := from + 1; i <= to; i++ { // the entries the snapshot holds, best effort
			_ = j.st.Remove(ctx, fmt.Sprintf("%slog/%d", j.prefix, i))
		}
	}()
	return nil
}

// loadPool reads the pool's latest snapshot and every later log entry into m and returns the
// last entry's number.
func loadPool(ctx context.Context, st store.Store, prefix string, m *Master) (int64, error) {
	var from int64
	head, err := st.Get(ctx, prefix+"snap", 0)
	switch {
	case errors.Is(err, store.ErrNotExist):
	case err != nil:
		return 0, err
	default:
		var h snapHead
		if err := json.Unmarshal(head, &h); err != nil {
			return 0, fmt.Errorf("kv: snapshot head: %w", err)
		}
		var all []byte
		for i := 0; i < h.Chunks; i++ {
			b, err := st.Get(ctx, fmt.Sprintf("%ssnap/%d/%d", prefix, h.Seq, i), 0)
			if err != nil {
				return 0, fmt.Errorf("kv: snapshot %d chunk %d: %w", h.Seq, i, err)
			}
			all = append(all, b...)
		}
		var sn snapshot
		if err := json.Unmarshal(all, &sn); err != nil {
			return 0, fmt.Errorf("kv: snapshot %d: %w", h.Seq, err)
		}
		m.restore(sn)
		from = sn.Seq
	}
	cur, err := st.Add(ctx, prefix+"seq", 0)
	if err != nil {
		return 0, err
	}
	for i := from + 1; i <= cur; i++ {
		b, err := st.Get(ctx, fmt.Sprintf("%slog/%d", prefix, i), 0)
		if errors.Is(err, store.ErrNotExist) {
			continue // a leader that died between counting and writing it: never answered
		}
		if err != nil {
			return 0, err
		}
		var e entry
		if err := json.Unmarshal(b, &e); err != nil {
			return 0, fmt.Errorf("kv: log entry %d: %w", i, err)
		}
		m.apply(e)
	}
	return cur, nil
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
	_, addr, ok := parseLeader(v)
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
