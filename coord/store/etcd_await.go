package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// maxDirWatches bounds the long-lived watches one client keeps for Await; the least recently
// used one goes when another is needed (a group keeps one per view; old views are idle).
const maxDirWatches = 16

// dirWatches are an etcd client's long-lived prefix watches, one per Await directory.
//
// Why not one watch per wait, as Get does: etcd 3.4 turns a watch "from now" into one from
// the revision it read on arrival, and a write landing before the watcher is installed makes
// it "unsynced" — served by a loop that runs every 100 ms. Under a burst of writes (every
// member of a 256-rank group arriving) a good share of per-call watches land there and wait
// 100 ms. A watch made once and kept is behind at most once.
type dirWatches struct {
	mu      sync.Mutex
	m       map[string]*dirWatch
	stopped bool
}

// dirWatch mirrors the keys under one directory.
type dirWatch struct {
	dir    string
	cancel context.CancelFunc
	done   chan struct{} // closed when the goroutine has returned

	mu      sync.Mutex
	vals    map[string][]byte // name → value of keys present
	ready   bool              // the first snapshot is in vals
	err     error             // set when the watch ended for good
	changed chan struct{}     // closed and replaced at every change of vals, ready or err
	used    time.Time
}

// Await implements Rendezvous: the value of dir+name once it exists, from a watch of dir kept
// for later calls. wait as Get's.
func (e *etcdClient) Await(ctx context.Context, dir, name string, wait time.Duration) ([]byte, error) {
	key := dir + name
	if err := checkKey(key); err != nil {
		return nil, err
	}
	if wait == 0 {
		return e.Get(ctx, key, 0)
	}
	if wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, wait)
		defer cancel()
	}
	w, err := e.dirWatch(dir)
	if err != nil {
		return nil, err
	}
	for {
		w.mu.Lock()
		w.used = time.Now()
		v, ok := w.vals[name]
		ready, werr, ch := w.ready, w.err, w.changed
		w.mu.Unlock()
		switch {
		case ok && ready:
			return append([]byte{}, v...), nil
		case werr != nil:
			if w, err = e.dirWatch(dir); err != nil { // evicted while we waited: watch again
				return nil, err
			}
			continue
		}
		select {
		case <-ch:
		case <-ctx.Done():
			if wait > 0 && errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil, fmt.Errorf("%w: Get %q: not created within %v", ErrTimeout, key, wait)
			}
			return nil, fmt.Errorf("Get %q: %w", key, ctxErr(ctx.Err()))
		}
	}
}

// dirWatch returns dir's watch, starting it if needed.
func (e *etcdClient) dirWatch(dir string) (*dirWatch, error) {
	d := &e.dirs
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped || e.bg.Err() != nil {
		return nil, fmt.Errorf("%w: store client closed", ErrIO)
	}
	if w, ok := d.m[dir]; ok {
		return w, nil
	}
	if d.m == nil {
		d.m = map[string]*dirWatch{}
	}
	if len(d.m) >= maxDirWatches {
		var old *dirWatch
		for _, w := range d.m {
			w.mu.Lock()
			if old == nil || w.used.Before(old.used) {
				old = w
			}
			w.mu.Unlock()
		}
		delete(d.m, old.dir)
		old.cancel()
	}
	ctx, cancel := context.WithCancel(e.bg)
	w := &dirWatch{dir: dir, cancel: cancel, done: make(chan struct{}), vals: map[string][]byte{},
		changed: make(chan struct{}), used: time.Now()}
	d.m[dir] = w
	e.wg.Add(1)
	go func() { // owned by e: Close cancels bg (and stopAll w) and waits
		defer e.wg.Done()
		defer close(w.done)
		e.mirror(ctx, w)
	}()
	return w, nil
}

// stopAll ends every directory watch (Close).
func (d *dirWatches) stopAll() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stopped = true
	for _, w := range d.m {
		w.cancel()
	}
	d.m = nil
}

// mirror keeps w.vals equal to the keys under w.dir until ctx ends: a watch from now, then a
// snapshot read (a key created before the watch was in place is in it); events at or below
// the snapshot's revision are already in it. When the watch breaks it resumes after the last
// revision seen, or from a fresh snapshot if that revision was compacted.
func (e *etcdClient) mirror(ctx context.Context, w *dirWatch) {
	p := e.k(w.dir)
	var next int64 // revision to resume from; 0: start afresh
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithCreatedNotify()}
		if next > 0 {
			opts = append(opts, clientv3.WithRev(next))
		}
		snap := next - 1
		for wr := range e.cli.Watch(wctx, p, opts...) {
			if err := wr.Err(); err != nil {
				if errors.Is(err, rpctypes.ErrCompacted) {
					next = 0
				}
				break
			}
			if wr.Created && next == 0 {
				resp, err := e.read(ctx, p, clientv3.WithPrefix())
				if err != nil {
					break
				}
				vals := make(map[string][]byte, len(resp.Kvs))
				for _, kv := range resp.Kvs {
					vals[strings.TrimPrefix(string(kv.Key), p)] = kv.Value
				}
				snap, next = resp.Header.Revision, resp.Header.Revision+1
				w.update(func() { w.vals, w.ready = vals, true })
				continue
			}
			w.update(func() {
				for _, ev := range wr.Events {
					if ev.Kv.ModRevision <= snap {
						continue
					}
					name := strings.TrimPrefix(string(ev.Kv.Key), p)
					if ev.Type == mvccpb.DELETE {
						delete(w.vals, name)
					} else {
						w.vals[name] = ev.Kv.Value
					}
					next = ev.Kv.ModRevision + 1
				}
			})
		}
		cancel()
		if ctx.Err() == nil {
			select { // a broken watch (no leader, member down): try again shortly
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	w.update(func() { w.err = fmt.Errorf("%w: store watch of %q ended", ErrIO, w.dir) })
}

// update changes w under its lock and wakes its waiters.
func (w *dirWatch) update(fn func()) {
	w.mu.Lock()
	fn()
	close(w.changed)
	w.changed = make(chan struct{})
	w.mu.Unlock()
}
