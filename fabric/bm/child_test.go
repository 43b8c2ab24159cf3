package bm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hmc-go/hmc/coord/store/storetest"
	"github.com/hmc-go/hmc/internal/childtest"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
)

const mib = 1 << 20

// pat is the byte rank r keeps at offset i of its slice.
func pat(r, i int) byte { return byte(r*31 + i*7 + i>>8) }

// tag is the byte rank q writes at offset i of rank t's slice.
func tag(q, t, i int) byte { return byte(q*13 + t*5 + i) }

func fill(p []byte, f func(i int) byte) {
	for i := range p {
		p[i] = f(i)
	}
}

func check(p []byte, f func(i int) byte) error {
	for i := range p {
		if p[i] != f(i) {
			return fmt.Errorf("byte %d is %d, want %d", i, p[i], f(i))
		}
	}
	return nil
}

// childOptions builds a rank's options from HMC_BM_OPS: tcp (TCP only), shm (shared memory
// and TCP), mixed (even ranks "fast" with both, odd ranks "slow" with TCP only).
func childOptions(rank int) Options {
	o := Options{LocalDRAM: 4 * mib, MaxDRAM: 8 * mib}
	if os.Getenv(memory.EmulateGPUEnv) == "1" {
		o.LocalHBM = 8 * mib
	}
	switch os.Getenv("HMC_BM_OPS") {
	case "tcp":
		o.DataOps = OpHostTCP
	case "shm":
		o.DataOps = OpHostSHM | OpHostTCP
	case "mixed":
		o.TagOpInfo = "fast:HOST_TCP:slow"
		if rank%2 == 0 {
			o.Tag, o.DataOps = "fast", OpHostSHM|OpHostTCP
		} else {
			o.Tag, o.DataOps = "slow", OpHostTCP
		}
	}
	return o
}

// shmPair says whether ranks a and b copy through shared memory under HMC_BM_OPS.
func shmPair(a, b int) bool {
	switch os.Getenv("HMC_BM_OPS") {
	case "shm":
		return true
	case "mixed":
		return a%2 == 0 && b%2 == 0
	}
	return false
}

// child is one rank in its own process: HMC_BM_CHILD=<mode>, HMC_STORE_URL, HMC_WORLD,
// HMC_BM_RANK (explicit rank; auto when absent).
func child(mode string) int {
	if err := runChild(mode); err != nil {
		fmt.Println("FAIL", err)
		fmt.Fprintln(os.Stderr, "bm child: FAIL", err) // seen even when the test reads another child
		childLog.dump(os.Stderr, "bm child "+os.Getenv("HMC_BM_RANK"))
		return 1
	}
	if os.Getenv("HMC_BM_CHILD_DUMP") == "1" {
		childLog.dump(os.Stderr, "bm child "+os.Getenv("HMC_BM_RANK"))
	}
	return 0
}

// childLog keeps a child's fabric log (debug level), printed when the child fails, or when it
// exits with HMC_BM_CHILD_DUMP=1.
var childLog logBuf

type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) dump(w io.Writer, who string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for line := range strings.Lines(l.b.String()) {
		fmt.Fprintf(w, "%s log: %s", who, line)
	}
}

func runChild(mode string) error {
	if os.Getenv(memory.EmulateGPUEnv) == "1" {
		memory.SetEmulateGPU(true)
	}
	url := os.Getenv("HMC_STORE_URL")
	world, _ := strconv.Atoi(os.Getenv("HMC_WORLD"))
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cfg := DefaultConfig()
	cfg.StartStore = false
	cfg.Logger = slog.New(slog.NewTextHandler(&childLog, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if r := os.Getenv("HMC_BM_RANK"); r != "" {
		cfg.AutoRanking = false
		cfg.Rank, _ = strconv.Atoi(r)
	}
	cfg.BindIP = os.Getenv("HMC_BM_BIND") // another network namespace's address (netns tests)
	if d, err := time.ParseDuration(os.Getenv("HMC_BM_CTL")); err == nil {
		cfg.ControlTimeout = d
	}
	cfg.World = world
	f, err := Init(ctx, url, cfg)
	if err != nil {
		return err
	}
	defer f.Close()
	me := f.Rank()
	b, err := f.Create(ctx, 7, childOptions(me))
	if err != nil {
		return err
	}
	fill(b.Local()[:mib], func(i int) byte { return pat(me, i) })
	if b.hbm != nil { // the same pattern in the HBM slice
		hbm, _ := b.PtrByMemType(Device, me)
		if err := b.Copy(ctx, memory.AddrOf(b.Local()), hbm, mib, H2G, 0); err != nil {
			return fmt.Errorf("H2G into own HBM: %w", err)
		}
	}
	if err := b.Join(ctx); err != nil {
		return err
	}
	if mode == "rejoiner" {
		// The victim restarted: joined is all it does (the survivors, who wait for it, may
		// have read it and exited before it sees them), and it stays until the parent kills
		// it: a survivor that has read it may exit while another has yet to.
		fmt.Println("JOINED", me)
		<-ctx.Done()
		return nil
	}
	switch mode {
	case "early", "never":
		return early(ctx, b, me, mode)
	case "late":
		if err := b.WaitMembers(ctx, world); err != nil {
			return err
		}
		if err := b.Barrier(ctx); err != nil { // after the early rank's write
			return err
		}
		if err := check(b.Local()[:64<<10], func(i int) byte { return tag(0, me, i) }); err != nil {
			return fmt.Errorf("the early rank's write: %w", err)
		}
		fmt.Println("CHECKED", me)
		return nil
	}
	if err := b.WaitMembers(ctx, world); err != nil {
		return err
	}
	switch mode {
	case "copies":
		return copies(ctx, b, me, world)
	case "victim":
		if err := b.Barrier(ctx); err != nil {
			return err
		}
		fmt.Println("READY", me)
		<-ctx.Done() // until killed
		return nil
	case "survivor":
		return survive(ctx, b, me, world)
	case "storekill":
		return outliveStore(ctx, b, me, world)
	case "partition":
		return outlivePartition(ctx, b, me, world)
	}
	return fmt.Errorf("unknown mode %q", mode)
}

// early writes into rank 1's slice before rank 1 has joined: the copy waits for the join and
// runs ("early"), or, when rank 1 never comes, fails at the control timeout saying so ("never").
func early(ctx context.Context, b *BigMemory, me int, mode string) error {
	dst, err := b.PtrByMemType(Host, 1)
	if err != nil {
		return err
	}
	w := make([]byte, 64<<10)
	fill(w, func(i int) byte { return tag(me, 1, i) })
	fmt.Println("WRITING", me)
	start := time.Now()
	err = b.Write(ctx, dst, w)
	took := time.Since(start)
	if mode == "never" {
		if err == nil || !errors.Is(err, status.ErrTimeout) || !strings.Contains(err.Error(), "rank 1 has not joined") {
			return fmt.Errorf("a write to a rank that never joins: %v, want 'rank 1 has not joined' (a timeout)", err)
		}
		fmt.Printf("NOTJOINED %.1f %v\n", took.Seconds(), err)
		return nil
	}
	if err != nil {
		return fmt.Errorf("a write issued before rank 1 joined: %w", err)
	}
	back := make([]byte, len(w))
	if err := b.Read(ctx, back, dst); err != nil {
		return err
	}
	if err := check(back, func(i int) byte { return tag(me, 1, i) }); err != nil {
		return fmt.Errorf("read back: %w", err)
	}
	fmt.Printf("WROTE %.1f\n", took.Seconds())
	return b.Barrier(ctx)
}

func copies(ctx context.Context, b *BigMemory, me, world int) error {
	if err := b.Barrier(ctx); err != nil {
		return err
	}
	host := func(r int) uint64 { p, _ := b.PtrByMemType(Host, r); return p }
	buf := make([]byte, mib)
	for t := range world {
		if t == me {
			continue
		}
		// G2H of every peer's pattern.
		if err := b.Read(ctx, buf, host(t)); err != nil {
			return fmt.Errorf("G2H from %d: %w", t, err)
		}
		if err := check(buf, func(i int) byte { return pat(t, i) }); err != nil {
			return fmt.Errorf("G2H from %d: %w", t, err)
		}
		// H2G into every peer's slice.
		w := make([]byte, 64<<10)
		fill(w, func(i int) byte { return tag(me, t, i) })
		if err := b.Write(ctx, host(t)+mib+uint64(me)*64<<10, w); err != nil {
			return fmt.Errorf("H2G to %d: %w", t, err)
		}
		// Co-located slices are plain memory at their GVAs.
		if shmPair(me, t) {
			if !b.mapped(t) {
				return fmt.Errorf("rank %d's slice is not mapped here", t)
			}
			if err := check(memory.HostSlice(memory.Ptr(host(t)), 4096), func(i int) byte { return pat(t, i) }); err != nil {
				return fmt.Errorf("load from rank %d's GVA: %w", t, err)
			}
		} else if b.mapped(t) {
			return fmt.Errorf("rank %d's slice is mapped, but the pair may not use shared memory", t)
		}
		// Out of range: past what the rank backs (inside the stride), across two slices.
		if err := b.Write(ctx, host(t)+4*mib-8, w[:16]); !errors.Is(err, status.ErrOutOfRange) {
			return fmt.Errorf("write past rank %d's local size: %v", t, err)
		}
		if t+1 < world {
			if err := b.Write(ctx, host(t)+8*mib-8, w[:16]); !errors.Is(err, status.ErrOutOfRange) {
				return fmt.Errorf("write across rank %d's slice end: %v", t, err)
			}
		}
	}
	if world >= 3 {
		// G2G between two other ranks: the source's owner copies.
		s, t := (me+1)%world, (me+2)%world
		if err := b.Copy(ctx, host(s), host(t)+2*mib+uint64(me)*64<<10, 64<<10, G2G, 0); err != nil {
			return fmt.Errorf("G2G %d -> %d: %w", s, t, err)
		}
	}
	// A batch of mixed directions, async: four contiguous 4 KiB H2G pieces (merged) to rank
	// me+3, and a G2H piece from rank me+1.
	t := (me + 3) % world
	w := make([]byte, 16<<10)
	fill(w, func(i int) byte { return tag(me, t, i) ^ 0x55 })
	in := make([]byte, 4096)
	var ps []CopyParams
	for k := range 4 {
		ps = append(ps, CopyParams{Src: memory.AddrOf(w) + uint64(k)*4096, Dst: host(t) + 3*mib + uint64(me)*16<<10 + uint64(k)*4096, Size: 4096})
	}
	from := (me + 1) % world
	ps = append(ps, CopyParams{Src: host(from) + 4096, Dst: memory.AddrOf(in), Size: 4096})
	if err := b.CopyBatch(ctx, ps, Auto, FlagAsync); err != nil {
		return fmt.Errorf("batch: %w", err)
	}
	if err := b.Wait(ctx); err != nil {
		return fmt.Errorf("batch wait: %w", err)
	}
	if err := check(in, func(i int) byte { return pat(from, i+4096) }); err != nil {
		return fmt.Errorf("batch G2H from %d: %w", from, err)
	}
	if b.hbm != nil && world >= 2 {
		// G2G from another rank's HBM into this rank's DRAM slice: the HBM's owner copies.
		s := (me + 1) % world
		hbm, _ := b.PtrByMemType(Device, s)
		if err := b.Copy(ctx, hbm, host(me)+3*mib+512<<10, 64<<10, G2G, 0); err != nil {
			return fmt.Errorf("G2G from rank %d's HBM: %w", s, err)
		}
		if err := check(b.Local()[3*mib+512<<10:3*mib+576<<10], func(i int) byte { return pat(s, i) }); err != nil {
			return fmt.Errorf("G2G from rank %d's HBM: %w", s, err)
		}
	}
	if b.hbm != nil && world >= 2 {
		// H2G into and G2H out of another rank's HBM (staged here, copied by its owner).
		t := (me + 1) % world
		hbm, _ := b.PtrByMemType(Device, t)
		w := make([]byte, 5*mib+3) // more than one staging chunk
		fill(w, func(i int) byte { return tag(me, t, i) })
		if err := b.Copy(ctx, memory.AddrOf(w), hbm+mib+4096, uint64(len(w)), H2G, 0); err != nil {
			return fmt.Errorf("H2G into rank %d's HBM: %w", t, err)
		}
		r := make([]byte, len(w))
		if err := b.Copy(ctx, hbm+mib+4096, memory.AddrOf(r), uint64(len(r)), G2H, 0); err != nil {
			return fmt.Errorf("G2H from rank %d's HBM: %w", t, err)
		}
		if err := check(r, func(i int) byte { return tag(me, t, i) }); err != nil {
			return fmt.Errorf("H2G then G2H, rank %d's HBM: %w", t, err)
		}
		// L2G from this process's GPU memory into the peer's DRAM slice, G2L back.
		dev, err := b.f.device()
		if err != nil {
			return err
		}
		ld, err := dev.Alloc(128 << 10)
		if err != nil {
			return err
		}
		defer dev.Free(ld)
		if err := dev.CopyHostToDevice(ld.Ptr(), w[:128<<10]); err != nil {
			return err
		}
		dram := host(t) + 3*mib + 640<<10 + uint64(me)*8192
		if err := b.Copy(ctx, uint64(ld.Ptr()), dram, 8192, L2G, 0); err != nil {
			return fmt.Errorf("L2G into rank %d: %w", t, err)
		}
		if err := b.Copy(ctx, dram, uint64(ld.Ptr())+8192, 8192, G2L, 0); err != nil {
			return fmt.Errorf("G2L from rank %d: %w", t, err)
		}
		back := make([]byte, 16384)
		if err := dev.CopyDeviceToHost(back, ld.Ptr()); err != nil {
			return err
		}
		if err := check(back[8192:], func(i int) byte { return tag(me, t, i) }); err != nil {
			return fmt.Errorf("L2G then G2L through rank %d: %w", t, err)
		}
		big := make([]byte, 9*mib)
		if err := b.Copy(ctx, hbm, memory.AddrOf(big), uint64(len(big)), G2H, 0); !errors.Is(err, status.ErrOutOfRange) {
			return fmt.Errorf("G2H of 9 MiB from an 8 MiB HBM slice: %v", err)
		}
		if err := b.Copy(ctx, hbm, memory.AddrOf(big), mib, G2H, 0); err != nil {
			return fmt.Errorf("G2H 1 MiB from rank %d's HBM: %w", t, err)
		}
		if err := check(big[:mib], func(i int) byte { return pat(t, i) }); err != nil {
			return fmt.Errorf("G2H from rank %d's HBM: %w", t, err)
		}
	}
	if err := b.Barrier(ctx); err != nil {
		return err
	}
	// Everything the others wrote into this slice.
	for q := range world {
		if q == me {
			continue
		}
		if err := check(b.Local()[mib+q*64<<10:mib+(q+1)*64<<10], func(i int) byte { return tag(q, me, i) }); err != nil {
			return fmt.Errorf("H2G from %d: %w", q, err)
		}
		if world >= 3 && (q+2)%world == me {
			s := (q + 1) % world
			if err := check(b.Local()[2*mib+q*64<<10:2*mib+(q+1)*64<<10], func(i int) byte { return pat(s, i) }); err != nil {
				return fmt.Errorf("G2G by %d from %d: %w", q, s, err)
			}
		}
		if (q+3)%world == me {
			if err := check(b.Local()[3*mib+q*16<<10:3*mib+(q+1)*16<<10], func(i int) byte { return tag(q, me, i) ^ 0x55 }); err != nil {
				return fmt.Errorf("batch from %d: %w", q, err)
			}
		}
	}
	if err := b.Barrier(ctx); err != nil {
		return err
	}
	fmt.Println("OK", me)
	return b.Destroy(ctx)
}

// survive copies to the last rank until it dies (ErrRankDown expected), then waits for it to
// come back and copies again.
func survive(ctx context.Context, b *BigMemory, me, world int) error {
	if err := b.Barrier(ctx); err != nil {
		return err
	}
	fmt.Println("READY", me)
	victim := world - 1
	host := func(r int) uint64 { p, _ := b.PtrByMemType(Host, r); return p }
	w := make([]byte, 64<<10)
	start := time.Now()
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := b.Write(cctx, host(victim)+mib+uint64(me)*64<<10, w)
		cancel()
		if err == nil {
			if time.Since(start) > 60*time.Second {
				return errors.New("the victim never went down")
			}
			time.Sleep(time.Millisecond)
			continue
		}
		if !errors.Is(err, ErrRankDown) && !errors.Is(err, status.ErrPeerClosed) && !errors.Is(err, status.ErrClosed) {
			return fmt.Errorf("copy to the dead rank: %v, want ErrRankDown", err)
		}
		break
	}
	// Wait until the group has removed it, then until it is back.
	for deadline := time.Now().Add(30 * time.Second); ; {
		err := b.Write(ctx, host(victim), w[:8])
		if errors.Is(err, ErrRankDown) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("copies to the dead rank never fail with ErrRankDown (last: %v)", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println("DOWN", me)
	if err := b.WaitMembers(ctx, world); err != nil {
		return err
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		buf := make([]byte, 4096)
		err := b.Read(ctx, buf, host(victim))
		if err == nil {
			if err := check(buf, func(i int) byte { return pat(victim, i) }); err != nil {
				return fmt.Errorf("the rejoined rank's slice: %w", err)
			}
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the rejoined rank is not reachable: %w", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println("BACK", me)
	// Stay until the parent says: a survivor that left now could end the view of 3 before a
	// slower one sees it.
	select {
	case <-childtest.ParentSays():
	case <-ctx.Done():
	}
	return nil
}

// outliveStore copies to and from every other rank, checked, while the parent kills the store
// (it says so on stdin) and 50 rounds after; then a barrier, which needs the store, must fail
// with a typed error within its deadline (or succeed, with HMC_BM_STORE_SURVIVES=1: the parent
// killed one member of an etcd cluster). It exits when the parent says (the others may still
// be copying from it).
func outliveStore(ctx context.Context, b *BigMemory, me, world int) error {
	if err := b.Barrier(ctx); err != nil {
		return err
	}
	host := func(r int) uint64 { p, _ := b.PtrByMemType(Host, r); return p }
	w, r := make([]byte, 64<<10), make([]byte, 64<<10)
	round := func(k int) error {
		for t := range world {
			if t == me {
				continue
			}
			fill(w, func(i int) byte { return tag(me, t, i) ^ byte(k) })
			at := host(t) + mib + uint64(me)*64<<10
			if err := b.Write(ctx, at, w); err != nil {
				return fmt.Errorf("round %d: write to %d: %w", k, t, err)
			}
			if err := b.Read(ctx, r, at); err != nil {
				return fmt.Errorf("round %d: read from %d: %w", k, t, err)
			}
			if err := check(r, func(i int) byte { return tag(me, t, i) ^ byte(k) }); err != nil {
				return fmt.Errorf("round %d: read back from %d: %w", k, t, err)
			}
			if err := b.Read(ctx, r[:4096], host(t)); err != nil {
				return fmt.Errorf("round %d: read from %d: %w", k, t, err)
			}
			if err := check(r[:4096], func(i int) byte { return pat(t, i) }); err != nil {
				return fmt.Errorf("round %d: rank %d's pattern: %w", k, t, err)
			}
		}
		return nil
	}
	if err := round(0); err != nil {
		return err
	}
	fmt.Println("RUNNING", me)
	said := childtest.ParentSays()
	k := 1
	for during := true; during; k++ {
		select {
		case <-said: // killed
			during = false
		default:
		}
		if err := round(k); err != nil {
			return err
		}
	}
	for end := k + 50; k < end; k++ {
		if err := round(k); err != nil {
			return fmt.Errorf("after the store died: %w", err)
		}
	}
	// An etcd cluster that lost one member goes on; a killed store does not.
	outcome, err := storetest.AfterKill(ctx, os.Getenv("HMC_BM_STORE_SURVIVES") == "1", b.Barrier)
	if err != nil {
		return fmt.Errorf("a barrier %w", err)
	}
	fmt.Println("OK", me, k, "rounds; barrier:", outcome)
	select {
	case <-said: // exit
	case <-ctx.Done():
	}
	return nil
}

// outlivePartition copies to and from every other rank in rounds, checked, until the parent
// says exit, and prints ALL when a round reached every rank (first, and after PART) and PART
// when a copy failed. Only copies to or from the rank the parent cuts off (HMC_BM_CUT) may
// fail, with a typed error within their deadline; between the others nothing may fail.
func outlivePartition(ctx context.Context, b *BigMemory, me, world int) error {
	cut, _ := strconv.Atoi(os.Getenv("HMC_BM_CUT"))
	if err := b.Barrier(ctx); err != nil {
		return err
	}
	said := childtest.ParentSays()
	host := func(r int) uint64 { p, _ := b.PtrByMemType(Host, r); return p }
	w, r := make([]byte, 64<<10), make([]byte, 64<<10)
	state := ""
	for k := 0; ; k++ {
		select {
		case <-said:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		all := true
		for t := range world {
			if t == me {
				continue
			}
			fill(w, func(i int) byte { return tag(me, t, i) ^ byte(k) })
			at := host(t) + mib + uint64(me)*64<<10
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			start := time.Now()
			err := b.Write(cctx, at, w)
			if err == nil {
				err = b.Read(cctx, r, at)
			}
			cancel()
			if err == nil {
				if err := check(r, func(i int) byte { return tag(me, t, i) ^ byte(k) }); err != nil {
					return fmt.Errorf("round %d: read back from %d: %w", k, t, err)
				}
				continue
			}
			all = false
			if t != cut && me != cut {
				return fmt.Errorf("round %d: copy to %d, which nobody cut off: %w", k, t, err)
			}
			if took := time.Since(start); took > 2*time.Second {
				return fmt.Errorf("round %d: a copy with a 1 s deadline failed after %v", k, took)
			}
			// A timeout, the link or the member gone (ErrRankDown is an ErrPeerClosed), or, on
			// the cut-off rank, an endpoint it closed itself on finding it was dropped.
			if !errors.Is(err, status.ErrTimeout) && !errors.Is(err, status.ErrPeerClosed) && !errors.Is(err, status.ErrClosed) {
				return fmt.Errorf("round %d: copy to %d: %v, want a timeout, ErrRankDown, ErrPeerClosed or ErrClosed", k, t, err)
			}
			if state != "PART" {
				fmt.Println("PART", me, "copy to", t, err)
			}
			state = "PART"
		}
		if all && state != "ALL" {
			state = "ALL"
			fmt.Println("ALL", me, "round", k)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
