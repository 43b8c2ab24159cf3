//go:build ucx && cgo

package ucx

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"
	"unsafe"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/internal/childtest"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/transporttest"
)

func ctx10(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func rmaPair(t *testing.T, cfg Config) (*transporttest.RMAPair, *endpoint) {
	t.Helper()
	p := transporttest.Options{New: func(t testing.TB) transport.Transport {
		tr, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return tr
	}}.NewRMAPair(t)
	return p, p.EP.(*endpoint)
}

// Over tcp a vector put of scattered blocks goes as PUTV active messages (a KV batch: 512
// blocks of 4 KiB in two regions, plus pieces too large for a PUTV, which go as puts), and
// lands byte for byte, and a vector get of them as GETVs reads them back; over shared memory,
// and with PiecewiseVectors, their pieces stay puts and gets. The 512 blocks make one PUTV,
// sent as a rendezvous that the target receives into place; 1,536 blocks make three, sent
// eagerly.
func TestVectorPutsAsActiveMessages(t *testing.T) {
	for _, c := range []struct {
		name   string
		cfg    Config
		am     bool
		blocks int
		rndv   bool
	}{
		{"tcp", Config{TLS: "tcp"}, true, 512, true},
		{"tcp-3-putvs", Config{TLS: "tcp"}, true, 1536, false},
		{"tcp-piecewise", Config{TLS: "tcp", PiecewiseVectors: true}, false, 512, false},
		{"shm", Config{TLS: "posix,cma,self"}, false, 512, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, e := rmaPair(t, c.cfg)
			if e.amVec != c.am {
				t.Fatalf("vector puts as active messages: %v, want %v", e.amVec, c.am)
			}
			const block = 4096
			blocks := c.blocks
			mems := [][]byte{make([]byte, 2*block*blocks), make([]byte, 2*block*blocks+(1<<20))}
			var regs []*buffer.Region
			for _, m := range mems {
				r, err := p.Table.Register(m)
				if err != nil {
					t.Fatal(err)
				}
				regs = append(regs, r)
			}
			src := make([]byte, block*blocks+600<<10)
			transporttest.Fill(src, 5)
			var srcs [][]byte
			var dsts []transport.Remote
			type at struct{ reg, off int }
			var where []at
			for i := range blocks {
				r := i % 2
				off := 2 * block * (blocks - 1 - i) // backwards, a hole after each
				srcs = append(srcs, src[i*block:(i+1)*block])
				dsts = append(dsts, transport.Remote{Key: regs[r].Key(), Addr: uint64(off)})
				where = append(where, at{r, off})
			}
			big := src[block*blocks:] // 600 KiB: a put of its own
			srcs, dsts = append(srcs, big), append(dsts, transport.Remote{Addr: regs[1].Addr() + uint64(2*block*blocks)})
			where = append(where, at{1, 2 * block * blocks})
			w := e.w
			before, beforeRndv := w.putvs.Load(), w.putvsRndv.Load()
			ctx := ctx10(t)
			op, err := e.WriteVAsync(ctx, srcs, dsts)
			if err != nil {
				t.Fatal(err)
			}
			if err := op.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			for i, a := range where {
				if !bytes.Equal(mems[a.reg][a.off:a.off+len(srcs[i])], srcs[i]) {
					t.Fatalf("piece %d (%d bytes at %d in region %d) differs", i, len(srcs[i]), a.off, a.reg)
				}
			}
			if n := w.putvs.Load() - before; (n > 0) != c.am {
				t.Fatalf("%d PUTVs applied, want them: %v", n, c.am)
			}
			if n := w.putvsRndv.Load() - beforeRndv; (n > 0) != c.rndv {
				t.Fatalf("%d PUTVs received as rendezvous, want them: %v", n, c.rndv)
			}
			gets := w.getvs.Load()
			readBack(ctx, t, e, srcs, dsts)
			n := w.getvs.Load() - gets
			if (n > 0) != c.am {
				t.Fatalf("%d GETVs answered, want them: %v", n, c.am)
			}
			if c.am && n < uint64(block*blocks/amGetChunk) { // 2 MiB of blocks: several GETVs, four in flight
				t.Fatalf("%d GETVs answered for %d bytes of blocks, want at least %d", n, block*blocks, block*blocks/amGetChunk)
			}
		})
	}
}

// readBack reads every piece of dsts back with one vector get and checks it against srcs.
func readBack(ctx context.Context, t *testing.T, e *endpoint, srcs [][]byte, dsts []transport.Remote) {
	t.Helper()
	back := make([][]byte, len(srcs))
	for i := range back {
		back[i] = make([]byte, len(srcs[i]))
	}
	op, err := e.ReadVAsync(ctx, back, dsts)
	if err == nil {
		err = op.Wait(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	for i := range back {
		if !bytes.Equal(back[i], srcs[i]) {
			t.Fatalf("piece %d read back differs", i)
		}
	}
}

// The target copies a PUTV only into memory the sender's link was granted, and answers a GETV
// only from it: an address outside every region it resolved, a token not its own, or a region
// deregistered since are refused whole (ErrNotFound); the memory keeps its bytes, and none of
// it is read back.
func TestPutvRefusesWhatWasNotGranted(t *testing.T) {
	p, e := rmaPair(t, Config{TLS: "tcp"})
	if !e.amVec {
		t.Fatal("tcp endpoint does not send PUTVs")
	}
	ctx := ctx10(t)
	mem := make([]byte, 1<<16)
	reg, err := p.Table.Register(mem)
	if err != nil {
		t.Fatal(err)
	}
	put := func(raddr uint64) error { // two pieces, the second at raddr, forged past the initiator's checks
		t.Helper()
		rt, err := e.targetOf(ctx, transport.Remote{Key: reg.Key()}, 8)
		if err != nil {
			t.Fatal(err)
		}
		op := e.rawVec(true, [][]byte{[]byte("granted!"), []byte("forged!!")}, []uint64{rt.addr, raddr})
		return op.Wait(ctx)
	}
	secret := make([]byte, 4096) // this process's memory, never registered
	copy(secret[2048:], "secret!!")
	if err := put(uint64(uintptr(unsafe.Pointer(&secret[0])))); !errors.Is(err, status.ErrNotFound) {
		t.Fatalf("a piece outside the granted regions: %v, want ErrNotFound", err)
	}
	// The same for reads: nothing of the secret comes back.
	rt, err := e.targetOf(ctx, transport.Remote{Key: reg.Key()}, 8)
	if err != nil {
		t.Fatal(err)
	}
	got := [][]byte{make([]byte, 8), make([]byte, 8)}
	op := e.rawVec(false, got, []uint64{rt.addr, uint64(uintptr(unsafe.Pointer(&secret[2048])))})
	if err := op.Wait(ctx); !errors.Is(err, status.ErrNotFound) || string(got[1]) == "secret!!" {
		t.Fatalf("a GETV of memory outside the granted regions: %v, read %q", err, got[1])
	}
	want := make([]byte, 4096)
	copy(want[2048:], "secret!!")
	if !bytes.Equal(secret, want) || !bytes.Equal(mem[:8], make([]byte, 8)) {
		t.Fatal("a refused PUTV wrote memory")
	}
	token := e.token
	e.token ^= 0x5a5a
	if err := put(reg.Addr() + 64); !errors.Is(err, status.ErrNotFound) {
		t.Fatalf("another link's token: %v, want ErrNotFound", err)
	}
	e.token = token
	if err := put(reg.Addr() + 64); err != nil || string(mem[64:72]) != "forged!!" {
		t.Fatalf("a PUTV into the granted region: %v, %q", err, mem[64:72])
	}
	other := make([]byte, 4096)
	oreg, err := p.Table.Register(other)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.targetOf(ctx, transport.Remote{Key: oreg.Key()}, 8); err != nil { // granted now
		t.Fatal(err)
	}
	addr := oreg.Addr()
	if err := p.Table.Deregister(ctx, oreg); err != nil {
		t.Fatal(err)
	}
	if err := put(addr); !errors.Is(err, status.ErrNotFound) || !bytes.Equal(other, make([]byte, 4096)) {
		t.Fatalf("a PUTV into a region deregistered since: %v", err)
	}
	_ = reg
}

// vectorTargetEnv makes this test binary a vector target (maybeVectorTarget): it serves a
// registered 8 MiB region over UCX's tcp, prints "READY addr key", and lives until killed.
const vectorTargetEnv = "HMC_UCX_TEST_VECTOR_TARGET"

func maybeVectorTarget() {
	if os.Getenv(vectorTargetEnv) == "" {
		return
	}
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "vector target:", err)
		os.Exit(1)
	}
	tr, err := New(Config{TLS: "tcp"})
	if err != nil {
		fail(err)
	}
	def, err := buffer.New(0, 4096, memory.CPU)
	if err != nil {
		fail(err)
	}
	table := buffer.NewTable()
	mem := make([]byte, 8<<20)
	reg, err := table.Register(mem)
	if err != nil {
		fail(err)
	}
	srv, err := tr.Listen(transport.ServerConfig{BindAddr: "127.0.0.1:0", Region: def, Regions: table})
	if err != nil {
		fail(err)
	}
	fmt.Printf("READY %s %d\n", srv.Addr(), reg.Key())
	select {}
}

// Two processes: a vector put of 512 scattered 4 KiB blocks goes as PUTVs to a target in
// another process and reads back byte for byte (its gets go piece by piece); once the target is
// killed (SIGKILL), a vector put fails with a typed error instead of waiting for an ACK that
// never comes.
func TestVectorPutTwoProcesses(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	_, lines := childtest.Start(t, cmd, 4, vectorTargetEnv+"=1", "UCX_TLS=tcp")
	var addr string
	var key buffer.Key
	if _, err := fmt.Sscanf(<-lines, "READY %s %d", &addr, &key); err != nil {
		t.Fatal(err)
	}
	tr, err := New(Config{TLS: "tcp"})
	if err != nil {
		t.Fatal(err)
	}
	local, err := buffer.New(0, 4096, memory.CPU)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { local.Close() })
	ctx := ctx10(t)
	ep, err := tr.Dial(ctx, transport.DialConfig{Addr: addr, Local: local, Rank: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ep.Close() })
	e := ep.(*endpoint)
	if !e.amVec {
		t.Fatal("the tcp endpoint does not send PUTVs")
	}
	const block, blocks = 4096, 512
	src := make([]byte, block*blocks)
	transporttest.Fill(src, 77)
	var srcs [][]byte
	var dsts []transport.Remote
	for i := range blocks {
		srcs = append(srcs, src[i*block:(i+1)*block])
		dsts = append(dsts, transport.Remote{Key: key, Addr: uint64(2 * block * (i ^ 1))})
	}
	op, err := e.WriteVAsync(ctx, srcs, dsts)
	if err == nil {
		err = op.Wait(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	readBack(ctx, t, e, srcs, dsts)
	// Killed with PUTVs in flight: their Op ends (done before the kill, or failed typed) well
	// before the context's deadline.
	var many [][]byte
	var far []transport.Remote
	for r := range 8 {
		for i := range blocks {
			many = append(many, srcs[i])
			far = append(far, transport.Remote{Key: key, Addr: uint64(r*block + 2*block*(i^1))})
		}
	}
	inflight, err := e.WriteVAsync(ctx, many, far)
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	start := time.Now()
	if err := inflight.Wait(ctx); err != nil && (status.CodeOf(err) == status.Success || errors.Is(err, context.DeadlineExceeded)) {
		t.Fatalf("PUTVs in flight at the kill: %v", err)
	} else {
		t.Logf("PUTVs in flight at the kill: %v after %v", err, time.Since(start).Round(time.Millisecond))
	}
	for i := 0; ; i++ { // until the endpoint learns the target is gone
		op, err := e.WriteVAsync(ctx, srcs, dsts)
		if err == nil {
			err = op.Wait(ctx)
		}
		if err != nil {
			if status.CodeOf(err) == status.Success || errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("vector put to a killed target: %v (untyped, or timed out)", err)
			}
			t.Logf("vector put %d after the kill: %v (%v)", i, err, time.Since(start).Round(time.Millisecond))
			break
		}
		if time.Since(start) > 5*time.Second {
			t.Fatal("vector puts to a killed target kept succeeding for 5 s")
		}
	}
}

// A region's deregistration waits for the rendezvous PUTVs still being received into it (a
// receive in flight is simulated in rxRegions): it returns only once the last one ends, and
// fails typed, the registration kept, if one outlasts its context.
func TestDeregisterWaitsForRendezvousReceive(t *testing.T) {
	p, e := rmaPair(t, Config{TLS: "tcp"})
	ctx := ctx10(t)
	w := e.w // the target's too: both ends share the transport
	for _, outlast := range []bool{false, true} {
		mem := make([]byte, 4096)
		reg, err := p.Table.Register(mem)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.targetOf(ctx, transport.Remote{Key: reg.Key()}, 8); err != nil { // granted, mapped
			t.Fatal(err)
		}
		w.call(func() { w.rxRegions[reg.Key()]++ })
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		done := make(chan error, 1)
		go func() { done <- p.Table.Deregister(dctx, reg) }()
		select {
		case err := <-done:
			t.Fatalf("deregistered with a receive into the region in flight: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
		if !outlast {
			w.call(func() { delete(w.rxRegions, reg.Key()) })
		}
		err = <-done
		cancel()
		if outlast {
			w.call(func() { delete(w.rxRegions, reg.Key()) })
			if !errors.Is(err, status.ErrTimeout) {
				t.Fatalf("a receive that outlasts the deregistration's context: %v, want ErrTimeout", err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}
