package transporttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// RMAPair is a server whose process registered regions in Table, and an endpoint to it that
// reaches them (transport.RMA).
type RMAPair struct {
	Default *buffer.ConnBuffer // the server's default region
	Table   *buffer.Table
	Server  transport.Server
	EP      transport.Endpoint
	RMA     transport.RMA
}

// NewRMAPair serves a 1 MiB default region and table on a fresh address and dials it. It skips
// the test if the transport's endpoints do not implement transport.RMA.
func (o Options) NewRMAPair(t testing.TB) *RMAPair {
	t.Helper()
	tr := o.New(t)
	p := &RMAPair{Default: o.buf(t, 1<<20), Table: buffer.NewTable()}
	srv, err := tr.Listen(transport.ServerConfig{BindAddr: o.addr(t), Region: p.Default, Regions: p.Table})
	if err != nil {
		t.Fatal(err)
	}
	p.Server = srv
	t.Cleanup(func() { srv.Close() })
	ep, err := tr.Dial(ctx10(t), transport.DialConfig{Addr: srv.Addr(), Local: o.buf(t, 4096), Rank: 1, Lanes: o.Lanes})
	if err != nil {
		t.Fatal(err)
	}
	p.EP = ep
	t.Cleanup(func() { ep.Close() })
	rma, ok := ep.(transport.RMA)
	if !ok {
		t.Skipf("%v endpoints do not implement transport.RMA", tr.Type())
	}
	p.RMA = rma
	return p
}

// RunRMA runs the region and atomics conformance suite: many regions named by key and by
// address, lookups at region boundaries, stale keys, deregistration during transfers, regions
// registered and deregistered over and over, every
// atomic operation and a concurrent fetch-add sum.
func RunRMA(t *testing.T, o Options) {
	t.Run("ManyRegions", func(t *testing.T) { testManyRegions(t, o) })
	t.Run("Boundaries", func(t *testing.T) { testRegionBoundaries(t, o) })
	t.Run("StaleKey", func(t *testing.T) { testStaleKey(t, o) })
	t.Run("DeregisterInFlight", func(t *testing.T) { testDeregisterInFlight(t, o) })
	t.Run("Churn", func(t *testing.T) { testChurn(t, o) })
	t.Run("Atomics", func(t *testing.T) { testAtomics(t, o) })
	t.Run("AtomicSum", func(t *testing.T) { testAtomicSum(t, o) })
	t.Run("PublishedTo", func(t *testing.T) { testPublishedTo(t, o) })
	t.Run("Vectors", func(t *testing.T) { testVectors(t, o) })
	t.Run("DeviceMemory", func(t *testing.T) { testDeviceRMA(t, o) })
}

// testDeviceRMA (endpoints with transport.DeviceRMA; a CUDA device, else the GPU emulation):
// this process's device memory is written to the target's host and device regions, by key and
// by address, in sizes around the staging chunk and the lanes' parts, and read back into device
// memory, every byte checked; a range past a region's end is refused typed.
func testDeviceRMA(t *testing.T, o Options) {
	if memory.Probe(memory.NvidiaGPU) != nil {
		EmulateGPU(t)
	}
	p := o.NewRMAPair(t)
	d, ok := p.RMA.(transport.DeviceRMA)
	if !ok {
		t.Skip("the endpoints do not implement transport.DeviceRMA")
	}
	ctx := ctx10(t)
	const size = 5<<20 + 11
	m, err := memory.New(0, memory.NvidiaGPU)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	alloc := func() (memory.Ptr, memory.Place) {
		b, err := m.Alloc(size)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Free(b) })
		pl, err := memory.Locate(b.Ptr())
		if err != nil || !pl.OnDevice() {
			t.Fatalf("a device allocation is at %v (%v)", pl, err)
		}
		return b.Ptr(), pl
	}
	src, pl := alloc()
	back, _ := alloc()
	want := make([]byte, size)
	Fill(want, 7)
	if err := memory.Copy(src, memory.Ptr(memory.AddrOf(want)), size); err != nil {
		t.Fatal(err)
	}
	tdev, tpl := alloc()
	devReg, err := p.Table.RegisterDevice(tdev, size, tpl)
	if err != nil {
		t.Fatal(err)
	}
	hostReg, err := p.Table.RegisterBuffer(o.buf(t, size))
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, size)
	for _, reg := range []*buffer.Region{hostReg, devReg} {
		for i, n := range []uint64{1, 4099, 1 << 20, 3<<20 + 5, size - 3} {
			off := uint64(3)
			dst := transport.Remote{Key: reg.Key(), Addr: off}
			if i%2 == 1 {
				dst = transport.Remote{Addr: reg.Addr() + off}
			}
			what := fmt.Sprintf("%d bytes at %d of the target's %v region", n, off, reg.Place())
			op, err := d.WriteFromDeviceAsync(ctx, src, pl, n, dst)
			if err == nil {
				err = op.Wait(ctx)
			}
			if err != nil {
				t.Fatalf("write %s: %v", what, err)
			}
			if op, err = d.ReadToDeviceAsync(ctx, back, pl, n, dst); err == nil {
				err = op.Wait(ctx)
			}
			if err != nil {
				t.Fatalf("read %s: %v", what, err)
			}
			clear(got)
			if err := memory.Copy(memory.Ptr(memory.AddrOf(got)), back, n); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got[:n], want[:n]) {
				t.Fatalf("%s: the bytes read back into device memory differ", what)
			}
		}
	}
	op, err := d.WriteFromDeviceAsync(ctx, src, pl, size, transport.Remote{Key: devReg.Key(), Addr: 1})
	if err == nil {
		err = op.Wait(ctx)
	}
	if !errors.Is(err, status.ErrOutOfRange) {
		t.Fatalf("a write past the device region's end: %v", err)
	}
}

// testVectors (endpoints with transport.VectorRMA): a vector of thousands of scattered pieces
// across three regions, named by key and by address, small and large (several messages, and
// pieces that go on their own), lands byte for byte and reads back; a vector with one piece
// the target refuses fails typed (not found, out of range); what it did to the vector's other
// pieces is unspecified, as for a failed write (TCP refuses a message whole; shm copies the
// pieces before the refused one).
func testVectors(t *testing.T, o Options) {
	p := o.NewRMAPair(t)
	v, ok := p.RMA.(transport.VectorRMA)
	if !ok {
		t.Skip("the endpoint moves pieces one by one (no transport.VectorRMA)")
	}
	ctx := ctx10(t)
	const size = 8 << 20
	mems := [][]byte{o.buf(t, size).Bytes(), o.buf(t, size).Bytes(), o.buf(t, size).Bytes()}
	regs := make([]*buffer.Region, len(mems))
	for i, m := range mems {
		r, err := p.Table.Register(m)
		if err != nil {
			t.Fatal(err)
		}
		regs[i] = r
	}
	src := make([]byte, 3*size)
	Fill(src, 31)
	var srcs [][]byte
	var dsts []transport.Remote
	type place struct{ reg, off, n int }
	var places []place
	off, at := 0, make([]int, 3)
	for i := 0; off < len(src); i++ {
		n := []int{4096, 512, 16 << 10, 1, 2048, 8192, 100, 64 << 10}[i%8]
		if i%97 == 0 {
			n = 300 << 10 // large: on its own
		}
		reg := i % 3
		if at[reg]+n+4096 > size || off+n > len(src) {
			break
		}
		d := transport.Remote{Key: regs[reg].Key(), Addr: uint64(at[reg])}
		if i%2 == 1 {
			d = transport.Remote{Addr: regs[reg].Addr() + uint64(at[reg])}
		}
		srcs, dsts = append(srcs, src[off:off+n]), append(dsts, d)
		places = append(places, place{reg, at[reg], n})
		at[reg] += n + 4096 // scattered: a hole after every piece
		off += n
	}
	if len(srcs) < 1000 {
		t.Fatalf("only %d pieces", len(srcs))
	}
	op, err := v.WriteVAsync(ctx, srcs, dsts)
	if err != nil {
		t.Fatal(err)
	}
	if err := op.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	for i, pl := range places {
		if !bytes.Equal(mems[pl.reg][pl.off:pl.off+pl.n], srcs[i]) {
			t.Fatalf("piece %d (%d bytes into region %d at %d) differs", i, pl.n, pl.reg, pl.off)
		}
	}
	back := make([][]byte, len(srcs))
	for i := range back {
		back[i] = make([]byte, len(srcs[i]))
	}
	if op, err = v.ReadVAsync(ctx, back, dsts); err != nil {
		t.Fatal(err)
	}
	if err := op.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range back {
		if !bytes.Equal(back[i], srcs[i]) {
			t.Fatalf("read of piece %d differs", i)
		}
	}
	// A KV batch's shape: 2 MiB of 4 KiB pieces, every other block of a region (TCP spreads a
	// batch of 1 to 4 MiB over four messages, a larger one in messages of 1 MiB).
	var kvSrcs, kvBack [][]byte
	var kvDsts []transport.Remote
	for i := range 512 {
		kvSrcs = append(kvSrcs, src[i*4096:(i+1)*4096])
		kvBack = append(kvBack, make([]byte, 4096))
		kvDsts = append(kvDsts, transport.Remote{Key: regs[2].Key(), Addr: uint64(i) * 8192})
	}
	writeRead(ctx, t, v, "a 2 MiB vector of 4 KiB pieces", kvSrcs, kvBack, kvDsts)
	for i := range kvSrcs {
		if at := i * 8192; !bytes.Equal(mems[2][at:at+4096], kvSrcs[i]) || !bytes.Equal(kvBack[i], kvSrcs[i]) {
			t.Fatalf("4 KiB piece %d of the 2 MiB vector differs (written or read back)", i)
		}
	}
	// One region named by address, pieces of every copy path's size (below and above 4 KiB),
	// empty ones among them and first, each followed by a hole: written and read back.
	var oneSrcs, oneBack [][]byte
	var oneDsts []transport.Remote
	at1 := 0
	for i, n := range []int{0, 1, 100, 64, 4096, 0, 300, 8192, 3, 65536, 17} {
		oneSrcs = append(oneSrcs, src[i*70000:i*70000+n])
		oneBack = append(oneBack, make([]byte, n))
		oneDsts = append(oneDsts, transport.Remote{Addr: regs[1].Addr() + uint64(at1)})
		at1 += n + 512
	}
	writeRead(ctx, t, v, "a vector into one region by address", oneSrcs, oneBack, oneDsts)
	for i := range oneSrcs {
		at := int(oneDsts[i].Addr - regs[1].Addr())
		if !bytes.Equal(mems[1][at:at+len(oneSrcs[i])], oneSrcs[i]) || !bytes.Equal(oneBack[i], oneSrcs[i]) {
			t.Fatalf("piece %d (%d bytes) of the one-region vector differs (written or read back)", i, len(oneSrcs[i]))
		}
	}
	// A refused piece: the vector fails, typed (also where every other piece is in its region).
	for _, last := range []transport.Remote{{Addr: regs[1].Addr() + size - 2}, {Key: regs[1].Key(), Addr: size - 2}} {
		op, err := v.WriteVAsync(ctx, [][]byte{[]byte("good"), []byte("past the end")}, []transport.Remote{oneDsts[1], last})
		if err == nil {
			err = op.Wait(ctx)
		}
		if !errors.Is(err, status.ErrOutOfRange) && !errors.Is(err, status.ErrNotFound) {
			t.Fatalf("a vector whose last piece runs past its region (%+v): %v", last, err)
		}
	}
	for _, bad := range []struct {
		r    transport.Remote
		want error
	}{{transport.Remote{Addr: 4096}, status.ErrNotFound}, {transport.Remote{Key: regs[1].Key(), Addr: size - 2}, status.ErrOutOfRange}} {
		op, err := v.WriteVAsync(ctx, [][]byte{[]byte("good"), []byte("bad!")}, []transport.Remote{{Key: regs[0].Key()}, bad.r})
		if err == nil {
			err = op.Wait(ctx)
		}
		if !errors.Is(err, bad.want) {
			t.Fatalf("a vector with a piece at %+v: %v, want %v", bad.r, err, bad.want)
		}
	}
}

// writeRead writes srcs to dsts as one vector, then reads them back into back as one.
func writeRead(ctx context.Context, t *testing.T, v transport.VectorRMA, what string, srcs, back [][]byte, dsts []transport.Remote) {
	t.Helper()
	op, err := v.WriteVAsync(ctx, srcs, dsts)
	if err == nil {
		err = op.Wait(ctx)
	}
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if op, err = v.ReadVAsync(ctx, back, dsts); err == nil {
		err = op.Wait(ctx)
	}
	if err != nil {
		t.Fatalf("reading back %s: %v", what, err)
	}
}

// testPublishedTo: a region published to other ranks than the initiator's (1) is, for it, a
// region that does not exist — by key and by address, for writes, reads and atomics, and its
// bytes stay as they were — while one published to rank 1 and an open one are reached;
// publishing the first to every peer again opens it.
func testPublishedTo(t *testing.T, o Options) {
	p := o.NewRMAPair(t)
	ctx := ctx10(t)
	mine, theirs, open := o.buf(t, 8192).Bytes(), o.buf(t, 8192).Bytes(), o.buf(t, 8192).Bytes()
	regs := make([]*buffer.Region, 3)
	for i, m := range [][]byte{mine, theirs, open} {
		r, err := p.Table.Register(m)
		if err != nil {
			t.Fatal(err)
		}
		regs[i] = r
	}
	regs[0].PublishTo(1, 5)
	regs[1].PublishTo(2, 3)
	Fill(theirs, 11)
	want := bytes.Clone(theirs)
	for _, r := range []transport.Remote{{Key: regs[1].Key(), Addr: 64}, {Addr: regs[1].Addr() + 64}} {
		if err := write(ctx, p.RMA, []byte("intruder"), r); !errors.Is(err, status.ErrNotFound) {
			t.Fatalf("write to a region published to others (%+v): %v", r, err)
		}
		if err := read(ctx, p.RMA, make([]byte, 8), r); !errors.Is(err, status.ErrNotFound) {
			t.Fatalf("read of a region published to others (%+v): %v", r, err)
		}
		if _, err := p.RMA.Atomic(ctx, buffer.AtomicSwap, r, 1, 0); !errors.Is(err, status.ErrNotFound) {
			t.Fatalf("atomic on a region published to others (%+v): %v", r, err)
		}
	}
	if !bytes.Equal(theirs, want) {
		t.Fatal("a region published to other ranks was changed")
	}
	for i, r := range []*buffer.Region{regs[0], regs[2]} {
		if err := write(ctx, p.RMA, []byte("member"), transport.Remote{Key: r.Key(), Addr: 8}); err != nil {
			t.Fatalf("region %d: %v", i, err)
		}
		if _, err := p.RMA.Atomic(ctx, buffer.AtomicFetchAdd, transport.Remote{Addr: r.Addr() + 16}, 1, 0); err != nil {
			t.Fatalf("region %d by address: %v", i, err)
		}
	}
	if string(mine[8:14]) != "member" || string(open[8:14]) != "member" {
		t.Fatal("writes to published regions did not land")
	}
	regs[1].PublishTo()
	if err := write(ctx, p.RMA, []byte("now open"), transport.Remote{Key: regs[1].Key(), Addr: 64}); err != nil || string(theirs[64:72]) != "now open" {
		t.Fatalf("after PublishTo(): %v %q", err, theirs[64:72])
	}
}

// write and read are blocking RMA transfers.
func write(ctx context.Context, r transport.RMA, src []byte, dst transport.Remote) error {
	op, err := r.WriteAsync(ctx, src, dst)
	if err != nil {
		return err
	}
	return op.Wait(ctx)
}

func read(ctx context.Context, r transport.RMA, dst []byte, src transport.Remote) error {
	op, err := r.ReadAsync(ctx, dst, src)
	if err != nil {
		return err
	}
	return op.Wait(ctx)
}

func testManyRegions(t *testing.T, o Options) {
	p := o.NewRMAPair(t)
	ctx := ctx10(t)
	// Half ConnBuffers (memfd-backed, with their descriptor), half plain memory the caller owns
	// (registered as bytes: the memory of a buffer here, because the race detector would see
	// the server goroutine's writes into Go heap memory and the test's reads of it as a race,
	// not knowing that the acknowledgement over the socket orders them), of sizes from 1 byte
	// to 3 MiB.
	var regs []*buffer.Region
	for i := range 24 {
		size := uint64(1) << (i % 22)
		if i%5 == 0 {
			size += 3
		}
		var r *buffer.Region
		var err error
		if i%2 == 0 {
			r, err = p.Table.RegisterBuffer(o.buf(t, size))
		} else {
			r, err = p.Table.Register(o.buf(t, size).Bytes())
		}
		if err != nil {
			t.Fatal(err)
		}
		regs = append(regs, r)
	}
	for i, r := range regs {
		src := make([]byte, r.Size())
		Fill(src, uint32(i)+1)
		byAddr := i%2 == 0
		dst := transport.Remote{Key: r.Key()}
		if byAddr {
			dst = transport.Remote{Addr: r.Addr()}
		}
		if err := write(ctx, p.RMA, src, dst); err != nil {
			t.Fatalf("region %d (%d bytes, by address %v): %v", r.Key(), r.Size(), byAddr, err)
		}
		if !bytes.Equal(r.Bytes(), src) {
			t.Fatalf("region %d: target bytes differ", r.Key())
		}
		back := make([]byte, r.Size())
		other := transport.Remote{Addr: r.Addr()}
		if byAddr {
			other = transport.Remote{Key: r.Key()}
		}
		if err := read(ctx, p.RMA, back, other); err != nil || !bytes.Equal(back, src) {
			t.Fatalf("region %d: read back: %v", r.Key(), err)
		}
	}
	// The default region is still reached by offset, through both interfaces.
	msg := []byte("default region")
	if err := write(ctx, p.RMA, msg, transport.Remote{Key: transport.DefaultRegion, Addr: 100}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(p.Default.Bytes()[100:100+len(msg)], msg) {
		t.Fatal("default region by key: bytes differ")
	}
}

func testRegionBoundaries(t *testing.T, o Options) {
	p := o.NewRMAPair(t)
	ctx := ctx10(t)
	mem := o.buf(t, 3*4096).Bytes() // not Go heap memory: see testManyRegions
	r, err := p.Table.Register(mem[4096 : 2*4096])
	if err != nil {
		t.Fatal(err)
	}
	base := r.Addr()
	one := []byte{0xAB}
	two := []byte{1, 2}
	cases := []struct {
		name string
		src  []byte
		dst  transport.Remote
		want error
	}{
		{"first byte by address", one, transport.Remote{Addr: base}, nil},
		{"last byte by address", one, transport.Remote{Addr: base + 4095}, nil},
		{"across the end by address", two, transport.Remote{Addr: base + 4095}, status.ErrOutOfRange},
		{"byte before", one, transport.Remote{Addr: base - 1}, status.ErrNotFound},
		{"byte after", one, transport.Remote{Addr: base + 4096}, status.ErrNotFound},
		{"last byte by key", one, transport.Remote{Key: r.Key(), Addr: 4095}, nil},
		{"across the end by key", two, transport.Remote{Key: r.Key(), Addr: 4095}, status.ErrOutOfRange},
		{"offset past the end by key", one, transport.Remote{Key: r.Key(), Addr: 1 << 40}, status.ErrOutOfRange},
		{"unknown key", one, transport.Remote{Key: r.Key() + 100}, status.ErrNotFound},
		{"default region past its end", one, transport.Remote{Key: transport.DefaultRegion, Addr: 1 << 20}, status.ErrOutOfRange},
	}
	for _, c := range cases {
		err := write(ctx, p.RMA, c.src, c.dst)
		if (c.want == nil && err != nil) || (c.want != nil && !errors.Is(err, c.want)) {
			t.Fatalf("%s: %v, want %v", c.name, err, c.want)
		}
		if c.want != nil {
			if err := read(ctx, p.RMA, make([]byte, len(c.src)), c.dst); !errors.Is(err, c.want) {
				t.Fatalf("%s (read): %v, want %v", c.name, err, c.want)
			}
		}
	}
	// Nothing outside the region moved; its edges hold what the accepted writes put there.
	if mem[4095] != 0 || mem[2*4096] != 0 || mem[4096] != 0xAB || mem[2*4096-1] != 0xAB {
		t.Fatalf("edges: %x %x %x %x", mem[4095], mem[4096], mem[2*4096-1], mem[2*4096])
	}
	// The endpoint still works after every refusal.
	if err := write(ctx, p.RMA, two, transport.Remote{Key: r.Key(), Addr: 10}); err != nil {
		t.Fatalf("after refusals: %v", err)
	}
}

func testStaleKey(t *testing.T, o Options) {
	p := o.NewRMAPair(t)
	ctx := ctx10(t)
	mem := o.buf(t, 8192).Bytes() // not Go heap memory: see testManyRegions
	r, err := p.Table.Register(mem)
	if err != nil {
		t.Fatal(err)
	}
	if err := write(ctx, p.RMA, []byte{1}, transport.Remote{Key: r.Key()}); err != nil {
		t.Fatal(err)
	}
	if err := p.Table.Deregister(ctx, r); err != nil {
		t.Fatal(err)
	}
	again, err := p.Table.Register(mem) // the same memory, a new key
	if err != nil {
		t.Fatal(err)
	}
	// The new key is reached first, so a transport that keeps per-region state (the shm
	// control word, which the new region may get again) has moved on when the stale key comes.
	if err := write(ctx, p.RMA, []byte{3}, transport.Remote{Key: again.Key()}); err != nil || mem[0] != 3 {
		t.Fatalf("new key: %v, byte %d", err, mem[0])
	}
	if err := write(ctx, p.RMA, []byte{2}, transport.Remote{Key: r.Key()}); !errors.Is(err, status.ErrNotFound) {
		t.Fatalf("write with a stale key: %v", err)
	}
	if _, err := p.RMA.Atomic(ctx, buffer.AtomicFetchAdd, transport.Remote{Key: r.Key()}, 1, 0); !errors.Is(err, status.ErrNotFound) {
		t.Fatalf("atomic with a stale key: %v", err)
	}
	if mem[0] != 3 {
		t.Fatalf("a stale key reached the memory registered again under a new key: byte %d", mem[0])
	}
	// By address the stale region is forgotten and the new one found.
	if err := write(ctx, p.RMA, []byte{4}, transport.Remote{Addr: again.Addr()}); err != nil || mem[0] != 4 {
		t.Fatalf("by address after re-registration: %v, byte %d", err, mem[0])
	}
	// The same for an atomic and a write by address that come first after a re-registration
	// (the region they may have cached for the address is the deregistered one).
	for i, by := range []string{"atomic", "write"} {
		if err := p.Table.Deregister(ctx, again); err != nil {
			t.Fatal(err)
		}
		if again, err = p.Table.Register(mem); err != nil {
			t.Fatal(err)
		}
		mem[8] = 0
		var err error
		if by == "atomic" {
			_, err = p.RMA.Atomic(ctx, buffer.AtomicFetchAdd, transport.Remote{Addr: again.Addr() + 8}, 5, 0)
		} else {
			err = write(ctx, p.RMA, []byte{5}, transport.Remote{Addr: again.Addr() + 8})
		}
		if err != nil || mem[8] != 5 {
			t.Fatalf("%s by address first after re-registration %d: %v, byte %d", by, i, err, mem[8])
		}
	}
}

// testChurn registers, reaches and deregisters a region over and over, as a server that
// registers a buffer per request does: every cycle works, and a key of an earlier cycle never
// reaches the memory again.
func testChurn(t *testing.T, o Options) {
	p := o.NewRMAPair(t)
	ctx := ctx10(t)
	mem := o.buf(t, 4096).Bytes()
	const cycles = 3000
	var first buffer.Key
	for i := range cycles {
		r, err := p.Table.Register(mem)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = r.Key()
		}
		v := byte(i%250 + 1)
		if err := write(ctx, p.RMA, []byte{v}, transport.Remote{Key: r.Key(), Addr: 8}); err != nil || mem[8] != v {
			t.Fatalf("cycle %d: %v, byte %d", i, err, mem[8])
		}
		if err := p.Table.Deregister(ctx, r); err != nil {
			t.Fatalf("cycle %d: deregister: %v", i, err)
		}
	}
	r, err := p.Table.Register(mem)
	if err != nil {
		t.Fatal(err)
	}
	if err := write(ctx, p.RMA, []byte{7}, transport.Remote{Key: r.Key()}); err != nil || mem[0] != 7 {
		t.Fatalf("after the churn: %v", err)
	}
	if err := write(ctx, p.RMA, []byte{9}, transport.Remote{Key: first}); !errors.Is(err, status.ErrNotFound) || mem[0] != 7 {
		t.Fatalf("the first cycle's key: %v, byte %d", err, mem[0])
	}
}

// testDeregisterInFlight deregisters a region while writers keep transfers to it in flight:
// Deregister returns once those running have finished, every transfer ends with a result or
// ErrNotFound, and afterwards every one is refused.
func testDeregisterInFlight(t *testing.T, o Options) {
	p := o.NewRMAPair(t)
	ctx := ctx10(t)
	const size = 8 << 20
	b := o.buf(t, size)
	r, err := p.Table.RegisterBuffer(b)
	if err != nil {
		t.Fatal(err)
	}
	src := make([]byte, 2<<20)
	Fill(src, 5)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		bad  error
		oks  int
		refs int
	)
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				dst := transport.Remote{Key: r.Key(), Addr: uint64((w*3+i)%4) << 21}
				if w%2 == 1 {
					dst = transport.Remote{Addr: r.Addr() + dst.Addr}
				}
				err := write(ctx, p.RMA, src, dst)
				mu.Lock()
				switch {
				case err == nil:
					oks++
				case errors.Is(err, status.ErrNotFound):
					refs++
				default:
					bad = err
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	}
	time.Sleep(20 * time.Millisecond)
	if err := p.Table.Deregister(ctx, r); err != nil {
		t.Fatalf("deregister during writes: %v", err)
	}
	wg.Wait()
	if bad != nil {
		t.Fatalf("a write during deregistration: %v", bad)
	}
	if refs != 4 {
		t.Fatalf("%d writers saw the deregistration, want 4 (%d writes landed)", refs, oks)
	}
	if err := read(ctx, p.RMA, make([]byte, 8), transport.Remote{Key: r.Key()}); !errors.Is(err, status.ErrNotFound) {
		t.Fatalf("read after deregistration: %v", err)
	}
}

func testAtomics(t *testing.T, o Options) {
	p := o.NewRMAPair(t)
	ctx := ctx10(t)
	mem := make([]byte, 64) // Go allocations of 64 bytes are 8-byte aligned
	r, err := p.Table.Register(mem)
	if err != nil {
		t.Fatal(err)
	}
	word := transport.Remote{Key: r.Key(), Addr: 8}
	if _, err := p.RMA.Atomic(ctx, buffer.AtomicStore, word, 10, 0); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		op               buffer.AtomicOp
		operand, compare uint64
		old              uint64
	}{
		{buffer.AtomicLoad, 0, 0, 10},
		{buffer.AtomicFetchAdd, 5, 0, 10},
		{buffer.AtomicSwap, 3, 0, 15},
		{buffer.AtomicCAS, 7, 4, 3}, // fails: 3 != 4
		{buffer.AtomicCAS, 7, 3, 3},
		{buffer.AtomicFetchOr, 8, 0, 7},
		{buffer.AtomicFetchAnd, 12, 0, 15},
		{buffer.AtomicFetchXor, 5, 0, 12},
		{buffer.AtomicLoad, 0, 0, 9},
	}
	for _, c := range cases {
		old, err := p.RMA.Atomic(ctx, c.op, word, c.operand, c.compare)
		if err != nil || old != c.old {
			t.Fatalf("%v(%d, %d): %d, %v; want %d", c.op, c.operand, c.compare, old, err, c.old)
		}
	}
	// By address too, and the owner sees the value through its own memory.
	if old, err := p.RMA.Atomic(ctx, buffer.AtomicFetchAdd, transport.Remote{Addr: r.Addr() + 8}, 1, 0); err != nil || old != 9 {
		t.Fatalf("by address: %d %v", old, err)
	}
	if v, _ := buffer.Atomic(mem, 8, buffer.AtomicLoad, 0, 0); v != 10 {
		t.Fatalf("owner sees %d", v)
	}
	if _, err := p.RMA.Atomic(ctx, buffer.AtomicLoad, transport.Remote{Key: r.Key(), Addr: 4}, 0, 0); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatalf("misaligned word: %v", err)
	}
	if _, err := p.RMA.Atomic(ctx, buffer.AtomicLoad, transport.Remote{Key: r.Key(), Addr: 60}, 0, 0); !errors.Is(err, status.ErrOutOfRange) {
		t.Fatalf("word past the end: %v", err)
	}
	if _, err := p.RMA.Atomic(ctx, 0, word, 0, 0); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatalf("atomic op 0: %v", err)
	}
	// The default region's words too.
	if _, err := p.RMA.Atomic(ctx, buffer.AtomicFetchAdd, transport.Remote{Key: transport.DefaultRegion, Addr: 64}, 2, 0); err != nil {
		t.Fatal(err)
	}
	if v, _ := buffer.Atomic(p.Default.Bytes(), 64, buffer.AtomicLoad, 0, 0); v != 2 {
		t.Fatalf("default region word %d", v)
	}
}

// testAtomicSum: goroutines sharing an endpoint and the owner itself add to one word at
// once; the sum is exact.
func testAtomicSum(t *testing.T, o Options) {
	p := o.NewRMAPair(t)
	ctx := ctx10(t)
	mem := make([]byte, 8)
	r, err := p.Table.Register(mem)
	if err != nil {
		t.Fatal(err)
	}
	const workers, each = 4, 2000
	var wg sync.WaitGroup
	errs := make(chan error, workers+1)
	for range workers {
		ep := p.EP
		wg.Go(func() {
			rma := ep.(transport.RMA)
			for range each {
				if _, err := rma.Atomic(ctx, buffer.AtomicFetchAdd, transport.Remote{Key: r.Key()}, 1, 0); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Go(func() { // the owner's own atomics on the same word
		for range each {
			if _, err := buffer.Atomic(mem, 0, buffer.AtomicFetchAdd, 1, 0); err != nil {
				errs <- err
				return
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if v, _ := buffer.Atomic(mem, 0, buffer.AtomicLoad, 0, 0); v != (workers+1)*each {
		t.Fatalf("sum %d, want %d", v, (workers+1)*each)
	}
}

// atomicChildEnv names an atomic-sum child's job: "addr key off n".
const atomicChildEnv = "HMC_TRANSPORTTEST_ATOMIC_CHILD"

// MaybeAtomicChild makes this process an atomic-sum child if the parent (AtomicSumProcesses)
// started it as one: it runs the job with the transport newTr returns and exits. Call it first
// in TestMain.
func MaybeAtomicChild(newTr func() (transport.Transport, error)) {
	job := os.Getenv(atomicChildEnv)
	if job == "" {
		return
	}
	var addr string
	var key buffer.Key
	var off uint64
	var n int
	if _, err := fmt.Sscan(job, &addr, &key, &off, &n); err != nil {
		fmt.Fprintln(os.Stderr, "atomic child: bad job", job, err)
		os.Exit(2)
	}
	tr, err := newTr()
	if err == nil {
		err = atomicSumChild(tr, addr, key, off, n)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "atomic child:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// AtomicSumProcesses starts procs processes (this test binary again; its TestMain calls
// MaybeAtomicChild) that each add 1 to one word of a region this process registered, each
// times, all at once, over the transport; the word must end at the exact sum.
func AtomicSumProcesses(t *testing.T, o Options, procs, each int) {
	p := o.NewRMAPair(t)
	mem := o.buf(t, 4096)
	r, err := p.Table.RegisterBuffer(mem)
	if err != nil {
		t.Fatal(err)
	}
	const off = 64
	start := time.Now()
	var cmds []*exec.Cmd
	for range procs {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d %d %d", atomicChildEnv, p.Server.Addr(), r.Key(), off, each))
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("child %d: %v", i, err)
		}
	}
	got, err := buffer.Atomic(mem.Bytes(), off, buffer.AtomicLoad, 0, 0)
	if err != nil || got != uint64(procs*each) {
		t.Fatalf("%d processes x %d fetch-adds: word is %d (%v), want %d", procs, each, got, err, procs*each)
	}
	t.Logf("%d processes x %d fetch-adds in %v", procs, each, time.Since(start).Round(time.Millisecond))
}

// atomicSumChild dials addr with tr and adds 1 to the word named by key and offset n times.
func atomicSumChild(tr transport.Transport, addr string, key buffer.Key, off uint64, n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	local, err := buffer.New(0, 4096, memory.CPU)
	if err != nil {
		return err
	}
	defer local.Close()
	ep, err := tr.Dial(ctx, transport.DialConfig{Addr: addr, Local: local, Rank: 1})
	if err != nil {
		return err
	}
	defer ep.Close()
	rma, ok := ep.(transport.RMA)
	if !ok {
		return fmt.Errorf("%v: no RMA: %w", tr.Type(), status.ErrUnsupported)
	}
	for range n {
		if _, err := rma.Atomic(ctx, buffer.AtomicFetchAdd, transport.Remote{Key: key, Addr: off}, 1, 0); err != nil {
			return err
		}
	}
	return nil
}
