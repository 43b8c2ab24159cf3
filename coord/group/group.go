package group

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/status"
)

// Config configures a Group.
type Config struct {
	// Size > 0 makes a static group of ranks 0..Size-1; 0 makes a dynamic group (Join/Leave).
	Size int
	// Timeout is the deadline of a wait whose context has none. Default 120 s.
	Timeout time.Duration
	// OnEvent, if set, is told of membership events as they happen: "member_down" (a member's
	// store link was lost or closed) with its rank, and "view" (a new membership version) with
	// the view's member count. It must not block (metrics.Metrics.GroupEvent counts them).
	OnEvent func(event string, n int)
	// Logger receives membership events; nil discards them.
	Logger *slog.Logger
}

// DefaultConfig returns a Config for a dynamic group with the default timeout.
func DefaultConfig() Config { return Config{Timeout: defaultTimeout} }

// defaultTimeout is Config.Timeout's default.
const defaultTimeout = 120 * time.Second

// Validate rejects impossible settings.
func (c Config) Validate() error {
	if c.Size < 0 || c.Size > store.MaxWorldSize || c.Timeout < 0 {
		return fmt.Errorf("%w: group size %d (0..%d), timeout %v", status.ErrInvalidConfig, c.Size, store.MaxWorldSize, c.Timeout)
	}
	return nil
}

// View is a group's membership at one version.
type View struct {
	Version int64
	Members []int // sorted ranks
}

// Size returns the number of members.
func (v View) Size() int { return len(v.Members) }

// Has says whether rank is a member.
func (v View) Has(rank int) bool { _, ok := slices.BinarySearch(v.Members, rank); return ok }

// Index returns rank's position in Members, or -1.
func (v View) Index(rank int) int {
	if i, ok := slices.BinarySearch(v.Members, rank); ok {
		return i
	}
	return -1
}

// MemberDownError reports a member that died during a collective or before it.
type MemberDownError struct {
	Rank int
	Op   string
}

func (e *MemberDownError) Error() string {
	return fmt.Sprintf("group: %s: member rank %d is down", e.Op, e.Rank)
}

// Unwrap makes a MemberDownError a status.ErrPeerClosed.
func (e *MemberDownError) Unwrap() error { return status.ErrPeerClosed }

// ErrNotMember is returned by collectives of a rank outside the current view.
var ErrNotMember = fmt.Errorf("%w: group: this rank is not a member", status.ErrInvalidConfig)

// Group is one process's handle on a named group. Its methods are safe for concurrent use, but
// collectives of one group must be called in the same order by all members.
type Group struct {
	st      store.Client // prefixed with the group's name
	rank    int
	cfg     Config
	static  bool
	log     *slog.Logger
	stopRD  func()
	ctx     context.Context // ends at Close
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	changes chan struct{} // kicks the membership goroutine

	adoptMu sync.Mutex // serialises adopt, callbacks included
	mu      sync.Mutex
	view    View
	coll    *collective // rounds of the current view
	down    map[int]bool
	waits   map[*wait]struct{}
	onView  map[int]func(old, new View)
	nextFn  int
	pending []death // dead ranks to remove from the view
	viewCh  chan struct{}
	recent  [viewHistory]View // the last views adopted, by Version % viewHistory (WaitView)
	joined  bool              // Join succeeded and Leave was not called: a view without this rank is a mistake
	dropped bool              // a view dropped this joined rank: the membership goroutine joins again
}

// wait is a collective in progress: it fails when one of its members goes down.
type wait struct {
	members []int
	fail    func(rank int)
}

// New opens the group name on store client c (whose rank is this member's rank).
func New(ctx context.Context, c store.Client, name string, cfg Config) (*Group, error) {
	if c.Rank() == store.NoRank {
		return nil, fmt.Errorf("%w: group %q: the store client has no rank", status.ErrInvalidConfig, name)
	}
	if name == "" || len(name) > 64 || strings.ContainsAny(name, "/") {
		return nil, fmt.Errorf("%w: group name %q (1..64 bytes, no '/')", status.ErrInvalidConfig, name)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = defaultTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	gctx, cancel := context.WithCancel(context.Background())
	g := &Group{st: store.Prefixed(c, "group/"+name+"/"), rank: c.Rank(), cfg: cfg, static: cfg.Size > 0,
		log: cfg.Logger, ctx: gctx, cancel: cancel, changes: make(chan struct{}, 1),
		down: map[int]bool{}, waits: map[*wait]struct{}{}, onView: map[int]func(old, new View){},
		viewCh: make(chan struct{})}
	if g.static {
		if g.rank >= cfg.Size {
			cancel()
			return nil, fmt.Errorf("%w: rank %d outside static group of %d", status.ErrInvalidConfig, g.rank, cfg.Size)
		}
		g.view = View{Members: make([]int, cfg.Size)}
		for i := range g.view.Members {
			g.view.Members[i] = i
		}
	} else {
		v, err := g.latest(ctx, View{})
		if err != nil {
			cancel()
			return nil, err
		}
		g.view = v
	}
	g.coll = g.newCollective("c/"+strconv.FormatInt(g.view.Version, 10)+"/", g.view.Members)
	g.stopRD = c.WatchRankDown(g.rankDown)
	if !g.static {
		g.wg.Add(2)
		go g.follow()  // owned by g: Close cancels and waits
		go g.removal() // owned by g
	}
	return g, nil
}

// Rank returns this member's rank.
func (g *Group) Rank() int { return g.rank }

// View returns the current view.
func (g *Group) View() View {
	g.mu.Lock()
	defer g.mu.Unlock()
	return View{Version: g.view.Version, Members: slices.Clone(g.view.Members)}
}

// OnViewChange registers fn, called (one at a time, in version order, from the goroutine that
// adopted the view) after each view change this member adopts; a view adopted after a newer
// one is skipped. fn must not call Join or Leave (they adopt views too). cancel unregisters it.
func (g *Group) OnViewChange(fn func(old, new View)) (cancel func()) {
	g.mu.Lock()
	id := g.nextFn
	g.nextFn++
	g.onView[id] = fn
	g.mu.Unlock()
	return func() {
		g.mu.Lock()
		delete(g.onView, id)
		g.mu.Unlock()
	}
}

// viewHistory is how many adopted views WaitView can look back on.
const viewHistory = 16

// WaitView waits until the current view, or one adopted since the call, satisfies ok and
// returns it. A view that held only until the next was adopted counts: a waiter woken late
// looks at each view adopted meanwhile, oldest first (the last viewHistory of them).
func (g *Group) WaitView(ctx context.Context, ok func(View) bool) (View, error) {
	ctx, cancel := g.deadline(ctx)
	defer cancel()
	g.mu.Lock()
	v, ch := g.view, g.viewCh
	g.mu.Unlock()
	for {
		if ok(v) {
			return View{Version: v.Version, Members: slices.Clone(v.Members)}, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return v, fmt.Errorf("group: waiting for a view: %w", status.ContextError(ctx.Err()))
		}
		g.mu.Lock()
		missed := g.since(v.Version)
		v, ch = g.view, g.viewCh
		g.mu.Unlock()
		for _, m := range missed {
			if ok(m) {
				return View{Version: m.Version, Members: slices.Clone(m.Members)}, nil
			}
		}
	}
}

// since returns the views adopted after version, oldest first, that are still in the history,
// without the current one. Caller holds mu.
func (g *Group) since(version int64) []View {
	var vs []View
	for x := max(version+1, g.view.Version-viewHistory+1); x < g.view.Version; x++ {
		if r := g.recent[x%viewHistory]; r.Version == x {
			vs = append(vs, r)
		}
	}
	return vs
}

// Close stops following the group (it does not Leave). Collectives in progress fail.
func (g *Group) Close() error {
	g.stopRD()
	g.cancel()
	g.wg.Wait()
	return nil
}

func (g *Group) deadline(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, g.cfg.Timeout)
}

// ---- dynamic membership ----

func encodeMembers(m []int) []byte {
	parts := make([]string, len(m))
	for i, r := range m {
		parts[i] = strconv.Itoa(r)
	}
	return []byte("m:" + strings.Join(parts, ","))
}

func decodeMembers(b []byte) ([]int, error) {
	s, ok := strings.CutPrefix(string(b), "m:")
	if !ok {
		return nil, fmt.Errorf("%w: group view %q", store.ErrInvalidMessage, b)
	}
	if s == "" {
		return nil, nil
	}
	var m []int
	for _, p := range strings.Split(s, ",") {
		r, err := strconv.Atoi(p)
		// Sorted and distinct, as every view is written: members are looked up by binary
		// search, and a rank listed twice would count twice.
		if err != nil || r < 0 || r >= store.MaxWorldSize || len(m) > 0 && r <= m[len(m)-1] {
			return nil, fmt.Errorf("%w: group view %q", store.ErrInvalidMessage, b)
		}
		m = append(m, r)
	}
	return m, nil
}

func viewKey(v int64) string { return "view/" + strconv.FormatInt(v, 10) }

// readView reads view version v (store.ErrNotExist: not created yet).
func (g *Group) readView(ctx context.Context, v int64) (View, error) {
	b, err := g.st.Get(ctx, viewKey(v), 0)
	if err != nil {
		return View{}, err
	}
	m, err := decodeMembers(b)
	if err != nil {
		return View{}, err
	}
	return View{Version: v, Members: m}, nil
}

// latest reads the newest view, starting from the version hint and probing forward.
func (g *Group) latest(ctx context.Context, from View) (View, error) {
	v := from
	hint, err := g.st.Add(ctx, "ver", 0)
	if err != nil {
		return v, err
	}
	if hint > v.Version {
		if v, err = g.readView(ctx, hint); err != nil {
			return from, err
		}
	}
	for {
		next, err := g.readView(ctx, v.Version+1)
		if errors.Is(err, store.ErrNotExist) {
			return v, nil
		}
		if err != nil {
			return v, err
		}
		v = next
	}
}

// change applies modify to the newest view until a new version is created or modify declines;
// it returns the view that holds afterwards.
func (g *Group) change(ctx context.Context, modify func([]int) ([]int, bool)) (View, error) {
	if g.static {
		return View{}, fmt.Errorf("%w: a static group has fixed members", status.ErrUnsupported)
	}
	v := g.View()
	for {
		var err error
		if v, err = g.latest(ctx, v); err != nil {
			return v, err
		}
		m, changed := modify(slices.Clone(v.Members))
		if !changed {
			return v, nil
		}
		slices.Sort(m)
		prev, err := g.st.CompareAndSwap(ctx, viewKey(v.Version+1), nil, encodeMembers(m))
		if err != nil {
			return v, err
		}
		if prev == nil { // ours: version v+1 is this change
			nv := View{Version: v.Version + 1, Members: m}
			if err := g.st.Set(ctx, "ver", []byte(strconv.FormatInt(nv.Version, 10))); err != nil {
				return nv, err
			}
			g.adopt(nv)
			return nv, nil
		}
	}
}

// Join adds this rank to the group and returns the new view (a member already is one). A
// process whose rank the view still holds from a process before it (restarted before the
// others removed the dead one) makes a new view of the same members: every member's
// collectives then start again together, the new process's from their first round.
func (g *Group) Join(ctx context.Context) (View, error) {
	ctx, cancel := g.deadline(ctx)
	defer cancel()
	g.mu.Lock()
	fresh := !g.joined
	g.mu.Unlock()
	v, err := g.change(ctx, func(m []int) ([]int, bool) {
		if slices.Contains(m, g.rank) {
			return m, fresh
		}
		if len(m) >= store.MaxWorldSize {
			return m, false
		}
		return append(m, g.rank), true
	})
	if err == nil && !v.Has(g.rank) {
		err = fmt.Errorf("%w: group is full (%d members)", store.ErrFailed, v.Size())
	}
	if err == nil {
		g.mu.Lock()
		g.joined = true
		g.mu.Unlock()
	}
	return v, err
}

// Leave removes this rank from the group and returns the new view.
func (g *Group) Leave(ctx context.Context) (View, error) {
	ctx, cancel := g.deadline(ctx)
	defer cancel()
	g.mu.Lock()
	g.joined = false
	g.mu.Unlock()
	return g.change(ctx, func(m []int) ([]int, bool) {
		i := slices.Index(m, g.rank)
		if i < 0 {
			return m, false
		}
		return slices.Delete(m, i, i+1), true
	})
}

// adopt makes v the current view if it is newer, and runs the callbacks.
func (g *Group) adopt(v View) {
	// One adoption at a time, callbacks included: Join's own adoption and the follower's may
	// race, and a newer view's callbacks must not run before an older one's (they did: a
	// view-change callback saw version 1 after 5).
	g.adoptMu.Lock()
	defer g.adoptMu.Unlock()
	g.mu.Lock()
	if v.Version <= g.view.Version {
		g.mu.Unlock()
		return
	}
	old := g.view
	g.view = v
	g.recent[v.Version%viewHistory] = v
	for r := range g.down {
		if !v.Has(r) { // removed: a process that takes the rank again is a new member
			delete(g.down, r)
		}
	}
	g.coll = g.newCollective("c/"+strconv.FormatInt(v.Version, 10)+"/", v.Members)
	if g.joined && !v.Has(g.rank) {
		// Removed while alive: a survivor acted on a death reported late (its rank-down
		// event and the view that removed the dead process can reach members in either
		// order, and on etcd they travel on separate watches), or the rank was cut off
		// from the store long enough to be taken for dead. It joins again.
		g.dropped = true
		select {
		case g.changes <- struct{}{}:
		default:
		}
	}
	close(g.viewCh)
	g.viewCh = make(chan struct{})
	fns := make([]func(old, new View), 0, len(g.onView))
	for _, f := range g.onView {
		fns = append(fns, f)
	}
	g.mu.Unlock()
	g.log.Info("group: view", "version", v.Version, "members", v.Members)
	if g.cfg.OnEvent != nil {
		g.cfg.OnEvent("view", len(v.Members))
	}
	for _, f := range fns {
		f(old, v)
	}
}

// follow adopts every new view version as it is created.
func (g *Group) follow() {
	defer g.wg.Done()
	for {
		cur := g.View()
		b, err := g.st.Get(g.ctx, viewKey(cur.Version+1), store.Forever)
		if g.ctx.Err() != nil {
			return
		}
		if err != nil {
			g.log.Warn("group: following views", "err", err)
			select {
			case <-g.ctx.Done():
				return
			case <-time.After(time.Second):
			}
			continue
		}
		m, err := decodeMembers(b)
		if err != nil {
			g.log.Warn("group: bad view", "err", err)
			return
		}
		g.adopt(View{Version: cur.Version + 1, Members: m})
	}
}

// death is a rank the store reported down, with the view version current when it did.
type death struct {
	rank int
	at   int64
}

// rankDown is the store's rank-down callback.
func (g *Group) rankDown(r int) {
	g.mu.Lock()
	if g.view.Has(r) {
		// Only a member's death marks its rank down. A report that reaches this member after
		// the view that removed the dead process (on etcd the two travel on separate watches)
		// is of no member: marked, it outlived the rank's return, since only a view without
		// the rank clears the mark, and failed every collective of the restarted process.
		g.down[r] = true
	}
	var fails []func(int)
	for w := range g.waits {
		if slices.Contains(w.members, r) {
			fails = append(fails, w.fail)
		}
	}
	if !g.static {
		g.pending = append(g.pending, death{rank: r, at: g.view.Version})
	}
	g.mu.Unlock()
	if g.cfg.OnEvent != nil {
		g.cfg.OnEvent("member_down", r)
	}
	for _, f := range fails {
		f(r)
	}
	if !g.static {
		select {
		case g.changes <- struct{}{}:
		default:
		}
	}
}

// leftSince reports whether some view after version at lacks rank r: its death, reported at
// at, was then handled already (and a later view that has r again has a new process).
func (g *Group) leftSince(ctx context.Context, r int, at int64) (bool, error) {
	for v := at + 1; ; v++ {
		view, err := g.readView(ctx, v)
		if errors.Is(err, store.ErrNotExist) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if !view.Has(r) {
			return true, nil
		}
	}
}

// removal takes dead ranks out of the view (every live member races; one new view results).
func (g *Group) removal() {
	defer g.wg.Done()
	var retry <-chan time.Time // a failed rejoin is tried again
	for {
		select {
		case <-g.ctx.Done():
			return
		case <-g.changes:
		case <-retry:
		}
		retry = nil
		g.mu.Lock()
		pending, dropped := g.pending, g.dropped
		g.pending, g.dropped = nil, false
		g.mu.Unlock()
		if dropped {
			// Join again once the store holds this rank again (a client cut off long enough
			// to be reported down takes its rank back by itself): a member in the view whose
			// rank nobody watches would never be reported down again.
			ctx, cancel := context.WithTimeout(g.ctx, g.cfg.Timeout)
			err := g.st.Live(ctx)
			var v View
			if err == nil {
				v, err = g.Join(ctx)
			}
			cancel()
			switch {
			case err == nil:
				g.log.Info("group: joined again after being dropped", "view", v.Version)
			case g.ctx.Err() == nil:
				g.log.Warn("group: joining again after being dropped; trying again", "err", err)
				g.mu.Lock()
				g.dropped = g.joined
				g.mu.Unlock()
				retry = time.After(100 * time.Millisecond)
			}
		}
		if len(pending) == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(g.ctx, g.cfg.Timeout)
		// A death another member already handled is not handled again: the rank may be back
		// by now, a restarted process that rejoined, and removing it would expel the live one.
		// Nor is a rank that a live client holds again: the report came after the restarted
		// process took the rank back (or after a client that was only cut off did).
		var dead []int
		for _, d := range pending {
			gone, err := g.leftSince(ctx, d.rank, d.at)
			if err != nil && g.ctx.Err() == nil {
				g.log.Warn("group: reading views", "err", err)
			}
			if gone {
				g.log.Debug("group: a reported death was handled already", "rank", d.rank)
				continue
			}
			if live, err := g.st.RankLive(ctx, d.rank); err == nil && live {
				g.mu.Lock()
				delete(g.down, d.rank)
				g.mu.Unlock()
				// Logged once the mark is gone: whoever acts on the line finds the rank usable.
				g.log.Info("group: a reported death is of a past process: the rank is live again", "rank", d.rank)
				continue
			}
			dead = append(dead, d.rank)
		}
		if len(dead) == 0 {
			cancel()
			continue
		}
		removed := false // the last modify's answer: whether the view that holds is this change
		_, err := g.change(ctx, func(m []int) ([]int, bool) {
			n := slices.DeleteFunc(m, func(r int) bool { return slices.Contains(dead, r) })
			removed = len(n) != len(m)
			return n, removed
		})
		cancel()
		switch {
		case err != nil && g.ctx.Err() == nil:
			g.log.Warn("group: removing dead ranks", "ranks", dead, "err", err)
		case err == nil && removed:
			g.log.Info("group: dead ranks removed", "ranks", dead)
		case err == nil:
			g.log.Debug("group: dead ranks already removed by another member", "ranks", dead)
		}
	}
}
