package kv

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hmc-go/hmc/fabric/trans"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
)

// Span is Size bytes of this process's memory at Addr: host memory, or device memory (the
// transfer engine stages it and memory.Copy reaches it).
type Span struct{ Addr, Size uint64 }

// SpanOf is b's memory. The caller keeps b alive until the call given the span returns.
func SpanOf(b []byte) Span { return Span{Addr: memory.AddrOf(b), Size: uint64(len(b))} }

// Item is one object of a batch: its key and, in order, the local memory its bytes come from
// (puts: the object is the parts' concatenation) or go to (gets: the parts are filled in order
// and may be longer than the object).
type Item struct {
	Key   string
	Parts []Span
}

// size is the parts' total length; a part without an address is refused.
func (it Item) size() (uint64, error) {
	var n uint64
	for k, p := range it.Parts {
		if p.Size == 0 {
			continue
		}
		if p.Addr == 0 || p.Addr+p.Size < p.Addr {
			return 0, fail(InvalidParams, "%q: part %d is %d bytes at %#x", it.Key, k, p.Size, p.Addr)
		}
		if n+p.Size < n {
			return 0, fail(InvalidParams, "%q: its parts overflow 64 bits", it.Key)
		}
		n += p.Size
	}
	return n, nil
}

// pieces maps the first size bytes of an object at remote onto parts, in order.
func pieces(op trans.Opcode, parts []Span, remote, size uint64) []trans.Request {
	var reqs []trans.Request
	var off uint64
	for _, p := range parts {
		if off == size {
			break
		}
		n := min(p.Size, size-off)
		if n == 0 {
			continue
		}
		reqs = append(reqs, trans.Request{Op: op, Local: p.Addr, Remote: remote + off, Size: n})
		off += n
	}
	return reqs
}

// PutOptions are a put's settings.
type PutOptions struct {
	// Replicas is how many copies the pool keeps, each in another segment (at least 1).
	Replicas int
	// Upsert writes keys that exist too (Master.UpsertStart) instead of refusing them.
	Upsert bool
}

// BatchPut stores every item (a put of each, Put's rules) with one call to the master to place
// them, one transfer batch per peer holding replicas (all peers at once), and one call to make
// them visible. The result has each item's error, nil for those stored.
func (c *Client) BatchPut(ctx context.Context, items []Item, opt PutOptions) []error {
	errs := make([]error, len(items))
	c.segMu.Lock()
	q := call{Replicas: max(opt.Replicas, 1), Prefer: c.segment, Upsert: opt.Upsert}
	c.segMu.Unlock()
	var idx []int // q.Keys[j] is items[idx[j]]
	for i, it := range items {
		n, err := it.size()
		if err == nil && n == 0 {
			err = fail(InvalidParams, "put of %q: an empty value", it.Key)
		}
		if err != nil {
			errs[i] = err
			continue
		}
		q.Keys, q.Sizes, idx = append(q.Keys, it.Key), append(q.Sizes, n), append(idx, i)
	}
	if len(idx) == 0 {
		return errs
	}
	r, err := c.batchCall(ctx, "batch_put_start", q)
	if err != nil {
		for _, i := range idx {
			errs[i] = err
		}
		return errs
	}
	var t transfers
	var local []func() error
	var local2item []int
	var started []int // positions in q.Keys of the puts the master started
	for j, i := range idx {
		ri := r.Items[j]
		if errs[i] = ri.err(); errs[i] != nil {
			continue
		}
		started = append(started, j)
		for _, b := range ri.Buffers {
			if b.Size != q.Sizes[j] {
				errs[i] = fmt.Errorf("put of %q: a replica of %d bytes for %d: %w", q.Keys[j], b.Size, q.Sizes[j], status.ErrProtocol)
				break
			}
			reqs := pieces(trans.Write, items[i].Parts, b.Addr, b.Size)
			if b.Client != c.id {
				t.add(b.Client, i, reqs)
				continue
			}
			if err := c.own(b); err != nil {
				errs[i] = err
				break
			}
			local = append(local, func() error { return copyLocal(reqs) })
			local2item = append(local2item, i)
		}
	}
	for i, err := range c.run(ctx, &t, local, local2item) {
		if errs[i] == nil {
			errs[i] = err
		}
	}
	var end, revoke call
	var endIdx []int
	for _, j := range started {
		i := idx[j]
		if errs[i] == nil {
			end.Keys, endIdx = append(end.Keys, q.Keys[j]), append(endIdx, i)
			continue
		}
		revoke.Keys = append(revoke.Keys, q.Keys[j])
		if CodeOf(errs[i]) == InternalError {
			errs[i] = &Error{Code: TransferFail, Msg: fmt.Sprintf("put of %q: %v", q.Keys[j], errs[i])}
		}
	}
	if len(revoke.Keys) > 0 { // their space back; those puts failed either way
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.Timeout)
		_, _ = c.batchCall(rctx, "batch_put_revoke", revoke)
		cancel()
	}
	if len(end.Keys) > 0 {
		r, err := c.batchCall(ctx, "batch_put_end", end)
		for j, i := range endIdx {
			if errs[i] = err; err == nil {
				errs[i] = r.Items[j].err()
			}
		}
	}
	return errs
}

// BatchGet reads every item's object into its parts and returns each object's size and error
// (InvalidParams when the parts are shorter than the object, as Mooncake's get_into). A read
// takes the replica in this client's own segment if there is one, else the others in turn,
// every item's read to a peer in one batch per peer (all peers at once); an object's bytes
// count only if the read ended within the lease the master granted (else LeaseExpired: the
// space may have been reused since, and the bytes are not trusted). Sizes of failed items are 0.
func (c *Client) BatchGet(ctx context.Context, items []Item) ([]uint64, []error) {
	return c.batchGet(ctx, items, nil)
}

// GetWith reads key's object into the memory alloc gives for its size, with one call to the
// master (Get without knowing the size first), and returns the size.
func (c *Client) GetWith(ctx context.Context, key string, alloc func(size uint64) (Span, error)) (uint64, error) {
	var aerr error
	items := []Item{{Key: key}}
	sizes, errs := c.batchGet(ctx, items, func(i int, n uint64) []Span {
		sp, err := alloc(n)
		if err != nil {
			aerr = err
			return nil
		}
		return []Span{sp}
	})
	return sizes[0], errors.Join(errs[0], aerr)
}

// batchGet is BatchGet; alloc, when set, gives the parts of items that have none once the
// master has said how large their objects are.
func (c *Client) batchGet(ctx context.Context, items []Item, alloc func(i int, size uint64) []Span) ([]uint64, []error) {
	sizes, errs := make([]uint64, len(items)), make([]error, len(items))
	var q call
	var idx []int
	caps := make([]uint64, len(items))
	for i, it := range items {
		n, err := it.size()
		if err != nil {
			errs[i] = err
			continue
		}
		caps[i] = n
		q.Keys, idx = append(q.Keys, it.Key), append(idx, i)
	}
	if len(idx) == 0 {
		return sizes, errs
	}
	r, asked, err := c.batchCallAt(ctx, "batch_get", q) // a lease counts from the answer: from asked is on the safe side
	if err != nil {
		for _, i := range idx {
			errs[i] = err
		}
		return sizes, errs
	}
	type read struct {
		i      int
		order  []Buffer // replicas still to try
		tried  []error
		leased time.Time
	}
	var todo []*read
	for j, i := range idx {
		ri := r.Items[j]
		if alloc != nil && len(items[i].Parts) == 0 && ri.Code == OK && len(ri.Buffers) > 0 {
			items[i].Parts = alloc(i, ri.Buffers[0].Size)
			if caps[i], err = items[i].size(); err != nil {
				errs[i] = err
				continue
			}
		}
		switch {
		case ri.Code != OK:
			errs[i] = ri.err()
		case len(ri.Buffers) == 0:
			errs[i] = fail(ObjectNotFound, "%q has no replica", q.Keys[j])
		case caps[i] < ri.Buffers[0].Size:
			errs[i] = fail(InvalidParams, "%q is %d bytes, the buffer %d", q.Keys[j], ri.Buffers[0].Size, caps[i])
		default:
			sizes[i] = ri.Buffers[0].Size
			todo = append(todo, &read{i: i, order: ordered(ri.Buffers, c.id), leased: asked.Add(ri.Lease)})
		}
	}
	var done []*read
	for len(todo) > 0 {
		var t transfers
		var local []func() error
		var local2item []int
		byItem := map[int]*read{}
		for _, rd := range todo {
			b := rd.order[0]
			rd.order = rd.order[1:]
			byItem[rd.i] = rd
			reqs := pieces(trans.Read, items[rd.i].Parts, b.Addr, sizes[rd.i])
			if b.Client != c.id {
				t.add(b.Client, rd.i, reqs)
				continue
			}
			if err := c.own(b); err != nil {
				rd.tried = append(rd.tried, err)
				local = append(local, func() error { return err })
			} else {
				local = append(local, func() error { return copyLocal(reqs) })
			}
			local2item = append(local2item, rd.i)
		}
		failed := c.run(ctx, &t, local, local2item)
		var next []*read
		for _, rd := range todo {
			err, bad := failed[rd.i]
			switch {
			case !bad:
				done = append(done, rd)
			case len(rd.order) > 0 && ctx.Err() == nil:
				rd.tried = append(rd.tried, err)
				next = append(next, rd)
			default:
				rd.tried = append(rd.tried, err)
				errs[rd.i] = &Error{Code: TransferFail, Msg: fmt.Sprintf("get of %q: %v", items[rd.i].Key, errors.Join(rd.tried...))}
				sizes[rd.i] = 0
			}
		}
		todo = next
	}
	now := time.Now()
	for _, rd := range done {
		if now.After(rd.leased) {
			errs[rd.i] = fail(LeaseExpired, "get of %q: the read ended after the lease (%v)", items[rd.i].Key, rd.leased)
			sizes[rd.i] = 0
		}
	}
	return sizes, errs
}

// BatchExist says for each key whether it names a complete object.
func (c *Client) BatchExist(ctx context.Context, keys []string) ([]bool, error) {
	r, err := c.batchCall(ctx, "batch_exist", call{Keys: keys})
	if err != nil {
		return nil, err
	}
	yes := make([]bool, len(keys))
	for i, it := range r.Items {
		yes[i] = it.Yes
	}
	return yes, nil
}

// BatchRemove removes every key (Remove's rules) and returns each one's error.
func (c *Client) BatchRemove(ctx context.Context, keys []string, force bool) []error {
	errs := make([]error, len(keys))
	r, err := c.batchCall(ctx, "batch_remove", call{Keys: keys, Force: force})
	for i := range keys {
		if errs[i] = err; err == nil {
			errs[i] = r.Items[i].err()
		}
	}
	return errs
}

// batchCall is call for a batch method: the reply has one item per key.
func (c *Client) batchCall(ctx context.Context, method string, q call) (reply, error) {
	r, _, err := c.batchCallAt(ctx, method, q)
	return r, err
}

// batchCallAt is batchCall and callAt's send time.
func (c *Client) batchCallAt(ctx context.Context, method string, q call) (reply, time.Time, error) {
	if len(q.Keys) > maxBatch {
		return reply{}, time.Now(), fail(InvalidParams, "%s of %d keys (at most %d)", method, len(q.Keys), maxBatch)
	}
	r, sent, err := c.callAt(ctx, method, q)
	if err == nil && len(r.Items) != len(q.Keys) {
		err = &Error{Code: RPCFail, Msg: fmt.Sprintf("%s: %d answers for %d keys", method, len(r.Items), len(q.Keys))}
	}
	return r, sent, err
}

// copyLocal runs requests whose remote side is this client's own segment as copies.
func copyLocal(reqs []trans.Request) error {
	for _, q := range reqs {
		dst, src := q.Remote, q.Local
		if q.Op == trans.Read {
			dst, src = q.Local, q.Remote
		}
		if err := memory.Copy(memory.Ptr(dst), memory.Ptr(src), q.Size); err != nil {
			return err
		}
	}
	return nil
}

// transfers are one round's requests to each peer and the items they belong to.
type transfers struct {
	peers []string
	by    map[string]*peerBatch
}

type peerBatch struct {
	reqs  []trans.Request
	items []int
}

func (t *transfers) add(peer string, item int, reqs []trans.Request) {
	if t.by == nil {
		t.by = map[string]*peerBatch{}
	}
	pb, ok := t.by[peer]
	if !ok {
		pb = &peerBatch{}
		t.by[peer], t.peers = pb, append(t.peers, peer)
	}
	pb.reqs = append(pb.reqs, reqs...)
	if n := len(pb.items); n == 0 || pb.items[n-1] != item {
		pb.items = append(pb.items, item)
	}
}

// run moves every peer's requests (one batch per peer, all at once) while it runs the local
// copies (local[k] belongs to item local2item[k]), and returns the error of each item a failed
// batch or copy touched.
func (c *Client) run(ctx context.Context, t *transfers, local []func() error, local2item []int) map[int]error {
	failed := map[int]error{}
	mark := func(items []int, err error) {
		for _, i := range items {
			failed[i] = errors.Join(failed[i], err)
		}
	}
	if len(t.peers) == 1 && len(local) == 0 { // the common case: the caller's goroutine waits
		p := t.peers[0]
		if err := c.e.Transfer(ctx, p, t.by[p].reqs, nil); err != nil {
			mark(t.by[p].items, fmt.Errorf("replicas at %s: %w", p, err))
		}
		return failed
	}
	batches := make([]*trans.Batch, len(t.peers))
	for k, p := range t.peers {
		b, err := c.e.Submit(ctx, p, t.by[p].reqs, nil)
		if err != nil {
			mark(t.by[p].items, fmt.Errorf("replicas at %s: %w", p, err))
			continue
		}
		batches[k] = b
	}
	for k, f := range local {
		if err := f(); err != nil {
			mark([]int{local2item[k]}, err)
		}
	}
	for k, b := range batches {
		if b == nil {
			continue
		}
		if err := b.Wait(ctx); err != nil {
			p := t.peers[k]
			mark(t.by[p].items, fmt.Errorf("replicas at %s: %w", p, err))
		}
	}
	return failed
}

// own checks that a replica buffer the master named as this client's lies in one of its
// segments.
func (c *Client) own(b Buffer) error {
	c.segMu.Lock()
	l, ok := c.segs[b.Segment]
	c.segMu.Unlock()
	if !ok || b.Addr < l.base || b.Addr+b.Size < b.Addr || b.Addr+b.Size > l.base+l.size {
		return fmt.Errorf("replica [%#x, +%d) is not in this client's segment: %w", b.Addr, b.Size, status.ErrProtocol)
	}
	return nil
}

// ordered puts the replica in client self's segment first.
func ordered(bufs []Buffer, self string) []Buffer {
	out := make([]Buffer, 0, len(bufs))
	for _, b := range bufs {
		if b.Client == self {
			out = append(out, b)
		}
	}
	for _, b := range bufs {
		if b.Client != self {
			out = append(out, b)
		}
	}
	return out
}

// RegisterBuffer records size bytes at addr as a buffer the caller will put from and get into
// (Mooncake's register_buffer). Puts and gets reach any memory of this process without it:
// registration checks the range once, and the same range registered again is accepted, an
// overlapping other one refused.
func (c *Client) RegisterBuffer(addr, size uint64) error {
	if addr == 0 || size == 0 || addr+size < addr {
		return fail(InvalidParams, "register_buffer of %d bytes at %#x", size, addr)
	}
	if _, err := memory.LocateRange(memory.Ptr(addr), size); err != nil {
		return fail(InvalidParams, "register_buffer of %d bytes at %#x: %v", size, addr, err)
	}
	c.bufMu.Lock()
	defer c.bufMu.Unlock()
	if n, ok := c.bufs[addr]; ok && n == size {
		return nil
	}
	for a, n := range c.bufs {
		if addr < a+n && a < addr+size {
			return fail(InvalidParams, "register_buffer of %d bytes at %#x overlaps the %d bytes at %#x registered", size, addr, n, a)
		}
	}
	if c.bufs == nil {
		c.bufs = map[uint64]uint64{}
	}
	c.bufs[addr] = size
	return nil
}

// UnregisterBuffer forgets a buffer RegisterBuffer recorded at addr.
func (c *Client) UnregisterBuffer(addr uint64) error {
	c.bufMu.Lock()
	defer c.bufMu.Unlock()
	if _, ok := c.bufs[addr]; !ok {
		return fail(InvalidParams, "unregister_buffer of %#x: no buffer registered there", addr)
	}
	delete(c.bufs, addr)
	return nil
}
