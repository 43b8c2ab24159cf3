package bm

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/coord/store/storetest"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport/transporttest"
)

func TestMain(m *testing.M) {
	storetest.ServeIfChild()
	if mode := os.Getenv("HMC_BM_CHILD"); mode != "" {
		os.Exit(child(mode))
	}
	goleak.VerifyTestMain(m)
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// single starts a one-rank world on its own store.
func single(t testing.TB, o Options) (*Fabric, *BigMemory) {
	t.Helper()
	ctx := testCtx(t)
	f, err := Init(ctx, "tcp://127.0.0.1:0", DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Error(err)
		}
	})
	b, err := f.Create(ctx, 3, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Join(ctx); err != nil {
		t.Fatal(err)
	}
	return f, b
}

func TestSingleRankLayoutAndLocalCopies(t *testing.T) {
	const mib = 1 << 20
	f, b := single(t, Options{LocalDRAM: 4 * mib, MaxDRAM: 8 * mib})
	ctx := testCtx(t)
	if f.Rank() != 0 || !f.Serving() {
		t.Fatalf("rank %d serving %v", f.Rank(), f.Serving())
	}
	base, err := b.PtrByMemType(Host, 0)
	if err != nil {
		t.Fatal(err)
	}
	if base < 40<<40 || base%(1<<30) != 0 {
		t.Fatalf("DRAM base %#x: not in the window or not aligned", base)
	}
	if memory.AddrOf(b.Local()) != base || len(b.Local()) != 4*mib {
		t.Fatalf("local slice at %#x (%d bytes), base %#x", memory.AddrOf(b.Local()), len(b.Local()), base)
	}
	if r, err := b.RankByGVA(base + 5*mib); err != nil || r != 0 {
		t.Fatalf("RankByGVA: %d %v", r, err)
	}
	if _, err := b.RankByGVA(base + 8*mib); !errors.Is(err, status.ErrOutOfRange) {
		t.Fatalf("RankByGVA past the space: %v", err)
	}
	if _, err := b.PtrByMemType(Device, 0); !errors.Is(err, status.ErrNotFound) {
		t.Fatalf("HBM of a DRAM-only object: %v", err)
	}
	if b.LocalMemSize(Host) != 4*mib || b.LocalMemSize(Device) != 0 {
		t.Fatal("LocalMemSize")
	}
	// H2G, then the local GVA dereferenced, then G2H.
	src := bytes.Repeat([]byte("bigmem!"), 10000)
	if err := b.Write(ctx, base+100, src); err != nil {
		t.Fatal(err)
	}
	direct := memory.HostSlice(memory.Ptr(base+100), uint64(len(src)))
	if !bytes.Equal(direct, src) {
		t.Fatal("the local GVA does not hold what H2G wrote")
	}
	got := make([]byte, len(src))
	if err := b.Copy(ctx, base+100, memory.AddrOf(got), uint64(len(got)), Auto, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, src) {
		t.Fatal("AUTO G2H")
	}
	// G2G within the slice, async, then Wait.
	if err := b.Copy(ctx, base+100, base+2*mib, uint64(len(src)), G2G, FlagAsync); err != nil {
		t.Fatal(err)
	}
	if err := b.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b.Local()[2*mib:2*mib+len(src)], src) {
		t.Fatal("async G2G")
	}
	if err := b.Wait(ctx); err != nil {
		t.Fatalf("Wait with nothing pending: %v", err)
	}
	// Overlapping source and destination (2 MiB, past the copier's glibc threshold): a move.
	ramp := b.Local()[:3*mib]
	for i := range ramp {
		ramp[i] = byte(i / 4096)
	}
	if err := b.Copy(ctx, base, base+4096, 2*mib, G2G, 0); err != nil {
		t.Fatal(err)
	}
	for i := 4096; i < 2*mib+4096; i++ {
		if ramp[i] != byte((i-4096)/4096) {
			t.Fatalf("overlapping G2G: byte %d is %d, want %d", i, ramp[i], byte((i-4096)/4096))
		}
	}
	// Bad input: every error typed, nothing moved.
	before := bytes.Clone(b.Local())
	bad := []struct {
		name     string
		src, dst uint64
		n        uint64
		t        CopyType
		want     error
	}{
		{"zero size", memory.AddrOf(got), base, 0, H2G, status.ErrInvalidConfig},
		{"null source", 0, base, 8, H2G, status.ErrInvalidConfig},
		{"past the local size", memory.AddrOf(got), base + 4*mib - 4, 8, H2G, status.ErrOutOfRange},
		{"past the stride", memory.AddrOf(got), base + 8*mib - 4, 8, H2G, status.ErrOutOfRange},
		{"not a GVA", memory.AddrOf(got), memory.AddrOf(got), 8, H2G, status.ErrOutOfRange},
		{"local to local", memory.AddrOf(got), memory.AddrOf(got) + 8, 8, Auto, status.ErrInvalidConfig},
		{"bad type", memory.AddrOf(got), base, 8, CopyType(42), status.ErrInvalidConfig},
		{"HBM type without HBM", memory.AddrOf(got), base, 8, L2G, status.ErrUnsupported},
	}
	for _, c := range bad {
		err := b.Copy(ctx, c.src, c.dst, c.n, c.t, 0)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if err := b.CopyBatch(ctx, []CopyParams{{memory.AddrOf(got), base, 8}, {memory.AddrOf(got), base + 9*mib, 8}}, H2G, 0); !errors.Is(err, status.ErrOutOfRange) {
		t.Errorf("batch with a bad element: %v", err)
	}
	if !bytes.Equal(before, b.Local()) {
		t.Fatal("a refused copy changed the slice")
	}
	// Registered user memory: same size again is fine, another size is not.
	user := make([]byte, 1<<16)
	if err := b.RegisterUserMem(memory.AddrOf(user), uint64(len(user))); err != nil {
		t.Fatal(err)
	}
	if err := b.RegisterUserMem(memory.AddrOf(user), uint64(len(user))); err != nil {
		t.Fatal(err)
	}
	if err := b.RegisterUserMem(memory.AddrOf(user), 100); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatal(err)
	}
	if err := b.RegisterUserMem(base, 4096); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatalf("registering a GVA: %v", err)
	}
	if err := b.UnregisterUserMem(ctx, memory.AddrOf(user)); err != nil {
		t.Fatal(err)
	}
	if err := b.UnregisterUserMem(ctx, 12345); err != nil {
		t.Fatalf("unknown address: %v", err)
	}
}

func TestHBMWithEmulatedGPU(t *testing.T) {
	transporttest.EmulateGPU(t)
	const mib = 1 << 20
	f, b := single(t, Options{LocalDRAM: 2 * mib, LocalHBM: 2 * mib})
	ctx := testCtx(t)
	dev, err := f.device()
	if err != nil {
		t.Fatal(err)
	}
	ld, err := dev.Alloc(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Free(ld)
	src := bytes.Repeat([]byte{0xa5, 0x5a, 1, 2}, 1<<14)
	if err := dev.CopyHostToDevice(ld.Ptr(), src); err != nil {
		t.Fatal(err)
	}
	hbm, _ := b.PtrByMemType(Device, 0)
	dram, _ := b.PtrByMemType(Host, 0)
	// L2G into HBM, G2G HBM -> DRAM, G2H back; L2GH and GH2L (upstream cannot).
	if err := b.Copy(ctx, uint64(ld.Ptr()), hbm+4096, 1<<16, L2G, 0); err != nil {
		t.Fatal(err)
	}
	if err := b.Copy(ctx, hbm+4096, dram+8192, 1<<16, G2G, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b.Local()[8192:8192+1<<16], src) {
		t.Fatal("L2G then G2G")
	}
	if err := b.Copy(ctx, uint64(ld.Ptr()), dram+1*mib, 1<<16, L2GH, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b.Local()[mib:mib+1<<16], src) {
		t.Fatal("L2GH")
	}
	if err := b.Copy(ctx, uint64(ld.Ptr()), hbm, 1<<16, L2GH, 0); !errors.Is(err, status.ErrOutOfRange) {
		t.Fatalf("L2GH into HBM: %v", err)
	}
	back := make([]byte, 1<<16)
	if err := dev.CopyHostToDevice(ld.Ptr(), make([]byte, 1<<16)); err != nil {
		t.Fatal(err)
	}
	if err := b.Copy(ctx, dram+1*mib, uint64(ld.Ptr()), 1<<16, GH2L, 0); err != nil {
		t.Fatal(err)
	}
	if err := dev.CopyDeviceToHost(back, ld.Ptr()); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back, src) {
		t.Fatal("GH2L")
	}
}

func TestInitAndCreateRejects(t *testing.T) {
	ctx := testCtx(t)
	for _, world := range []int{0, 1025} {
		cfg := DefaultConfig()
		cfg.World = world
		if _, err := Init(ctx, "tcp://127.0.0.1:0", cfg); !errors.Is(err, status.ErrInvalidConfig) {
			t.Errorf("world %d: %v", world, err)
		}
	}
	cfg := DefaultConfig()
	cfg.World, cfg.AutoRanking, cfg.Rank = 4, false, 4
	if _, err := Init(ctx, "tcp://127.0.0.1:0", cfg); !errors.Is(err, status.ErrInvalidConfig) {
		t.Errorf("rank 4 of 4: %v", err)
	}
	f, err := Init(ctx, "tcp://127.0.0.1:0", DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for name, c := range map[string]struct {
		id   int
		o    Options
		want error
	}{
		"id":          {255, Options{LocalDRAM: 2 << 20}, status.ErrInvalidConfig},
		"empty":       {1, Options{}, status.ErrInvalidConfig},
		"not 2 MiB":   {1, Options{LocalDRAM: 3 << 20}, status.ErrInvalidConfig},
		"max < local": {1, Options{LocalDRAM: 4 << 20, MaxDRAM: 2 << 20}, status.ErrInvalidConfig},
		"too big":     {1, Options{LocalDRAM: 4 << 40}, status.ErrInvalidConfig},
		"ascend only": {1, Options{LocalDRAM: 2 << 20, DataOps: OpSDMA}, status.ErrUnsupported},
		"tag":         {1, Options{LocalDRAM: 2 << 20, Tag: "no spaces"}, status.ErrInvalidConfig},
		"tag ops":     {1, Options{LocalDRAM: 2 << 20, TagOpInfo: "a:FLY:b"}, status.ErrInvalidConfig},
		"shm no fd":   {1, Options{LocalDRAM: 2 << 20, Flags: FlagCreateWithShm, DRAMShmFD: -1}, status.ErrInvalidConfig},
	} {
		if _, err := f.Create(ctx, c.id, c.o); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
	b, err := f.Create(ctx, 1, Options{LocalDRAM: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Create(ctx, 1, Options{LocalDRAM: 2 << 20}); !errors.Is(err, status.ErrInvalidConfig) {
		t.Errorf("duplicate id: %v", err)
	}
	if err := b.Leave(ctx); !errors.Is(err, status.ErrInvalidConfig) {
		t.Errorf("leave before join: %v", err)
	}
	if err := b.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Create(ctx, 1, Options{LocalDRAM: 2 << 20}); err != nil {
		t.Fatalf("create after destroy: %v", err)
	}
	// A Create that fails once under way (its context is gone) returns the error, not a
	// panic in its cleanup, and frees the id.
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if b, err := f.Create(gone, 2, Options{LocalDRAM: 2 << 20}); b != nil || err == nil {
		t.Fatalf("create with a canceled context: %v %v", b, err)
	}
	if _, err := f.Create(ctx, 2, Options{LocalDRAM: 2 << 20}); err != nil {
		t.Fatalf("create after a failed one: %v", err)
	}
	_ = store.ErrNotExist
}

// FlagCreateWithShm backs the local slice with the caller's descriptor: what the library writes
// is visible through the caller's own mapping of it (another process's, in practice).
func TestCreateWithShmFD(t *testing.T) {
	fd, err := unix.MemfdCreate("caller", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, 1<<20); err != nil { // smaller than the slice: grown
		t.Fatal(err)
	}
	_, b := single(t, Options{LocalDRAM: 4 << 20, Flags: FlagCreateWithShm, DRAMShmFD: fd})
	view, err := unix.Mmap(fd, 0, 4<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(view)
	gva, _ := b.PtrByMemType(Host, 0)
	if err := b.Write(testCtx(t), gva+3<<20, []byte("through the caller's fd")); err != nil {
		t.Fatal(err)
	}
	if string(view[3<<20:3<<20+23]) != "through the caller's fd" {
		t.Fatalf("the caller's mapping holds %q", view[3<<20:3<<20+23])
	}
	view[10] = 42
	if b.Local()[10] != 42 {
		t.Fatal("the caller's write is not in the slice")
	}
}
