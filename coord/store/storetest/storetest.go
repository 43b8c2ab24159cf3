// Package storetest is the conformance suite every config-store backend passes: the same
// tests run on the embedded server and on etcd.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/status"
)

// Opener opens clients of one fresh store (one test's namespace).
type Opener func(cfg store.Config) (store.Client, error)

// Backend makes a fresh store for a test and returns its opener; cleanup goes to t.Cleanup.
type Backend func(t *testing.T) Opener

// Run runs the suite.
func Run(t *testing.T, b Backend) {
	tests := []struct {
		name string
		fn   func(*testing.T, Opener)
	}{
		{"SetGet", testSetGet},
		{"GetWaitsForCreation", testGetWaits},
		{"GetTimeout", testGetTimeout},
		{"GetForeverHonoursContext", testGetForeverCtx},
		{"Add", testAdd},
		{"Append", testAppend},
		{"CompareAndSwap", testCAS},
		{"Write", testWrite},
		{"Remove", testRemove},
		{"Watch", testWatch},
		{"Prefixed", testPrefixed},
		{"BadKeys", testBadKeys},
		{"ExplicitRanks", testExplicitRanks},
		{"AutoRanks", testAutoRanks},
		{"RankDown", testRankDown},
		{"RankLive", testRankLive},
		{"RankByName", testRankByName},
		{"ManyClients", testManyClients},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, b(t)) })
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// MustOpen opens a client and closes it at the end of the test.
func MustOpen(t *testing.T, open Opener, cfg store.Config) store.Client {
	t.Helper()
	c, err := open(cfg)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func wantCode(t *testing.T, err error, sentinel error, code store.Code) {
	t.Helper()
	if !errors.Is(err, sentinel) || store.CodeOf(err) != code {
		t.Fatalf("err = %v (code %v), want %v (%v)", err, store.CodeOf(err), sentinel, code)
	}
}

func testSetGet(t *testing.T, open Opener) {
	c := MustOpen(t, open, store.Config{})
	x := ctx(t)
	if err := c.Set(x, "k", []byte("v1")); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(x, "k", []byte("v2")); err != nil {
		t.Fatal(err)
	}
	v, err := c.Get(x, "k", 0)
	if err != nil || string(v) != "v2" {
		t.Fatalf("Get = %q, %v", v, err)
	}
	if err := c.Set(x, "empty", nil); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Get(x, "empty", 0); err != nil || len(v) != 0 {
		t.Fatalf("Get empty = %q, %v", v, err)
	}
	big := bytes.Repeat([]byte{0xA5, 0x5A, 0}, 300_000)
	if err := c.Set(x, "big", big); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Get(x, "big", 0); err != nil || !bytes.Equal(v, big) {
		t.Fatalf("Get big: %d bytes, %v", len(v), err)
	}
	_, err = c.Get(x, "absent", 0)
	wantCode(t, err, store.ErrNotExist, store.CodeNotExist)
	if !errors.Is(err, status.ErrNotFound) {
		t.Fatalf("%v is not a status.ErrNotFound", err)
	}
}

func testGetWaits(t *testing.T, open Opener) {
	a := MustOpen(t, open, store.Config{})
	b := MustOpen(t, open, store.Config{})
	x := ctx(t)
	type res struct {
		v   []byte
		err error
	}
	timed, forever := make(chan res, 1), make(chan res, 1)
	go func() { v, err := a.Get(x, "late", 20*time.Second); timed <- res{v, err} }()
	go func() { v, err := a.Get(x, "late", store.Forever); forever <- res{v, err} }()
	time.Sleep(100 * time.Millisecond)
	if err := b.Set(x, "late", []byte("here")); err != nil {
		t.Fatal(err)
	}
	for _, ch := range []chan res{timed, forever} {
		r := <-ch
		if r.err != nil || string(r.v) != "here" {
			t.Fatalf("waiting Get = %q, %v", r.v, r.err)
		}
	}
	// Creation by Add, Append, CompareAndSwap and Write wakes waiters too.
	creators := map[string]func(string) error{
		"add":    func(k string) error { _, err := b.Add(x, k, 7); return err },
		"append": func(k string) error { _, err := b.Append(x, k, []byte("7")); return err },
		"cas":    func(k string) error { _, err := b.CompareAndSwap(x, k, nil, []byte("7")); return err },
		"write":  func(k string) error { return b.Write(x, k, 0, []byte("7")) },
	}
	for name, create := range creators {
		ch := make(chan res, 1)
		go func() { v, err := a.Get(x, "made-by-"+name, 20*time.Second); ch <- res{v, err} }()
		time.Sleep(50 * time.Millisecond)
		if err := create("made-by-" + name); err != nil {
			t.Fatal(name, err)
		}
		if r := <-ch; r.err != nil || string(r.v) != "7" {
			t.Fatalf("Get woken by %s = %q, %v", name, r.v, r.err)
		}
	}
}

func testGetTimeout(t *testing.T, open Opener) {
	c := MustOpen(t, open, store.Config{})
	start := time.Now()
	_, err := c.Get(ctx(t), "never", 150*time.Millisecond)
	wantCode(t, err, store.ErrTimeout, store.CodeTimeout)
	if !errors.Is(err, status.ErrTimeout) {
		t.Fatalf("%v is not a status.ErrTimeout", err)
	}
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Fatalf("timed out after %v, before the 150ms wait", d)
	}
	// The client still works.
	if err := c.Set(ctx(t), "after", []byte("x")); err != nil {
		t.Fatal(err)
	}
}

func testGetForeverCtx(t *testing.T, open Opener) {
	c := MustOpen(t, open, store.Config{})
	x, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	_, err := c.Get(x, "never", store.Forever)
	if status.CodeOf(err) != status.Timeout {
		t.Fatalf("Get forever past the deadline = %v, want a timeout", err)
	}
	x2, cancel2 := context.WithCancel(context.Background())
	go func() { time.Sleep(50 * time.Millisecond); cancel2() }()
	if _, err = c.Get(x2, "never", store.Forever); !errors.Is(err, status.ErrCanceled) {
		t.Fatalf("Get forever, cancelled = %v", err)
	}
	if _, err := c.Add(ctx(t), "still-works", 1); err != nil {
		t.Fatal(err)
	}
}

func testAdd(t *testing.T, open Opener) {
	c := MustOpen(t, open, store.Config{})
	x := ctx(t)
	if n, err := c.Add(x, "n", 5); err != nil || n != 5 {
		t.Fatalf("Add absent = %d, %v", n, err)
	}
	if n, err := c.Add(x, "n", -7); err != nil || n != -2 {
		t.Fatalf("Add = %d, %v", n, err)
	}
	if n, err := c.Add(x, "n", 0); err != nil || n != -2 {
		t.Fatalf("Add 0 = %d, %v", n, err)
	}
	if v, _ := c.Get(x, "n", 0); string(v) != "-2" {
		t.Fatalf("stored %q, want decimal -2", v)
	}
	if n, err := c.Add(x, "zero", 0); err != nil || n != 0 {
		t.Fatalf("Add 0 absent = %d, %v", n, err)
	}
	_ = c.Set(x, "text", []byte("abc"))
	_, err := c.Add(x, "text", 1)
	wantCode(t, err, store.ErrFailed, store.CodeError)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 25 {
				if _, err := c.Add(x, "shared", 1); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if n, _ := c.Add(x, "shared", 0); n != 200 {
		t.Fatalf("concurrent adds = %d, want 200", n)
	}
}

func testAppend(t *testing.T, open Opener) {
	c := MustOpen(t, open, store.Config{})
	x := ctx(t)
	if n, err := c.Append(x, "a", []byte("abc")); err != nil || n != 3 {
		t.Fatalf("Append = %d, %v", n, err)
	}
	if n, err := c.Append(x, "a", []byte("de")); err != nil || n != 5 {
		t.Fatalf("Append = %d, %v", n, err)
	}
	if v, _ := c.Get(x, "a", 0); string(v) != "abcde" {
		t.Fatalf("value %q", v)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				if _, err := c.Append(x, "many", []byte{byte('a' + i)}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	v, _ := c.Get(x, "many", 0)
	counts := map[byte]int{}
	for _, b := range v {
		counts[b]++
	}
	if len(v) != 80 || len(counts) != 8 {
		t.Fatalf("concurrent appends: %d bytes, %v", len(v), counts)
	}
}

func testCAS(t *testing.T, open Opener) {
	c := MustOpen(t, open, store.Config{})
	x := ctx(t)
	prev, err := c.CompareAndSwap(x, "k", nil, []byte("one"))
	if err != nil || prev != nil {
		t.Fatalf("CAS create = %q, %v", prev, err)
	}
	prev, err = c.CompareAndSwap(x, "k", nil, []byte("again"))
	if err != nil || string(prev) != "one" {
		t.Fatalf("CAS create on existing = %q, %v", prev, err)
	}
	prev, err = c.CompareAndSwap(x, "k", []byte("wrong"), []byte("two"))
	if err != nil || string(prev) != "one" {
		t.Fatalf("CAS mismatch = %q, %v", prev, err)
	}
	prev, err = c.CompareAndSwap(x, "k", []byte("one"), []byte("two"))
	if err != nil || string(prev) != "one" {
		t.Fatalf("CAS = %q, %v", prev, err)
	}
	if v, _ := c.Get(x, "k", 0); string(v) != "two" {
		t.Fatalf("after CAS %q", v)
	}
	prev, err = c.CompareAndSwap(x, "absent", []byte("x"), []byte("y"))
	if err != nil || prev != nil {
		t.Fatalf("CAS absent with expected = %q, %v", prev, err)
	}
	if _, err := c.Get(x, "absent", 0); !errors.Is(err, store.ErrNotExist) {
		t.Fatalf("CAS with a non-empty expected created the key: %v", err)
	}
	// A CAS counter: every increment is unique.
	var wg sync.WaitGroup
	var mu sync.Mutex
	seen := map[string]bool{}
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 8 {
				for {
					cur, _ := c.Get(x, "ctr", 0)
					var n int
					_, _ = fmt.Sscan(string(cur), &n)
					next := []byte(fmt.Sprint(n + 1))
					prev, err := c.CompareAndSwap(x, "ctr", cur, next)
					if err != nil {
						t.Error(err)
						return
					}
					if bytes.Equal(prev, cur) || (prev == nil && len(cur) == 0) {
						mu.Lock()
						if seen[string(next)] {
							t.Errorf("value %s taken twice", next)
						}
						seen[string(next)] = true
						mu.Unlock()
						break
					}
				}
			}
		}()
	}
	wg.Wait()
	if v, _ := c.Get(x, "ctr", 0); string(v) != "48" {
		t.Fatalf("CAS counter = %s, want 48", v)
	}
}

func testWrite(t *testing.T, open Opener) {
	c := MustOpen(t, open, store.Config{})
	x := ctx(t)
	if err := c.Write(x, "w", 4, []byte("xy")); err != nil {
		t.Fatal(err)
	}
	if v, _ := c.Get(x, "w", 0); !bytes.Equal(v, []byte{0, 0, 0, 0, 'x', 'y'}) {
		t.Fatalf("Write into absent = %q", v)
	}
	if err := c.Write(x, "w", 1, []byte("ab")); err != nil {
		t.Fatal(err)
	}
	if err := c.Write(x, "w", 5, []byte("ZZZ")); err != nil {
		t.Fatal(err)
	}
	if v, _ := c.Get(x, "w", 0); !bytes.Equal(v, []byte{0, 'a', 'b', 0, 'x', 'Z', 'Z', 'Z'}) {
		t.Fatalf("Write = %q", v)
	}
	err := c.Write(x, "w", 1<<31, []byte("x"))
	wantCode(t, err, store.ErrInvalidMessage, store.CodeInvalidMessage)
}

func testRemove(t *testing.T, open Opener) {
	c := MustOpen(t, open, store.Config{})
	x := ctx(t)
	_ = c.Set(x, "r", []byte("1"))
	if err := c.Remove(x, "r"); err != nil {
		t.Fatal(err)
	}
	wantCode(t, c.Remove(x, "r"), store.ErrNotExist, store.CodeNotExist)
	if _, err := c.Get(x, "r", 0); !errors.Is(err, store.ErrNotExist) {
		t.Fatalf("Get after Remove: %v", err)
	}
}

func testWatch(t *testing.T, open Opener) {
	c := MustOpen(t, open, store.Config{})
	x := ctx(t)
	fired := make(chan string, 4)
	stop := store.Watch(c, "w", func(v []byte, err error) {
		if err != nil {
			fired <- "error: " + err.Error()
			return
		}
		fired <- string(v)
	})
	defer stop()
	select {
	case v := <-fired:
		t.Fatalf("watch fired before creation: %q", v)
	case <-time.After(100 * time.Millisecond):
	}
	_ = c.Set(x, "w", []byte("born"))
	_ = c.Set(x, "w", []byte("updated"))
	if v := <-fired; v != "born" {
		t.Fatalf("watch got %q", v)
	}
	select {
	case v := <-fired:
		t.Fatalf("watch fired twice: %q", v)
	case <-time.After(100 * time.Millisecond):
	}
	// A stopped watch does not fire.
	stop2 := store.Watch(c, "w2", func([]byte, error) { fired <- "w2" })
	stop2()
	_ = c.Set(x, "w2", []byte("x"))
	select {
	case v := <-fired:
		t.Fatalf("stopped watch fired: %q", v)
	case <-time.After(100 * time.Millisecond):
	}
}

func testPrefixed(t *testing.T, open Opener) {
	c := MustOpen(t, open, store.Config{})
	x := ctx(t)
	a := store.Prefixed(c, "A_")
	ab := store.Prefixed(a, "B_")
	_ = a.Set(x, "k", []byte("a"))
	_ = ab.Set(x, "k", []byte("ab"))
	for key, want := range map[string]string{"A_k": "a", "A_B_k": "ab"} {
		if v, err := c.Get(x, key, 0); err != nil || string(v) != want {
			t.Fatalf("%s = %q, %v", key, v, err)
		}
	}
	if v, _ := ab.Get(x, "k", 0); string(v) != "ab" {
		t.Fatalf("nested view read %q", v)
	}
	if _, err := c.Get(x, "k", 0); !errors.Is(err, store.ErrNotExist) {
		t.Fatal("prefix leaked")
	}
}

func testBadKeys(t *testing.T, open Opener) {
	c := MustOpen(t, open, store.Config{})
	x := ctx(t)
	wantCode(t, c.Set(x, "", []byte("v")), store.ErrInvalidKey, store.CodeInvalidKey)
	long := string(bytes.Repeat([]byte("k"), store.MaxKeyLen+1))
	_, err := c.Get(x, long, 0)
	wantCode(t, err, store.ErrInvalidKey, store.CodeInvalidKey)
	err = c.Set(x, "huge", make([]byte, store.MaxValueLen+1))
	wantCode(t, err, store.ErrInvalidMessage, store.CodeInvalidMessage)
	if err := c.Set(x, "fine", []byte("ok")); err != nil {
		t.Fatalf("client broken after bad input: %v", err)
	}
}

func testExplicitRanks(t *testing.T, open Opener) {
	a := MustOpen(t, open, store.Config{Ranking: store.Explicit, Rank: 0, WorldSize: 4})
	b := MustOpen(t, open, store.Config{Ranking: store.Explicit, Rank: 3, WorldSize: 4})
	if a.Rank() != 0 || b.Rank() != 3 || b.WorldSize() != 4 {
		t.Fatalf("ranks %d %d world %d", a.Rank(), b.Rank(), b.WorldSize())
	}
	if c, err := open(store.Config{Ranking: store.Explicit, Rank: 3, WorldSize: 4}); err == nil {
		_ = c.Close()
		t.Fatal("a second client took live rank 3")
	} else if !errors.Is(err, store.ErrFailed) {
		t.Fatalf("duplicate rank: %v", err)
	}
	if c, err := open(store.Config{Ranking: store.Explicit, Rank: 2, WorldSize: 8}); err == nil {
		_ = c.Close()
		t.Fatal("a client with another world size was accepted")
	}
	if _, err := open(store.Config{Ranking: store.Explicit, Rank: 5, WorldSize: 4}); !errors.Is(err, store.ErrInvalidKey) {
		t.Fatalf("rank outside the world: %v", err)
	}
	_ = b.Close()
	var c store.Client
	deadline := time.Now().Add(20 * time.Second)
	for { // rank 3 is free once the store has seen b go
		var err error
		if c, err = open(store.Config{Ranking: store.Explicit, Rank: 3, WorldSize: 4}); err == nil || time.Now().After(deadline) {
			if err != nil {
				t.Fatalf("rank 3 not reusable: %v", err)
			}
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = c.Close()
}

func testAutoRanks(t *testing.T, open Opener) {
	const world = 5
	x := ctx(t)
	clients := make([]store.Client, world)
	ranks := make([]int, world)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := open(store.Config{Ranking: store.Auto, WorldSize: world})
			if err != nil {
				t.Error(err)
				return
			}
			clients[i], ranks[i] = c, c.Rank()
		}()
	}
	wg.Wait()
	for _, c := range clients {
		if c != nil {
			t.Cleanup(func() { _ = c.Close() })
		}
	}
	if t.Failed() {
		return
	}
	sort.Ints(ranks)
	for i, r := range ranks {
		if r != i {
			t.Fatalf("auto ranks %v, want 0..%d", ranks, world-1)
		}
	}
	extra := MustOpen(t, open, store.Config{WorldSize: world})
	if _, err := extra.AssignRank(x); !errors.Is(err, store.ErrFailed) {
		t.Fatalf("AssignRank in a full world: %v", err)
	}
	var freed int
	for _, c := range clients {
		if c.Rank() == 2 {
			freed = c.Rank()
			_ = c.Close()
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		r, err := extra.AssignRank(x)
		if err == nil {
			if r != freed {
				t.Fatalf("got rank %d, want the dead client's %d", r, freed)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dead rank never reused: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r, _ := extra.AssignRank(x); r != freed || extra.Rank() != freed {
		t.Fatalf("AssignRank twice gave %d", r)
	}
}

func testRankDown(t *testing.T, open Opener) {
	obs := MustOpen(t, open, store.Config{WorldSize: 3})
	downs := make(chan int, 8)
	cancel := obs.WatchRankDown(func(r int) { downs <- r })
	defer cancel()
	a := MustOpen(t, open, store.Config{Ranking: store.Explicit, Rank: 1, WorldSize: 3})
	plain := MustOpen(t, open, store.Config{WorldSize: 3})
	_ = plain.Close() // unranked: no event
	_ = a.Close()
	select {
	case r := <-downs:
		if r != 1 {
			t.Fatalf("rank down %d, want 1", r)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no rank-down event")
	}
	select {
	case r := <-downs:
		t.Fatalf("extra rank-down event %d", r)
	case <-time.After(200 * time.Millisecond):
	}
}

// RankLive says whether a live client holds a rank: yes while it does, no before and after.
func testRankLive(t *testing.T, open Opener) {
	obs := MustOpen(t, open, store.Config{WorldSize: 3})
	live := func(r int) bool {
		t.Helper()
		ok, err := obs.RankLive(ctx(t), r)
		if err != nil {
			t.Fatalf("RankLive(%d): %v", r, err)
		}
		return ok
	}
	if live(1) {
		t.Fatal("rank 1 live before any client took it")
	}
	a := MustOpen(t, open, store.Config{Ranking: store.Explicit, Rank: 1, WorldSize: 3})
	if !live(1) || live(2) {
		t.Fatalf("with rank 1 held: RankLive(1) = %v, RankLive(2) = %v; want true, false", live(1), live(2))
	}
	_ = a.Close()
	for deadline := time.Now().Add(20 * time.Second); live(1); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("rank 1 still live 20 s after its client closed")
		}
	}
	b := MustOpen(t, open, store.Config{Ranking: store.Explicit, Rank: 1, WorldSize: 3})
	if !live(1) {
		t.Fatal("rank 1 not live once a new client took it")
	}
	_ = b
}

func testRankByName(t *testing.T, open Opener) {
	c := MustOpen(t, open, store.Config{})
	d := MustOpen(t, open, store.Config{})
	x := ctx(t)
	names := []string{"10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"}
	var mu sync.Mutex
	got := map[string]map[int]bool{}
	var wg sync.WaitGroup
	for _, cl := range []store.Client{c, d, c, d} {
		for _, n := range names {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := store.RankByName(x, cl, n, 8)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if got[n] == nil {
					got[n] = map[int]bool{}
				}
				got[n][r] = true
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	used := map[int]bool{}
	for n, rs := range got {
		if len(rs) != 1 {
			t.Fatalf("name %s got ranks %v", n, rs)
		}
		for r := range rs {
			if used[r] {
				t.Fatalf("rank %d given to two names", r)
			}
			used[r] = true
		}
	}
	if r, err := store.RankByName(x, d, names[1], 8); err != nil || !used[r] {
		t.Fatalf("again: %d %v", r, err)
	}
}

func testManyClients(t *testing.T, open Opener) {
	const n = 16
	x := ctx(t)
	c := MustOpen(t, open, store.Config{}) // open throughout: the job's state lives as long as a client
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := open(store.Config{})
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			for j := range 20 {
				if _, err := c.Add(x, "count", 1); err != nil {
					t.Error(err)
					return
				}
				k := fmt.Sprintf("c%d/%d", i, j)
				if err := c.Set(x, k, []byte(k)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if got, err := c.Add(x, "count", 0); err != nil || got != n*20 {
		t.Fatalf("count = %d, %v", got, err)
	}
	if v, err := c.Get(x, "c7/19", 0); err != nil || string(v) != "c7/19" {
		t.Fatalf("c7/19 = %q, %v", v, err)
	}
}
