package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// etcdClient is a Client on an etcd cluster. Layout under the namespace ns (docs/wire/store.md):
//
//	ns+"kv/"+key          the values
//	ns+"world"            the world size (created once)
//	ns+"rank/%04d"        a live rank: the owner's client id, under the owner's lease
//	ns+"tok/"+id+"/"+seq  write tokens: make retried writes exactly-once
//
// Every write that is not idempotent (Add, Append, CompareAndSwap, Remove) is a transaction
// that compares the key's revision and also creates a token key. When an attempt fails in a way
// that leaves its fate unknown (the leader died with the proposal in flight), the token tells:
// a linearizable read of it after the failure sees it iff the attempt committed. Tokens of
// confirmed writes are deleted in later transactions and on Close.
type etcdClient struct {
	cli   *clientv3.Client
	cfg   Config
	ns    string
	id    string
	lease atomic.Int64 // the clientv3.LeaseID holding this client's rank; a new one after expiry
	seq   atomic.Uint64

	mu        sync.Mutex
	rank      int      // guarded by mu
	taken     int      // a rank lost to another client while cut off, else NoRank; guarded by mu
	world     int      // guarded by mu
	confirmed []string // tokens of committed writes, to delete; guarded by mu

	watch  *rankWatchers
	dirs   dirWatches      // Rendezvous.Await's long-lived watches
	bg     context.Context // ends at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed atomic.Bool
}

// attemptTimeout bounds one etcd request, so that a request stuck on a dead member is retried
// on another within the caller's deadline.
const attemptTimeout = 3 * time.Second

func openEtcd(ctx context.Context, rest string, cfg Config) (*etcdClient, error) {
	hosts, path, _ := strings.Cut(rest, "/")
	ns := "/hmc/"
	if path != "" {
		ns = "/" + strings.Trim(path, "/") + "/"
	}
	var eps []string
	for _, h := range strings.Split(hosts, ",") {
		addr, err := ParseTCPAddr(h)
		if err != nil {
			return nil, err
		}
		eps = append(eps, addr)
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: eps, DialTimeout: cfg.DialTimeout, TLS: cfg.TLS,
		DialKeepAliveTime: time.Second, DialKeepAliveTimeout: 2 * time.Second,
		Logger: zap.NewNop(), Context: context.WithoutCancel(ctx),
	})
	if err != nil {
		return nil, fmt.Errorf("%w: etcd %v: %w", ErrIO, eps, err)
	}
	idb := make([]byte, 8)
	_, _ = rand.Read(idb)
	e := &etcdClient{cli: cli, cfg: cfg, ns: ns, id: hex.EncodeToString(idb), rank: NoRank, taken: NoRank, watch: newRankWatchers()}
	if err := e.start(ctx); err != nil {
		if e.cancel != nil {
			e.cancel() // the keep-alive and watch goroutines, if started
		}
		_ = cli.Close()
		e.wg.Wait()
		e.watch.close()
		return nil, err
	}
	return e, nil
}

func (e *etcdClient) start(ctx context.Context) error {
	dctx, cancel := context.WithTimeout(ctx, e.cfg.DialTimeout)
	defer cancel()
	ttl := int64((3*e.cfg.Heartbeat + time.Second - 1) / time.Second)
	if ttl < 2 {
		ttl = 2
	}
	var lease *clientv3.LeaseGrantResponse
	// While the lease is not granted, say so within half a second, then every few seconds (an
	// attempt to an etcd that is not there only fails at its own timeout).
	wait := e.cfg.DialTimeout
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
		wait = time.Until(dl).Round(time.Millisecond)
	}
	nag := newNagger(e.cfg.Logger, "etcd://"+strings.Join(e.cli.Endpoints(), ","), wait)
	granted := make(chan struct{})
	var nagging sync.WaitGroup
	nagging.Add(1)
	go func() {
		defer nagging.Done()
		t := time.NewTimer(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-granted:
				return
			case <-t.C:
				nag.failed(join(errors.New("no lease yet"), dialProbe(e.cli.Endpoints())))
				t.Reset(nagEvery)
			}
		}
	}()
	err := e.retry(dctx, func(actx context.Context) (err error) {
		lease, err = e.cli.Grant(actx, ttl)
		return err
	})
	close(granted)
	nagging.Wait()
	if err != nil {
		return fmt.Errorf("%w: etcd at %v: no lease within %v: %w", ErrIO, e.cli.Endpoints(), wait, join(err, dialProbe(e.cli.Endpoints())))
	}
	e.lease.Store(int64(lease.ID))
	bg, stop := context.WithCancel(context.Background())
	e.bg, e.cancel = bg, stop
	ka, err := e.cli.KeepAlive(bg, lease.ID)
	if err != nil {
		stop()
		return fmt.Errorf("%w: etcd keep-alive: %w", ErrIO, err)
	}
	// Rank-down events: deletions of rank keys (revoked or expired leases), from now on.
	now, err := e.read(dctx, e.ns+"world")
	if err != nil {
		stop()
		return fmt.Errorf("%w: etcd: %w", ErrIO, err)
	}
	e.wg.Add(2)
	go func() { // owned by e: Close cancels bg and waits
		defer e.wg.Done()
		for ka != nil {
			for range ka { // drain keep-alive answers; the channel closes when bg ends or the lease is lost
			}
			ka = e.revive(bg, ttl)
		}
	}()
	go e.watchRanks(bg, now.Header.Revision+1) // owned by e
	if err := e.setWorld(dctx); err != nil {
		return err
	}
	switch e.cfg.Ranking {
	case Explicit:
		if err := e.claimRank(dctx, e.cfg.Rank); err != nil {
			return err
		}
	case Auto:
		if _, err := e.AssignRank(dctx); err != nil {
			return err
		}
	}
	return nil
}

// revive replaces a lost lease (this client was cut off from etcd for longer than its TTL, so
// the others were told its rank is down): it takes a new lease and its rank again, as
// upstream's clients republish theirs after losing the store, and returns the new lease's
// keep-alive channel; nil once bg ends. A rank taken by someone else meanwhile stays theirs.
func (e *etcdClient) revive(bg context.Context, ttl int64) <-chan *clientv3.LeaseKeepAliveResponse {
	if bg.Err() != nil {
		return nil
	}
	rank := e.Rank()
	e.cfg.Logger.Warn("store: etcd lease lost; taking a new lease and the rank again", "rank", rank)
	wait := redialMin
	for tries := 1; ; tries++ {
		select {
		case <-bg.Done():
			return nil
		case <-time.After(wait):
		}
		wait = min(2*wait, redialMax)
		ctx, cancel := context.WithTimeout(bg, attemptTimeout)
		lease, err := e.cli.Grant(ctx, ttl)
		cancel()
		if err != nil {
			continue
		}
		e.lease.Store(int64(lease.ID))
		if rank != NoRank {
			ctx, cancel := context.WithTimeout(bg, attemptTimeout)
			ok, err := e.tryRank(ctx, rank)
			cancel()
			if err != nil {
				continue // the lease expires by itself
			}
			if !ok {
				e.cfg.Logger.Error("store: this client's rank was taken while it was cut off; it has none now", "rank", rank)
				e.mu.Lock()
				e.rank, e.taken = NoRank, rank
				e.mu.Unlock()
			}
		}
		ka, err := e.cli.KeepAlive(bg, lease.ID)
		if err != nil {
			continue
		}
		e.cfg.Logger.Info("store: etcd lease and rank back", "rank", e.Rank(), "tries", tries)
		return ka
	}
}

// watchRanks posts every deletion of a rank key from revision rev on, watching again (from
// where it left off) whenever etcd ends the watch: a member cut off from the leader, a
// compaction.
func (e *etcdClient) watchRanks(bg context.Context, rev int64) {
	defer e.wg.Done()
	for bg.Err() == nil {
		wch := e.cli.Watch(clientv3.WithRequireLeader(bg), e.ns+"rank/", clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithRev(rev))
		for wr := range wch {
			if wr.CompactRevision > rev {
				rev = wr.CompactRevision // the events before it are gone
			}
			for _, ev := range wr.Events {
				r, err := strconv.Atoi(strings.TrimPrefix(string(ev.Kv.Key), e.ns+"rank/"))
				if err == nil {
					e.watch.post(r)
				}
				rev = ev.Kv.ModRevision + 1
			}
		}
		select {
		case <-bg.Done():
		case <-time.After(redialMin):
		}
	}
}

func (e *etcdClient) setWorld(ctx context.Context) error {
	want := []byte(strconv.Itoa(e.cfg.WorldSize))
	var cur []byte
	err := e.retry(ctx, func(actx context.Context) error {
		var ops []clientv3.Op
		if e.cfg.WorldSize > 0 {
			ops = append(ops, clientv3.OpPut(e.ns+"world", string(want)))
		}
		r, err := e.cli.Txn(actx).If(clientv3.Compare(clientv3.CreateRevision(e.ns+"world"), "=", 0)).
			Then(ops...).Else(clientv3.OpGet(e.ns + "world")).Commit()
		if err != nil {
			return err
		}
		cur = nil
		if !r.Succeeded {
			if kvs := r.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
				cur = kvs[0].Value
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%w: etcd: %w", ErrIO, err)
	}
	if cur == nil {
		e.world = e.cfg.WorldSize
		return nil
	}
	n, _ := strconv.Atoi(string(cur))
	if e.cfg.WorldSize > 0 && n != e.cfg.WorldSize {
		return fmt.Errorf("%w: world size %d, the store's is %d", ErrFailed, e.cfg.WorldSize, n)
	}
	e.world = n
	return nil
}

func (e *etcdClient) rankKey(r int) string { return fmt.Sprintf("%srank/%04d", e.ns, r) }

// claimRank takes rank r under this client's lease; true when it is ours.
func (e *etcdClient) tryRank(ctx context.Context, r int) (bool, error) {
	k := e.rankKey(r)
	var owner string
	err := e.retry(ctx, func(actx context.Context) error {
		resp, err := e.cli.Txn(actx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
			Then(clientv3.OpPut(k, e.id, clientv3.WithLease(clientv3.LeaseID(e.lease.Load())))).Else(clientv3.OpGet(k)).Commit()
		if err != nil {
			return err
		}
		owner = e.id
		if !resp.Succeeded {
			owner = ""
			if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
				owner = string(kvs[0].Value)
			}
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("%w: etcd: %w", ErrIO, err)
	}
	if owner != e.id { // a retried attempt that had committed shows our id: ours as well
		return false, nil
	}
	e.mu.Lock()
	e.rank = r
	e.mu.Unlock()
	return true, nil
}

func (e *etcdClient) claimRank(ctx context.Context, r int) error {
	if e.world > 0 && r >= e.world {
		return fmt.Errorf("%w: rank %d outside world of %d", ErrFailed, r, e.world)
	}
	ok, err := e.tryRank(ctx, r)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w: rank %d "+rankHeldReason, ErrRankHeld, r)
	}
	return nil
}

func (e *etcdClient) AssignRank(ctx context.Context) (int, error) {
	if r := e.Rank(); r != NoRank {
		return r, nil
	}
	w := e.WorldSize()
	if w == 0 {
		return NoRank, fmt.Errorf("%w: the store has no world size for automatic ranks", ErrFailed)
	}
	for r := 0; r < w; r++ {
		ok, err := e.tryRank(ctx, r)
		if err != nil {
			return NoRank, err
		}
		if ok {
			return r, nil
		}
	}
	return NoRank, fmt.Errorf("%w: all %d ranks are taken", ErrFailed, w)
}

// retry runs fn with a per-attempt timeout until it succeeds, fails for good, or ctx ends.
func (e *etcdClient) retry(ctx context.Context, fn func(context.Context) error) error {
	backoff := 20 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		err := fn(actx)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctxErr(ctx.Err())
		}
		if !transient(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctxErr(ctx.Err())
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// transient says whether an etcd error may go away (no leader, member down, timeouts).
func transient(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return true // the attempt's own timeout; the caller's context is checked first
	}
	switch grpcstatus.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.Unknown, codes.Canceled, codes.ResourceExhausted:
		return true
	}
	return false
}

func (e *etcdClient) k(key string) string { return e.ns + "kv/" + key }

// read is a linearizable Get of the etcd key k (a full key, e.k(...) for user keys), retried
// through transient failures.
func (e *etcdClient) read(ctx context.Context, k string, opts ...clientv3.OpOption) (resp *clientv3.GetResponse, err error) {
	err = e.retry(ctx, func(actx context.Context) (err error) {
		resp, err = e.cli.Get(actx, k, opts...)
		return err
	})
	return resp, err
}

func (e *etcdClient) Set(ctx context.Context, key string, value []byte) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if err := checkValue(value); err != nil {
		return err
	}
	return e.wrap("Set", key, e.retry(ctx, func(actx context.Context) error {
		_, err := e.cli.Put(actx, e.k(key), string(value))
		return err
	}))
}

func (e *etcdClient) wrap(op, key string, err error) error {
	if err == nil || CodeOf(err) != CodeError || errors.Is(err, ErrFailed) {
		return err
	}
	return fmt.Errorf("%w: %s %q: %w", ErrIO, op, key, err)
}

func (e *etcdClient) Get(ctx context.Context, key string, wait time.Duration) ([]byte, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	if wait == 0 {
		resp, err := e.read(ctx, e.k(key))
		if err != nil {
			return nil, e.wrap("Get", key, err)
		}
		if len(resp.Kvs) > 0 {
			return append([]byte{}, resp.Kvs[0].Value...), nil
		}
		return nil, fmt.Errorf("%w: Get %q", ErrNotExist, key)
	}
	if wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, wait)
		defer cancel()
	}
	for { // the read after the watch is in place finds a key that exists already
		if v, ok, err := e.waitCreated(ctx, key); ok || err != nil {
			return v, err
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("Get %q: %w", key, ctxErr(ctx.Err()))
		}
	}
}

// waitCreated watches key from now on and returns its value once it exists. The watch starts
// at the current revision (a watch from an older revision is served by etcd's unsynced-watcher
// loop, every 100 ms); a read after the watch is in place catches a creation in between.
// ok false with no error: the watch broke, read again.
func (e *etcdClient) waitCreated(ctx context.Context, key string) ([]byte, bool, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := e.cli.Watch(wctx, e.k(key), clientv3.WithCreatedNotify(), clientv3.WithFilterDelete())
	first := true
	for wr := range wch {
		if wr.Err() != nil {
			return nil, false, nil
		}
		if first && wr.Created {
			first = false
			resp, err := e.read(ctx, e.k(key))
			if err != nil {
				return nil, false, e.wrap("Get", key, err)
			}
			if len(resp.Kvs) > 0 {
				return append([]byte{}, resp.Kvs[0].Value...), true, nil
			}
			continue
		}
		for _, ev := range wr.Events {
			return append([]byte{}, ev.Kv.Value...), true, nil
		}
	}
	return nil, false, nil
}

// update runs an exactly-once read-modify-write of key: fn sees the current value (nil, false
// when absent) and returns the new value (del: remove the key; write false: no write), plus
// the result to hand back. See the type comment for the tokens.
func (e *etcdClient) update(ctx context.Context, op, key string, fn func(old []byte, exists bool) (nv []byte, write, del bool, res any, err error)) (any, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	k := e.k(key)
	unsure := map[string]any{} // tokens of attempts whose fate is unknown → their result
	backoff := 20 * time.Millisecond
	for conflicts := 0; ; {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("%s %q: %w", op, key, ctxErr(err))
		}
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		res, done, err := e.attempt(actx, k, unsure, fn)
		cancel()
		if done || (err != nil && !transient(err)) {
			return res, e.wrap(op, key, err)
		}
		var pause time.Duration
		switch {
		case err != nil:
			pause = backoff
			backoff = min(2*backoff, 500*time.Millisecond)
		case conflicts > 0: // lost a race again: spread the contenders out
			pause = time.Duration(mrand.Int64N(int64(min(conflicts, 16)) * int64(time.Millisecond)))
			conflicts++
		default:
			conflicts++
		}
		if pause > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(pause):
			}
		}
	}
}

func (e *etcdClient) attempt(ctx context.Context, k string, unsure map[string]any, fn func([]byte, bool) ([]byte, bool, bool, any, error)) (any, bool, error) {
	ops := []clientv3.Op{clientv3.OpGet(k)}
	toks := make([]string, 0, len(unsure))
	for t := range unsure {
		toks = append(toks, t)
		ops = append(ops, clientv3.OpGet(t, clientv3.WithCountOnly()))
	}
	r, err := e.cli.Txn(ctx).Then(ops...).Commit() // one linearizable read of the key and tokens
	if err != nil {
		return nil, false, err
	}
	for i, t := range toks {
		if r.Responses[1+i].GetResponseRange().Count > 0 {
			e.confirm(t)
			return unsure[t], true, nil
		}
	}
	var old []byte
	var rev int64
	if kvs := r.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		old, rev = kvs[0].Value, kvs[0].ModRevision
	}
	nv, write, del, res, err := fn(old, rev != 0)
	if err != nil || !write {
		return res, true, err
	}
	tok := fmt.Sprintf("%stok/%s/%d", e.ns, e.id, e.seq.Add(1))
	then := []clientv3.Op{clientv3.OpPut(tok, "")}
	if del {
		then = append(then, clientv3.OpDelete(k))
	} else {
		then = append(then, clientv3.OpPut(k, string(nv)))
	}
	e.mu.Lock()
	n := min(len(e.confirmed), 32)
	stale := append([]string(nil), e.confirmed[:n]...) // taken; given back if the write fails
	e.confirmed = e.confirmed[n:]
	e.mu.Unlock()
	for _, t := range stale {
		then = append(then, clientv3.OpDelete(t))
	}
	cmp := clientv3.Compare(clientv3.ModRevision(k), "=", rev)
	if rev == 0 {
		cmp = clientv3.Compare(clientv3.CreateRevision(k), "=", 0)
	}
	tr, err := e.cli.Txn(ctx).If(cmp).Then(then...).Commit()
	if err != nil || !tr.Succeeded {
		e.mu.Lock()
		e.confirmed = append(e.confirmed, stale...)
		e.mu.Unlock()
	}
	if err != nil {
		unsure[tok] = res
		return nil, false, err
	}
	if !tr.Succeeded {
		return nil, false, nil // raced with another writer: read again
	}
	e.confirm(tok)
	return res, true, nil
}

func (e *etcdClient) confirm(tok string) {
	e.mu.Lock()
	e.confirmed = append(e.confirmed, tok)
	e.mu.Unlock()
}

func (e *etcdClient) Add(ctx context.Context, key string, delta int64) (int64, error) {
	res, err := e.update(ctx, "Add", key, func(old []byte, exists bool) ([]byte, bool, bool, any, error) {
		var cur int64
		if exists {
			var err error
			if cur, err = strconv.ParseInt(string(old), 10, 64); err != nil {
				return nil, false, false, nil, fmt.Errorf("%w: Add on %q, not a decimal integer", ErrFailed, old)
			}
			if delta == 0 {
				return nil, false, false, cur, nil
			}
		}
		return []byte(strconv.FormatInt(cur+delta, 10)), true, false, cur + delta, nil
	})
	if err != nil {
		return 0, err
	}
	return res.(int64), nil
}

func (e *etcdClient) Append(ctx context.Context, key string, value []byte) (int64, error) {
	if err := checkValue(value); err != nil {
		return 0, err
	}
	res, err := e.update(ctx, "Append", key, func(old []byte, exists bool) ([]byte, bool, bool, any, error) {
		if len(old)+len(value) > MaxValueLen {
			return nil, false, false, nil, fmt.Errorf("%w: Append past %d bytes", ErrInvalidMessage, MaxValueLen)
		}
		nv := append(append([]byte{}, old...), value...)
		return nv, true, false, int64(len(nv)), nil
	})
	if err != nil {
		return 0, err
	}
	return res.(int64), nil
}

func (e *etcdClient) CompareAndSwap(ctx context.Context, key string, expected, value []byte) ([]byte, error) {
	if err := checkValue(value); err != nil {
		return nil, err
	}
	res, err := e.update(ctx, "CompareAndSwap", key, func(old []byte, exists bool) ([]byte, bool, bool, any, error) {
		var prev []byte
		if exists {
			prev = append([]byte{}, old...)
		}
		swap := (exists && string(old) == string(expected)) || (!exists && len(expected) == 0)
		return value, swap, false, prev, nil
	})
	if err != nil {
		return nil, err
	}
	return res.([]byte), nil
}

func (e *etcdClient) Write(ctx context.Context, key string, offset uint32, value []byte) error {
	if uint64(offset)+uint64(len(value)) > MaxValueLen {
		return fmt.Errorf("%w: Write at %d of %d bytes past %d", ErrInvalidMessage, offset, len(value), MaxValueLen)
	}
	_, err := e.update(ctx, "Write", key, func(old []byte, exists bool) ([]byte, bool, bool, any, error) {
		nv := make([]byte, max(len(old), int(offset)+len(value)))
		copy(nv, old)
		copy(nv[offset:], value)
		return nv, true, false, nil, nil
	})
	return err
}

func (e *etcdClient) Remove(ctx context.Context, key string) error {
	_, err := e.update(ctx, "Remove", key, func(old []byte, exists bool) ([]byte, bool, bool, any, error) {
		if !exists {
			return nil, false, false, nil, fmt.Errorf("%w: Remove %q", ErrNotExist, key)
		}
		return nil, true, true, nil, nil
	})
	return err
}

func (e *etcdClient) Rank() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.rank
}

func (e *etcdClient) WorldSize() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.world
}

func (e *etcdClient) WatchRankDown(fn func(rank int)) func() { return e.watch.add(fn) }

// RankLive implements Client: the rank's key exists (a lease holds it).
func (e *etcdClient) RankLive(ctx context.Context, r int) (bool, error) {
	resp, err := e.read(ctx, e.rankKey(r))
	if err != nil {
		return false, fmt.Errorf("%w: etcd: %w", ErrIO, err)
	}
	return len(resp.Kvs) == 1, nil
}

// Live implements Client: the rank's key holds this client's id. A process that was frozen or
// cut off learns that its lease expired only when etcd answers its next keep-alive; Live looks
// at the key itself and, finding it gone, revokes the dead lease so that the new one is taken
// at once (revive), then waits for the key to be ours again.
func (e *etcdClient) Live(ctx context.Context) error {
	revoked := false
	for {
		e.mu.Lock()
		rank, taken := e.rank, e.taken
		e.mu.Unlock()
		if taken != NoRank {
			return fmt.Errorf("%w: rank %d was taken by another client while this one was cut off", ErrFailed, taken)
		}
		key := e.ns + "world"
		if rank != NoRank {
			key = e.rankKey(rank)
		}
		resp, err := e.read(ctx, key)
		if err != nil {
			return fmt.Errorf("%w: etcd: %w", ErrIO, err)
		}
		if rank == NoRank || (len(resp.Kvs) == 1 && string(resp.Kvs[0].Value) == e.id) {
			return nil
		}
		if !revoked {
			revoked = true
			rctx, cancel := context.WithTimeout(ctx, attemptTimeout)
			_, _ = e.cli.Revoke(rctx, clientv3.LeaseID(e.lease.Load())) // best effort: it expired anyway
			cancel()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: etcd: rank %d not held again (%w)", ErrIO, rank, ctxErr(ctx.Err()))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Close revokes the lease (the rank is reported down at once), deletes this client's tokens
// and closes the etcd client.
func (e *etcdClient) Close() error {
	if e.closed.Swap(true) {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, _ = e.cli.Revoke(ctx, clientv3.LeaseID(e.lease.Load()))            // best effort: else the lease expires
	_, _ = e.cli.Delete(ctx, e.ns+"tok/"+e.id+"/", clientv3.WithPrefix()) // best effort: stray tokens are harmless
	e.cancel()
	e.dirs.stopAll()
	err := e.cli.Close()
	e.wg.Wait()
	e.watch.close()
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

var _ Client = (*etcdClient)(nil)

// Arrive implements Rendezvous: the participant's key is written in a transaction that also
// counts the meeting's keys, so the write with the highest revision sees all n, and its writer
// (perhaps others too) stores done. No key is written by two participants, so nothing is
// retried for contention (Add's counter costs every contender a retried transaction).
func (e *etcdClient) Arrive(ctx context.Context, prefix string, id, n int, value []byte, done string) error {
	if err := checkMeeting(prefix, id, n, value, done); err != nil {
		return err
	}
	p := e.k(prefix)
	var count int64
	err := e.retry(ctx, func(actx context.Context) error { // a put is idempotent: retry freely
		r, err := e.cli.Txn(actx).Then(
			clientv3.OpPut(e.k(participantKey(prefix, id)), string(value)),
			clientv3.OpGet(p, clientv3.WithPrefix(), clientv3.WithCountOnly()),
		).Commit()
		if err != nil {
			return err
		}
		count = r.Responses[1].GetResponseRange().Count
		return nil
	})
	if err != nil || count < int64(n) {
		return e.wrap("Arrive", prefix, err)
	}
	resp, err := e.read(ctx, p, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return e.wrap("Arrive", prefix, err)
	}
	var all []byte
	for i, kv := range resp.Kvs {
		if string(kv.Key) != e.k(participantKey(prefix, i)) || i >= n {
			return fmt.Errorf("%w: meeting %q of %d: unexpected key %q (another meeting under the prefix?)", ErrFailed, prefix, n, kv.Key)
		}
		all = append(all, kv.Value...)
	}
	if err := checkValue(all); err != nil {
		return err
	}
	return e.Set(ctx, done, all)
}

// Arrived implements Rendezvous.
func (e *etcdClient) Arrived(ctx context.Context, prefix string) ([]int, error) {
	if err := checkKey(prefix); err != nil {
		return nil, err
	}
	p := e.k(prefix)
	resp, err := e.read(ctx, p, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, e.wrap("Arrived", prefix, err)
	}
	ids := make([]int, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		if id, err := strconv.Atoi(strings.TrimPrefix(string(kv.Key), p)); err == nil {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// RemoveMeeting implements Rendezvous.
func (e *etcdClient) RemoveMeeting(ctx context.Context, prefix string) error {
	if err := checkKey(prefix); err != nil {
		return err
	}
	return e.wrap("RemoveMeeting", prefix, e.retry(ctx, func(actx context.Context) error {
		_, err := e.cli.Delete(actx, e.k(prefix), clientv3.WithPrefix())
		return err
	}))
}
