package trans

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/coord/store/storetest"
	"github.com/hmc-go/hmc/internal/childtest"
	"github.com/hmc-go/hmc/internal/etcdtest"
	"github.com/hmc-go/hmc/internal/netnstest"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

func TestMain(m *testing.M) {
	storetest.ServeIfChild()
	switch os.Getenv("HMC_TRANS_CHILD") {
	case "":
	case "devtarget":
		os.Exit(devChild())
	default:
		os.Exit(child())
	}
	goleak.VerifyTestMain(m)
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

type target struct {
	cmd  *exec.Cmd
	id   string
	addr uint64
}

// spawn starts this test binary as a child (HMC_TRANS_CHILD and the rest in env) and returns
// it with its READY line; a child that says FAIL, or nothing within 30 s, fails the test.
func spawn(t *testing.T, env ...string) (*exec.Cmd, string) {
	t.Helper()
	return spawnCmd(t, exec.Command(os.Args[0], "-test.run=^$"), env...)
}

// spawnCmd is spawn of cmd, this test binary run some way (in a network namespace).
func spawnCmd(t *testing.T, cmd *exec.Cmd, env ...string) (*exec.Cmd, string) {
	t.Helper()
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(out)
	ready := make(chan string, 1)
	go func() { // ends when the child's stdout closes
		for sc.Scan() {
			if l := sc.Text(); strings.HasPrefix(l, "READY") || strings.HasPrefix(l, "FAIL") {
				select {
				case ready <- l:
				default:
				}
			}
		}
	}()
	select {
	case l := <-ready:
		if !strings.HasPrefix(l, "READY") {
			t.Fatalf("child %v said %q", env, l)
		}
		return cmd, l
	case <-time.After(30 * time.Second):
		t.Fatalf("child %v did not start", env)
	}
	return nil, ""
}

// spawnTarget starts a target process named id (port 0: any) on metadata meta.
func spawnTarget(t *testing.T, id, meta string) *target {
	t.Helper()
	cmd, l := spawn(t, "HMC_TRANS_CHILD=target", "HMC_TRANS_ID="+id, "HMC_TRANS_META="+meta)
	tg := &target{cmd: cmd}
	if _, err := fmt.Sscanf(l, "READY %s %d", &tg.id, &tg.addr); err != nil {
		t.Fatalf("target said %q", l)
	}
	return tg
}

// freeID is an id (an address) for a target process to serve on.
func freeID(t *testing.T) string { return childtest.FreeAddr(t) }

func initiator(t *testing.T, meta string, kinds ...transport.ConnType) *Engine {
	t.Helper()
	return initiatorAt(t, meta, "127.0.0.1:0", kinds...)
}

// initiatorAt is initiator with its own id (the address it serves on).
func initiatorAt(t *testing.T, meta, id string, kinds ...transport.ConnType) *Engine {
	t.Helper()
	cfg := DefaultConfig()
	if kinds != nil {
		cfg.Kinds = kinds
	}
	cfg.UniqueID = id
	e, err := Create(testCtx(t), meta, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Error(err)
		}
	})
	return e
}

// waitNotify waits for a notification whose message starts with prefix.
func waitNotify(t *testing.T, e *Engine, prefix string) Notify {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		for _, n := range e.Notifies() {
			if strings.HasPrefix(n.Msg, prefix) {
				return n
			}
			if strings.HasPrefix(n.Msg, "bad") {
				t.Fatalf("target: %s", n.Msg)
			}
		}
		time.Sleep(50 * time.Microsecond)
	}
	t.Fatalf("no %q notification", prefix)
	return Notify{}
}

// Mooncake's tcp_write_visibility scenario: 400 writes, each followed by its notification; the
// target checks every byte of each before the next (a torn or early-completed write shows),
// over TCP and over shared memory; a write to memory the target did not register fails.
func TestWriteVisibility(t *testing.T) {
	for _, k := range []transport.ConnType{transport.TCP, transport.SHM} {
		t.Run(k.String(), func(t *testing.T) {
			tg := spawnTarget(t, "127.0.0.1:0", P2P)
			e := initiator(t, P2P, k)
			ctx := testCtx(t)
			const n = 1 << 20
			src := make([]byte, n)
			if err := e.Register(memory.AddrOf(src), n); err != nil {
				t.Fatal(err)
			}
			for i := range 400 {
				for j := range src {
					src[j] = iterByte(i, j)
				}
				note := &Notify{Msg: fmt.Sprintf("check %d %d", i, n)}
				if err := e.Transfer(ctx, tg.id, []Request{{Op: Write, Local: memory.AddrOf(src), Remote: tg.addr, Size: n}}, note); err != nil {
					t.Fatalf("iteration %d: %v", i, err)
				}
				waitNotify(t, e, fmt.Sprintf("ok %d", i))
			}
			if err := e.Write(ctx, tg.id, memory.AddrOf(src), tg.addr+childSize, 8); !errors.Is(err, status.ErrNotFound) && !errors.Is(err, status.ErrOutOfRange) {
				t.Fatalf("write past the registered memory: %v", err)
			}
			if err := e.Write(ctx, tg.id, memory.AddrOf(src), tg.addr+childSize-4, 8); !errors.Is(err, status.ErrOutOfRange) {
				t.Fatalf("write across the registered memory's end: %v", err)
			}
			// Read back and check the last iteration.
			back := make([]byte, n)
			if err := e.Read(ctx, tg.id, memory.AddrOf(back), tg.addr, n); err != nil {
				t.Fatal(err)
			}
			for j := range back {
				if back[j] != iterByte(399, j) {
					t.Fatalf("read back: byte %d", j)
				}
			}
		})
	}
}

// NIXL's reconnect scenario: a transfer succeeds, the target is killed, transfers fail with a
// typed error, the target restarts under the same id, and transfers succeed again, without
// restarting the initiator; with the embedded store, which also drops the dead peer at once.
func TestReconnect(t *testing.T) {
	for _, meta := range []string{P2P, "store"} {
		t.Run(meta, func(t *testing.T) {
			if meta == "store" {
				srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{})
				if err != nil {
					t.Fatal(err)
				}
				defer srv.Close()
				meta = srv.URL()
			}
			id := freeID(t)
			tg := spawnTarget(t, id, meta)
			e := initiator(t, meta)
			ctx := testCtx(t)
			src := []byte("before and after the restart")
			if err := e.Write(ctx, id, memory.AddrOf(src), tg.addr, uint64(len(src))); err != nil {
				t.Fatal(err)
			}
			_ = tg.cmd.Process.Kill()
			_ = tg.cmd.Wait()
			start := time.Now()
			var err error
			for time.Since(start) < 20*time.Second {
				if err = e.Write(ctx, id, memory.AddrOf(src), tg.addr, uint64(len(src))); err != nil {
					break
				}
				time.Sleep(time.Millisecond)
			}
			// The link's end or, with the store, the store's word that the rank is gone
			// (whichever reaches the engine first; a rank-down event removes the peer).
			gone := errors.Is(err, status.ErrPeerClosed) || errors.Is(err, status.ErrClosed) ||
				(meta != P2P && errors.Is(err, status.ErrNotFound))
			if !gone {
				t.Fatalf("write to the dead target: %v, want ErrPeerClosed", err)
			}
			t.Logf("dead target: failed after %v: %v", time.Since(start), err)
			tg = spawnTarget(t, id, meta)
			if err := e.Write(ctx, id, memory.AddrOf(src), tg.addr, uint64(len(src))); err != nil {
				t.Fatalf("write to the restarted target: %v", err)
			}
			back := make([]byte, len(src))
			if err := e.Read(ctx, id, memory.AddrOf(back), tg.addr, uint64(len(back))); err != nil || string(back) != string(src) {
				t.Fatalf("read from the restarted target: %q %v", back, err)
			}
		})
	}
}

// Batches, paged descriptors, async submission with status, notifications, registration in
// bulk (1,000 buffers, usable by the peer at once), Malloc, a real Deregister, and bad input.
func TestBatchesAndRegistration(t *testing.T) {
	tg := spawnTarget(t, "127.0.0.1:0", P2P)
	e := initiator(t, P2P, transport.TCP)
	ctx := testCtx(t)
	// Batch write of 64 blocks of 64 KiB, every other one contiguous (merged), read back.
	const blk = 64 << 10
	src := make([]byte, 64*blk)
	for i := range src {
		src[i] = byte(i*31 + i>>16)
	}
	var locals, remotes, sizes []uint64
	for i := range 64 {
		locals = append(locals, memory.AddrOf(src)+uint64(i)*blk)
		remotes = append(remotes, tg.addr+uint64(i)*blk+uint64(i/2)*4096) // pairs contiguous
		sizes = append(sizes, blk)
	}
	if err := e.BatchWrite(ctx, tg.id, locals, remotes, sizes); err != nil {
		t.Fatal(err)
	}
	back := make([]byte, len(src))
	var blocals []uint64
	for i := range 64 {
		blocals = append(blocals, memory.AddrOf(back)+uint64(i)*blk)
	}
	if err := e.BatchRead(ctx, tg.id, blocals, remotes, sizes); err != nil {
		t.Fatal(err)
	}
	if string(back) != string(src) {
		t.Fatal("batch write then batch read differ")
	}
	// Paged: blocks 5, 6, 7 and 2 of the local layout to remote blocks 10, 11, 12 and 0.
	pg := Paged{Op: Write, LocalBase: memory.AddrOf(src), RemoteBase: tg.addr + 4<<20, BlockSize: blk,
		LocalBlocks: []uint32{5, 6, 7, 2}, RemoteBlocks: []uint32{10, 11, 12, 0}}
	if rs, _ := pg.Requests(); len(mergeInto(nil, rs)) != 2 {
		t.Fatalf("paged runs not merged: %d requests", len(mergeInto(nil, rs)))
	}
	if err := e.TransferPaged(ctx, tg.id, pg, &Notify{Msg: "paged done"}); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, blk)
	if err := e.Read(ctx, tg.id, memory.AddrOf(got), tg.addr+4<<20+11*blk, blk); err != nil {
		t.Fatal(err)
	}
	if string(got) != string(src[6*blk:7*blk]) {
		t.Fatal("paged block 6 -> 11")
	}
	// Async: Submit, poll Status, Wait.
	b, err := e.Submit(ctx, tg.id, []Request{{Op: Write, Local: memory.AddrOf(src), Remote: tg.addr, Size: uint64(len(src))}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for b.Status() == Pending {
		time.Sleep(10 * time.Microsecond)
	}
	if b.Status() != Completed || b.Wait(ctx) != nil {
		t.Fatalf("async batch: %v %v", b.Status(), b.Wait(ctx))
	}
	// A failing async batch reads Failed, with the target's refusal.
	b, err = e.Submit(ctx, tg.id, []Request{{Op: Write, Local: memory.AddrOf(src), Remote: 4096, Size: 8}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Wait(ctx); !errors.Is(err, status.ErrNotFound) || b.Status() != Failed {
		t.Fatalf("write to an unregistered address: %v, status %v", err, b.Status())
	}
	// Registration: 1,000 buffers in one batch, the last usable by the peer at once.
	bufs := make([][]byte, 1000)
	var list []Buffer
	for i := range bufs {
		// Separate allocations, each registered with a gap at both ends: two that the
		// allocator placed back to back must not become one coalesced region spanning both
		// (checkptr refuses such a slice under -race).
		bufs[i] = make([]byte, 4096+i+64)
		bufs[i][32] = byte(i)
		list = append(list, Buffer{Addr: memory.AddrOf(bufs[i][32:]), Size: uint64(4096 + i)})
	}
	start := time.Now()
	if err := e.BatchRegister(list); err != nil {
		t.Fatal(err)
	}
	if err := e.SendNotify(ctx, tg.id, Notify{Msg: fmt.Sprintf("pull %d %d", list[999].Addr, list[999].Size)}); err != nil {
		t.Fatal(err)
	}
	if n := waitNotify(t, e, "pulled"); n.Msg != "pulled ok" {
		t.Fatalf("the peer could not read a buffer just registered: %s", n.Msg)
	}
	t.Logf("1,000 buffers registered and one read by the peer in %v", time.Since(start))
	// Deregister is real: the peer's read now fails.
	if err := e.Deregister(ctx, list[999].Addr); err != nil {
		t.Fatal(err)
	}
	if err := e.SendNotify(ctx, tg.id, Notify{Msg: fmt.Sprintf("pull %d %d", list[999].Addr, list[999].Size)}); err != nil {
		t.Fatal(err)
	}
	if n := waitNotify(t, e, "pulled"); n.Msg == "pulled ok" {
		t.Fatal("the peer read memory after Deregister")
	}
	if err := e.Deregister(ctx, list[999].Addr); !errors.Is(err, status.ErrNotFound) {
		t.Fatalf("second Deregister: %v", err)
	}
	// Coalescing: overlapping and adjacent ranges become one registration.
	big := make([]byte, 3*4096)
	if err := e.BatchRegister([]Buffer{{Addr: memory.AddrOf(big), Size: 4096}, {Addr: memory.AddrOf(big) + 2048, Size: 4096}, {Addr: memory.AddrOf(big) + 6144, Size: 6144}}); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, b := range e.Buffers() {
		if b.Addr == memory.AddrOf(big) && b.Size == uint64(len(big)) {
			found = true
		}
	}
	if !found {
		t.Fatal("batch registration did not coalesce")
	}
	pb, err := e.PeerBuffers(ctx, tg.id)
	if err != nil || len(pb) != 1 || pb[0].Addr != tg.addr || pb[0].Size != childSize {
		t.Fatalf("peer buffers: %v %v", pb, err)
	}
	// Malloc and Free.
	m, err := e.Malloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Free(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := e.Free(ctx, m); !errors.Is(err, status.ErrNotFound) {
		t.Fatalf("double Free: %v", err)
	}
	// Bad input.
	for name, err := range map[string]error{
		"zero size":   e.Write(ctx, tg.id, memory.AddrOf(src), tg.addr, 0),
		"null local":  e.Write(ctx, tg.id, 0, tg.addr, 8),
		"bad peer id": e.Write(ctx, "nohost", memory.AddrOf(src), tg.addr, 8),
		"lengths":     e.BatchWrite(ctx, tg.id, locals, remotes[:3], sizes),
		"paged":       e.TransferPaged(ctx, tg.id, Paged{BlockSize: 0, LocalBlocks: []uint32{1}, RemoteBlocks: []uint32{1}}, nil),
		"register 0":  e.Register(0, 8),
	} {
		if !errors.Is(err, status.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := Create(ctx, P2P, Config{UniqueID: "localhost:1"}); !errors.Is(err, status.ErrInvalidConfig) {
		t.Errorf("a host name as unique id: %v", err)
	}
	rc := DefaultConfig()
	rc.Role, rc.UniqueID = Receiver, "[::1]:0"
	r, err := Create(ctx, P2P, rc)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := r.Write(ctx, tg.id, memory.AddrOf(src), tg.addr, 8); !errors.Is(err, status.ErrInvalidConfig) {
		t.Errorf("a receiver initiating: %v", err)
	}
	// The engine holds addresses, as its callers' memory: the Go buffers registered above
	// must outlive their registrations, which end when the engine closes in t.Cleanup (the
	// collector had freed some mid-BatchRegister: checkptr caught a registration of an
	// unallocated span under -race).
	registered = append(registered, big)
	registered = append(registered, bufs...)
}

// registered keeps Go buffers that tests registered with an engine alive until the process
// ends.
var registered [][]byte

// A target process with a secret serves an engine holding it, over TCP and shared memory, and
// refuses one with another secret or none (ErrPermission) at the data link and at the request
// socket that carries notifications (that no byte lands is the transports' RunAuth).
func TestSecret(t *testing.T) {
	t.Setenv("HMC_TRANS_SECRET", "kv-cache job")
	tg := spawnTarget(t, "127.0.0.1:0", P2P)
	for _, k := range []transport.ConnType{transport.TCP, transport.SHM} {
		t.Run(k.String(), func(t *testing.T) {
			ctx := testCtx(t)
			src := make([]byte, 4096)
			for i := range src {
				src[i] = iterByte(7, i)
			}
			for name, secret := range map[string][]byte{"another secret": []byte("guess"), "none": nil} {
				cfg := DefaultConfig()
				cfg.Kinds, cfg.Secret, cfg.UniqueID = []transport.ConnType{k}, secret, "127.0.0.1:0"
				e, err := Create(ctx, P2P, cfg)
				if err != nil {
					t.Fatal(err)
				}
				if err := e.Register(memory.AddrOf(src), uint64(len(src))); err != nil {
					t.Fatal(err)
				}
				if err := e.Write(ctx, tg.id, memory.AddrOf(src), tg.addr, uint64(len(src))); !errors.Is(err, status.ErrPermission) {
					t.Fatalf("%s: write: %v, want ErrPermission", name, err)
				}
				if err := e.SendNotify(ctx, tg.id, Notify{Msg: "check 7 4096"}); !errors.Is(err, status.ErrPermission) {
					t.Fatalf("%s: notify: %v, want ErrPermission", name, err)
				}
				if err := e.Close(); err != nil {
					t.Fatal(err)
				}
			}
			cfg := DefaultConfig()
			cfg.Kinds, cfg.Secret, cfg.UniqueID = []transport.ConnType{k}, []byte("kv-cache job"), "127.0.0.1:0"
			e, err := Create(ctx, P2P, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			if err := e.Register(memory.AddrOf(src), uint64(len(src))); err != nil {
				t.Fatal(err)
			}
			// With the secret, the write lands and the target checks it byte for byte.
			note := &Notify{Msg: "check 7 4096"}
			if err := e.Transfer(ctx, tg.id, []Request{{Op: Write, Local: memory.AddrOf(src), Remote: tg.addr, Size: 4096}}, note); err != nil {
				t.Fatal(err)
			}
			waitNotify(t, e, "ok 7")
		})
	}
}

// batcher returns a function that writes batch i (two halves of n bytes of iteration i's
// pattern) from e to target tg and waits for the target's check of every byte.
func batcher(t *testing.T, ctx context.Context, e *Engine, tg *target, n int) func(i int) {
	src := make([]byte, n)
	if err := e.Register(memory.AddrOf(src), uint64(n)); err != nil {
		t.Fatal(err)
	}
	return func(i int) {
		t.Helper()
		for j := range src {
			src[j] = iterByte(i, j)
		}
		bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		h := uint64(n / 2)
		reqs := []Request{{Op: Write, Local: memory.AddrOf(src), Remote: tg.addr, Size: h},
			{Op: Write, Local: memory.AddrOf(src) + h, Remote: tg.addr + h, Size: uint64(n) - h}}
		if err := e.Transfer(bctx, tg.id, reqs, &Notify{Msg: fmt.Sprintf("check %d %d", i, n)}); err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
		waitNotify(t, e, fmt.Sprintf("ok %d", i))
	}
}

// The store (the metadata server, its own process) killed with SIGKILL while batches run: the
// data plane does not need it (engines reach each other by id), so batches to a known peer
// keep completing, every one checked by the target, and a target started before the kill but
// not yet reached is reached after it; what does need the store, listing the peers, fails
// promptly with a typed error, as does a write to an id where nothing listens.
func TestStoreKilledMidBatch(t *testing.T) {
	kv := storetest.SpawnServer(t, 0)
	url := kv.URL
	tg := spawnTarget(t, "127.0.0.1:0", url)
	other := spawnTarget(t, "127.0.0.1:0", url)
	e := initiator(t, url, transport.TCP)
	ctx := testCtx(t)
	batch := batcher(t, ctx, e, tg, 256<<10)
	batch(0)
	done := make(chan struct{})
	go func() { // kill -9 of the store in the middle of the batches below
		time.Sleep(20 * time.Millisecond)
		kv.Kill()
		close(done)
	}()
	for i := 1; i < 200; i++ {
		batch(i)
	}
	<-done
	for i := 200; i < 220; i++ { // and well after its death
		batch(i)
	}
	batcher(t, ctx, e, other, 64<<10)(1000)
	within := func(what string, want error, op func(ctx context.Context) error) {
		t.Helper()
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		start := time.Now()
		err := op(lctx)
		if !errors.Is(err, want) || time.Since(start) > 6*time.Second {
			t.Fatalf("%s without the store: %v after %v, want %v", what, err, time.Since(start), want)
		}
		t.Logf("%s without the store: %v", what, err)
	}
	within("listing the peers", store.ErrIO, func(ctx context.Context) error { _, err := e.Peers(ctx); return err })
	src := make([]byte, 8)
	if err := e.Register(memory.AddrOf(src), 8); err != nil {
		t.Fatal(err)
	}
	within("a write to an id where nothing listens", status.ErrPeerClosed, func(ctx context.Context) error {
		return e.Write(ctx, "127.0.0.1:1", memory.AddrOf(src), tg.addr, 8)
	})
}

// The leader of a 3-member etcd cluster, the metadata store, killed with SIGKILL while batches
// run: every batch to the known peer completes, checked by the target; the store goes on with
// the other two members, so a target that starts after the kill is found and written to.
func TestEtcdLeaderKilledMidBatch(t *testing.T) {
	cl := etcdtest.Start(t, 3)
	url := cl.URL("trans-leader")
	tg := spawnTarget(t, "127.0.0.1:0", url)
	e := initiator(t, url, transport.TCP)
	ctx := testCtx(t)
	batch := batcher(t, ctx, e, tg, 256<<10)
	batch(0)
	killed := make(chan string, 1)
	go func() {
		time.Sleep(20 * time.Millisecond)
		name, err := cl.KillLeader()
		if err != nil {
			t.Error(err)
		}
		killed <- name
	}()
	for i := 1; i < 200; i++ {
		batch(i)
	}
	name := <-killed
	for i := 200; i < 220; i++ {
		batch(i)
	}
	late := spawnTarget(t, "127.0.0.1:0", url) // its Create registers it through the other two
	batcher(t, ctx, e, late, 64<<10)(1000)
	peers, err := e.Peers(ctx)
	if err != nil || !slices.Contains(peers, late.id) {
		t.Fatalf("peers after the leader's death: %v %v, want %s among them", peers, err, late.id)
	}
	t.Logf("killed leader %s mid-batch; 220 batches, then a target registered and listed after it", name)
}

// tryBatch writes batch i (two halves of src, filled with iteration i's pattern) to the
// target's offset off within d, and waits for the target to say it checked every byte.
func tryBatch(ctx context.Context, e *Engine, tg *target, src []byte, i int, off uint64, d time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for j := range src {
		src[j] = iterByte(i, j)
	}
	n, h := uint64(len(src)), uint64(len(src)/2)
	reqs := []Request{{Op: Write, Local: memory.AddrOf(src), Remote: tg.addr + off, Size: h},
		{Op: Write, Local: memory.AddrOf(src) + h, Remote: tg.addr + off + h, Size: n - h}}
	if err := e.Transfer(ctx, tg.id, reqs, &Notify{Msg: fmt.Sprintf("check %d %d %d", i, n, off)}); err != nil {
		return fmt.Errorf("transfer: %w", err)
	}
	if err := awaitNotify(ctx, e, fmt.Sprintf("ok %d", i), fmt.Sprintf("bad %d ", i)); err != nil {
		return fmt.Errorf("the target's check: %w", err)
	}
	return nil
}

// awaitNotify waits for the notification good; one starting with bad is an error.
func awaitNotify(ctx context.Context, e *Engine, good, bad string) error {
	for {
		for _, n := range e.Notifies() {
			if n.Msg == good {
				return nil
			}
			if strings.HasPrefix(n.Msg, bad) {
				return fmt.Errorf("the target says %q", n.Msg)
			}
		}
		if err := ctx.Err(); err != nil {
			return status.FromContext(ctx)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// Link faults between an initiator and a target on another host (a network namespace) in the
// middle of batches, with peers reached directly (P2P) and through the store: with delay,
// jitter, loss and reordering every batch completes, checked byte for byte by the target; with
// the link down batches fail with a typed error within their deadline and nothing lands
// outside the range they write; after the heal batches to the same target complete again.
func TestLinkFaultsMidBatch(t *testing.T) {
	for _, meta := range []string{P2P, "store"} {
		t.Run(meta, func(t *testing.T) {
			ns := netnstest.New(t)
			if meta == "store" {
				srv, err := store.Listen("tcp://"+ns.HostIP+":0", store.ServerConfig{})
				if err != nil {
					t.Fatal(err)
				}
				defer srv.Close()
				meta = srv.URL()
			}
			cmd, l := spawnCmd(t, ns.Command(os.Args[0], "-test.run=^$"),
				"HMC_TRANS_CHILD=target", "HMC_TRANS_ID="+ns.NSIP+":0", "HMC_TRANS_META="+meta)
			tg := &target{cmd: cmd}
			if _, err := fmt.Sscanf(l, "READY %s %d", &tg.id, &tg.addr); err != nil {
				t.Fatalf("target said %q", l)
			}
			e := initiatorAt(t, meta, ns.HostIP+":0", transport.TCP)
			ctx := testCtx(t)
			src := make([]byte, 256<<10)
			if err := e.Register(memory.AddrOf(src), uint64(len(src))); err != nil {
				t.Fatal(err)
			}
			const cut = 2 << 20 // where the batches the partition cuts off write
			for i := range 5 {
				if err := tryBatch(ctx, e, tg, src, i, 0, 10*time.Second); err != nil {
					t.Fatalf("batch %d: %v", i, err)
				}
			}
			heal := ns.Impair(t, netnstest.Impairment{Delay: 2 * time.Millisecond, Jitter: 2 * time.Millisecond, Loss: 0.02, Reorder: 0.1})
			for i := 10; i < 30; i++ {
				if err := tryBatch(ctx, e, tg, src, i, 0, 20*time.Second); err != nil {
					t.Fatalf("batch %d with delay, loss and reordering: %v", i, err)
				}
			}
			heal()
			relink := ns.Partition(t)
			for i := 100; i < 103; i++ {
				const d = 500 * time.Millisecond
				start := time.Now()
				err := tryBatch(ctx, e, tg, src, i, cut, d)
				took := time.Since(start)
				if !errors.Is(err, status.ErrTimeout) && !errors.Is(err, status.ErrPeerClosed) {
					t.Fatalf("batch %d across the partition: %v, want ErrTimeout or ErrPeerClosed", i, err)
				}
				if took > d+time.Second {
					t.Fatalf("batch %d across the partition failed after %v", i, took)
				}
				t.Logf("batch %d across the partition: after %v: %v", i, took.Round(time.Millisecond), err)
			}
			time.Sleep(time.Second)
			relink()
			healed := time.Now()
			for i := 200; ; i++ { // the first ones may still meet the cut-off link
				err := tryBatch(ctx, e, tg, src, i, 0, 5*time.Second)
				if err == nil {
					t.Logf("batches complete again %v after the heal", time.Since(healed).Round(time.Millisecond))
					break
				}
				if time.Since(healed) > 30*time.Second {
					t.Fatalf("no batch completes 30 s after the heal: %v", err)
				}
				time.Sleep(10 * time.Millisecond)
			}
			for i := 300; i < 320; i++ {
				if err := tryBatch(ctx, e, tg, src, i, 0, 10*time.Second); err != nil {
					t.Fatalf("batch %d after the heal: %v", i, err)
				}
			}
			for _, g := range [][2]int{{cut - 4096, 4096}, {cut + len(src), 4096}} {
				if err := e.SendNotify(ctx, tg.id, Notify{Msg: fmt.Sprintf("zero %d %d", g[0], g[1])}); err != nil {
					t.Fatal(err)
				}
				if err := awaitNotify(ctx, e, "zero ok", "zero bad"); err != nil {
					t.Fatalf("bytes at %d beside the cut-off batches: %v", g[0], err)
				}
			}
		})
	}
}

// TestReregisterSameMemory: the peer reads a buffer, the buffer is deregistered and registered
// again (a pool's buffer per request), and the peer reads it again, over shared memory (the
// target caches the regions it mapped) and TCP, many times; each read works.
func TestReregisterSameMemory(t *testing.T) {
	tg := spawnTarget(t, "127.0.0.1:0", P2P)
	ctx := testCtx(t)
	for _, k := range []transport.ConnType{transport.SHM, transport.TCP} {
		t.Run(k.String(), func(t *testing.T) {
			e := initiator(t, P2P, k)
			mem := make([]byte, 8192+64)
			registered = append(registered, mem)
			addr, size := memory.AddrOf(mem[32:]), uint64(8192)
			for i := range 30 {
				if err := e.Register(addr, size); err != nil {
					t.Fatal(err)
				}
				if err := e.SendNotify(ctx, tg.id, Notify{Msg: fmt.Sprintf("pull %d %d", addr, size)}); err != nil {
					t.Fatal(err)
				}
				if n := waitNotify(t, e, "pulled"); n.Msg != "pulled ok" {
					t.Fatalf("cycle %d: the peer could not read the buffer registered again: %s", i, n.Msg)
				}
				if err := e.Deregister(ctx, addr); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestMixedBatch: one batch of writes and reads interleaved (a run of writes, then reads and
// writes alternating) moves every block its own way over TCP and shared memory, checked byte
// for byte in the target's memory and in the initiator's buffers; a batch with a bad request
// moves nothing and names that request.
func TestMixedBatch(t *testing.T) {
	tg := spawnTarget(t, "127.0.0.1:0", P2P)
	for _, k := range []transport.ConnType{transport.TCP, transport.SHM} {
		t.Run(k.String(), func(t *testing.T) {
			e := initiator(t, P2P, k)
			ctx := testCtx(t)
			const blk, n = 4096, 24
			src, dst, back := make([]byte, n*blk), make([]byte, n*blk), make([]byte, n*blk)
			remote := func(i int) uint64 { return tg.addr + uint64(2*i+1)*blk } // no two adjacent
			var all []Request                                                   // every block read back
			for i := range n {
				all = append(all, Request{Op: Read, Local: memory.AddrOf(back[i*blk:]), Remote: remote(i), Size: blk})
			}
			// Round 0 starts with a run of writes, round 1 (the batch reversed) with reads.
			for round := range 2 {
				for i := range src {
					src[i] = byte(i*7 + i>>12 + int(k) + 13*round)
				}
				clear(dst)
				// Seed the target with the blocks the batch reads: the even ones from 4.
				var seed []Request
				for i := 4; i < n; i += 2 {
					seed = append(seed, Request{Op: Write, Local: memory.AddrOf(src[i*blk:]), Remote: remote(i), Size: blk})
				}
				if err := e.Transfer(ctx, tg.id, seed, nil); err != nil {
					t.Fatal(err)
				}
				var reqs []Request
				for i := range n {
					q := Request{Op: Write, Local: memory.AddrOf(src[i*blk:]), Remote: remote(i), Size: blk}
					if i >= 4 && i%2 == 0 {
						q.Op, q.Local = Read, memory.AddrOf(dst[i*blk:])
					}
					reqs = append(reqs, q)
				}
				if round == 1 {
					slices.Reverse(reqs)
				}
				if err := e.Transfer(ctx, tg.id, reqs, nil); err != nil {
					t.Fatal(err)
				}
				if err := e.Transfer(ctx, tg.id, all, nil); err != nil {
					t.Fatal(err)
				}
				for i := range n {
					if b := src[i*blk : (i+1)*blk]; string(back[i*blk:(i+1)*blk]) != string(b) {
						t.Fatalf("round %d: the remote block of request %d differs", round, i)
					}
					if i >= 4 && i%2 == 0 && string(dst[i*blk:(i+1)*blk]) != string(src[i*blk:(i+1)*blk]) {
						t.Fatalf("round %d: request %d (a read) brought other bytes", round, i)
					}
				}
			}
			// Request 5 of this batch has an unknown direction: nothing moves.
			clear(back)
			bad := slices.Clone(all)
			bad[5].Op = 7
			if err := e.Transfer(ctx, tg.id, bad, nil); !errors.Is(err, status.ErrInvalidConfig) || !strings.Contains(err.Error(), "request 5 (op 7") {
				t.Fatalf("a batch with op 7: %v", err)
			}
			bad[5].Op, bad[5].Size = Read, ^uint64(0) // a range past the address space
			if err := e.Transfer(ctx, tg.id, bad, nil); !errors.Is(err, status.ErrInvalidConfig) || !strings.Contains(err.Error(), "request 5 ") {
				t.Fatalf("a batch with a range past the address space: %v", err)
			}
			if slices.ContainsFunc(back, func(b byte) bool { return b != 0 }) {
				t.Fatal("a refused batch moved bytes")
			}
		})
	}
}

// TestCheckMerges: check says a batch merges exactly where a request continues the one before
// it, as mergeInto would merge it.
func TestCheckMerges(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		var reqs []Request
		for range 1 + rng.IntN(6) {
			q := Request{Op: Opcode(rng.IntN(2)), Local: 4096 * (1 + rng.Uint64N(4)), Remote: 4096 * (1 + rng.Uint64N(4)), Size: 4096}
			reqs = append(reqs, q)
		}
		merges, err := check(reqs)
		if err != nil {
			t.Fatal(err)
		}
		if want := len(mergeInto(nil, reqs)) < len(reqs); merges != want {
			t.Fatalf("%v: check says merges %v, mergeInto %v", reqs, merges, want)
		}
	}
}
