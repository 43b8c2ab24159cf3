package group

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/status"
)

// collective runs the rounds of one member set under one key prefix.
type collective struct {
	g       *Group
	prefix  string
	members []int

	rv store.Rendezvous // the store's, if it has one: rounds meet on own keys

	mu    sync.Mutex // serialises rounds of this collective (callers must not interleave)
	round int64
	kinds map[int64]string // round → "b" or "g", for cleanup of round n-2
}

func (g *Group) newCollective(prefix string, members []int) *collective {
	rv, _ := store.AsRendezvous(g.st)
	return &collective{g: g, prefix: prefix, members: slices.Clone(members), rv: rv, kinds: map[int64]string{}}
}

func (g *Group) current() *collective {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.coll
}

// Barrier returns when every member of the current view has called Barrier (the same round).
func (g *Group) Barrier(ctx context.Context) error {
	return g.current().barrier(ctx)
}

// AllGather contributes data and returns every member's contribution, in rank order (index i
// is Members[i] of the view). Contributions may differ in length.
func (g *Group) AllGather(ctx context.Context, data []byte) ([][]byte, error) {
	return g.current().allGather(ctx, data)
}

// Sub returns the sub-group key of the given members (store ranks, this rank among them):
// barriers and allgathers among them only, with their own rounds (upstream's keyed
// sub-group collectives). Every member must use the same key and members.
func (g *Group) Sub(key string, members []int) (*SubGroup, error) {
	m := slices.Clone(members)
	slices.Sort(m)
	m = slices.Compact(m)
	if key == "" || len(key) >= 64 {
		return nil, fmt.Errorf("%w: sub-group key %q (1..63 bytes)", status.ErrInvalidConfig, key)
	}
	if len(m) == 0 || !slices.Contains(m, g.rank) {
		return nil, fmt.Errorf("%w: sub-group %q: rank %d not among %v", status.ErrInvalidConfig, key, g.rank, members)
	}
	return &SubGroup{c: g.newCollective("s/"+key+"/", m)}, nil
}

// SubGroup is a keyed sub-group of a Group.
type SubGroup struct{ c *collective }

// Members returns the sub-group's ranks, sorted.
func (s *SubGroup) Members() []int { return slices.Clone(s.c.members) }

// Barrier is Group.Barrier among the sub-group.
func (s *SubGroup) Barrier(ctx context.Context) error { return s.c.barrier(ctx) }

// AllGather is Group.AllGather among the sub-group.
func (s *SubGroup) AllGather(ctx context.Context, data []byte) ([][]byte, error) {
	return s.c.allGather(ctx, data)
}

// begin starts round n: checks membership and known-dead members and registers the wait. It
// returns the deadline context for store operations, and wctx, which also ends when a member
// dies, for the wait on the round's completion key.
func (c *collective) begin(ctx context.Context, op, kind string) (dctx, wctx context.Context, done func(), key string, err error) {
	g := c.g
	if !slices.Contains(c.members, g.rank) {
		return nil, nil, nil, "", fmt.Errorf("%s: %w (view %v)", op, ErrNotMember, c.members)
	}
	dctx, cancelDeadline := g.deadline(ctx)
	wctx, cancel := context.WithCancelCause(dctx)
	w := &wait{members: c.members, fail: func(r int) { cancel(&MemberDownError{Rank: r, Op: op}) }}
	g.mu.Lock()
	g.waits[w] = struct{}{}
	var dead []int
	for _, r := range c.members {
		if g.down[r] {
			dead = append(dead, r)
		}
	}
	g.mu.Unlock()
	done = func() {
		g.mu.Lock()
		delete(g.waits, w)
		g.mu.Unlock()
		cancel(nil)
		cancelDeadline()
	}
	n := c.round
	c.round++
	c.kinds[n] = kind
	if len(dead) > 0 {
		// The round is used up all the same: the other members may be in it (a member's down
		// mark can be a moment behind the view, or ahead of it), and a member that skipped it
		// would meet them a round behind in every later collective of the view.
		done()
		return nil, nil, nil, "", &MemberDownError{Rank: dead[0], Op: op}
	}
	go func() { // stop g.Close from leaving the wait hanging: Close ends every collective
		select {
		case <-g.ctx.Done():
			cancel(fmt.Errorf("%w: group closed", status.ErrClosed))
		case <-wctx.Done():
		}
	}()
	key = c.prefix + strconv.FormatInt(n, 10) + "/"
	return dctx, wctx, done, key, nil
}

// clean removes round n-2's keys (called by the first member to arrive at round n: everyone
// has left round n-2 by then).
func (c *collective) clean(ctx context.Context, n int64) {
	old := n - 2
	kind, ok := c.kinds[old]
	delete(c.kinds, old)
	if !ok {
		return
	}
	base := c.prefix + strconv.FormatInt(old, 10) + "/"
	if c.rv != nil {
		meeting, dir, name := c.meetKeys(old)
		_ = c.rv.RemoveMeeting(ctx, meeting)
		_ = c.g.st.Remove(ctx, dir+name)
		return
	}
	names := []string{"BA", "BW"}
	if kind == "g" {
		names = []string{"GA", "GC", "GW"}
	}
	for _, k := range names {
		_ = c.g.st.Remove(ctx, base+k) // best effort: a leftover key costs bytes, not correctness
	}
}

// progressEvery is how often a member waiting in a collective logs who it still waits for.
const progressEvery = 10 * time.Second

// waitKey waits for key; a member's death or the deadline become errors, unless the key is
// there after all. Every progressEvery it logs what missing() says (who has not arrived), and
// a deadline's error says it too.
func (c *collective) waitKey(ctx context.Context, op, key string, missing func() string) ([]byte, error) {
	return c.waitFor(ctx, op, key, func(ctx context.Context, wait time.Duration) ([]byte, error) {
		return c.g.st.Get(ctx, key, wait)
	}, missing)
}

// waitFor is waitKey with the read given: get(ctx, wait) returns the key's value, waiting for
// its creation up to wait (0: not at all).
func (c *collective) waitFor(ctx context.Context, op, key string, get func(context.Context, time.Duration) ([]byte, error), missing func() string) ([]byte, error) {
	start := time.Now()
	var v []byte
	var err error
	for {
		v, err = get(ctx, progressEvery)
		if err == nil {
			return v, nil
		}
		if ctx.Err() != nil || !errors.Is(err, store.ErrTimeout) {
			break
		}
		c.g.log.Warn("group: still waiting", "op", op, "group members", len(c.members), "waiting", missing(),
			"for", time.Since(start).Round(time.Second))
	}
	cause := context.Cause(ctx)
	if ctx.Err() != nil {
		// the round may have completed just as the member died: look once more
		lctx, cancel := context.WithTimeout(c.g.ctx, 2*time.Second)
		defer cancel()
		if v, err2 := get(lctx, 0); err2 == nil {
			return v, nil
		}
		var md *MemberDownError
		if errors.As(cause, &md) {
			return nil, md
		}
		return nil, fmt.Errorf("group: %s: %s after %v: %w", op, missing(), time.Since(start).Round(time.Millisecond), status.ContextError(cause))
	}
	return nil, fmt.Errorf("group: %s: %w", op, err)
}

func (c *collective) barrier(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.round
	ctx, wctx, done, key, err := c.begin(ctx, "barrier", "b")
	if err != nil {
		return err
	}
	defer done()
	if c.rv != nil {
		_, err := c.meet(ctx, wctx, "barrier", n, nil)
		return err
	}
	return c.arrive(ctx, wctx, "barrier", n, key+"BA", key+"BW", nil)
}

// meet is round n through the store's Rendezvous: every member writes its record under its own
// key in the round's meeting, the member completing the round writes the done key with all
// records, and everyone waits for that (one store watch of the done keys' dir serves every
// round; meetKeys names them).
// The first member of the view cleans round n-2.
func (c *collective) meet(ctx, wctx context.Context, op string, n int64, rec []byte) ([]byte, error) {
	idx, _ := slices.BinarySearch(c.members, c.g.rank)
	meeting, dir, name := c.meetKeys(n)
	if err := c.rv.Arrive(ctx, meeting, idx, len(c.members), rec, dir+name); err != nil {
		return nil, fmt.Errorf("group: %s: %w", op, err)
	}
	if idx == 0 {
		c.clean(ctx, n)
	} else {
		delete(c.kinds, n-2)
	}
	get := func(ctx context.Context, wait time.Duration) ([]byte, error) { return c.rv.Await(ctx, dir, name, wait) }
	return c.waitFor(wctx, op, dir+name, get, func() string {
		lctx, cancel := context.WithTimeout(c.g.ctx, time.Second)
		defer cancel()
		ids, err := c.rv.Arrived(lctx, meeting)
		if err != nil {
			return fmt.Sprintf("for some of %d members", len(c.members))
		}
		return c.missing(func(i, _ int) bool { _, ok := slices.BinarySearch(ids, i); return ok })
	})
}

// meetKeys names round n's keys when rounds meet through the store's Rendezvous: the meeting
// (its members' own keys) and the done key dir+name (dir shared by every round).
func (c *collective) meetKeys(n int64) (meeting, dir, name string) {
	round := strconv.FormatInt(n, 10)
	return c.prefix + round + "/M/", c.prefix + "W/", round
}

// missing names the members for which here(index, rank) is false.
func (c *collective) missing(here func(i, rank int) bool) string {
	var miss []int
	for i, r := range c.members {
		if !here(i, r) {
			miss = append(miss, r)
		}
	}
	return fmt.Sprintf("for ranks %v of %d members", miss, len(c.members))
}

// arrive counts this member in at round n's counter, cleans round n-2 if it is the first, sets
// the round's done key if it is the last, and waits for that key.
// missing, if set, names the members that have not arrived; else their count is given.
func (c *collective) arrive(ctx, wctx context.Context, op string, n int64, counter, doneKey string, missing func() string) error {
	cnt, err := c.g.st.Add(ctx, counter, 1)
	if err != nil {
		return fmt.Errorf("group: %s: %w", op, err)
	}
	if cnt == 1 {
		c.clean(ctx, n)
	} else {
		delete(c.kinds, n-2)
	}
	if cnt == int64(len(c.members)) {
		if err := c.g.st.Set(ctx, doneKey, []byte("ok")); err != nil {
			return fmt.Errorf("group: %s: %w", op, err)
		}
	}
	if missing == nil {
		missing = func() string {
			lctx, cancel := context.WithTimeout(c.g.ctx, time.Second)
			defer cancel()
			got, err := c.g.st.Add(lctx, counter, 0)
			if err != nil {
				return fmt.Sprintf("for some of %d members", len(c.members))
			}
			return fmt.Sprintf("for %d of %d members", int64(len(c.members))-got, len(c.members))
		}
	}
	_, err = c.waitKey(wctx, op, doneKey, missing)
	return err
}

// absent names the members whose allgather records are not in key yet.
func (c *collective) absent(key string) string {
	lctx, cancel := context.WithTimeout(c.g.ctx, time.Second)
	defer cancel()
	all, err := c.g.st.Get(lctx, key, 0)
	if err != nil {
		return fmt.Sprintf("for some of %d members", len(c.members))
	}
	here := map[int]bool{}
	for len(all) >= 8 {
		l := int(binary.LittleEndian.Uint32(all[4:]))
		here[int(binary.LittleEndian.Uint32(all))] = true
		if l > len(all)-8 {
			break
		}
		all = all[8+l:]
	}
	return c.missing(func(_, r int) bool { return here[r] })
}

func (c *collective) allGather(ctx context.Context, data []byte) ([][]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.round
	ctx, wctx, done, key, err := c.begin(ctx, "allgather", "g")
	if err != nil {
		return nil, err
	}
	defer done()
	rec := make([]byte, 8+len(data))
	binary.LittleEndian.PutUint32(rec, uint32(c.g.rank))
	binary.LittleEndian.PutUint32(rec[4:], uint32(len(data)))
	copy(rec[8:], data)
	if c.rv != nil {
		all, err := c.meet(ctx, wctx, "allgather", n, rec)
		if err != nil {
			return nil, err
		}
		return c.parse(all)
	}
	if _, err := c.g.st.Append(ctx, key+"GA", rec); err != nil {
		return nil, fmt.Errorf("group: allgather: %w", err)
	}
	if err := c.arrive(ctx, wctx, "allgather", n, key+"GC", key+"GW", func() string { return c.absent(key + "GA") }); err != nil {
		return nil, err
	}
	all, err := c.g.st.Get(ctx, key+"GA", 0)
	if err != nil {
		return nil, fmt.Errorf("group: allgather: %w", err)
	}
	return c.parse(all)
}

// parse splits the appended records into rank order, checking every length.
func (c *collective) parse(all []byte) ([][]byte, error) {
	out := make([][]byte, len(c.members))
	got := 0
	for len(all) > 0 {
		if len(all) < 8 {
			return nil, fmt.Errorf("%w: allgather record truncated", store.ErrInvalidMessage)
		}
		r := int(binary.LittleEndian.Uint32(all))
		l := int(binary.LittleEndian.Uint32(all[4:]))
		if l > len(all)-8 {
			return nil, fmt.Errorf("%w: allgather record of %d bytes", store.ErrInvalidMessage, l)
		}
		i, ok := slices.BinarySearch(c.members, r)
		if !ok || out[i] != nil {
			return nil, fmt.Errorf("%w: allgather record from rank %d (members %v)", store.ErrInvalidMessage, r, c.members)
		}
		out[i] = all[8 : 8+l : 8+l]
		all = all[8+l:]
		got++
	}
	if got != len(c.members) {
		return nil, fmt.Errorf("%w: allgather has %d of %d records", store.ErrInvalidMessage, got, len(c.members))
	}
	return out, nil
}
