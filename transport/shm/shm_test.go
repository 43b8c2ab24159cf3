package shm

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/transporttest"
)

func TestMain(m *testing.M) {
	if os.Getenv("HMC_SHM_CMA_CHILD") == "1" {
		cmaChild()
		return
	}
	transporttest.MaybeAtomicChild(func() (transport.Transport, error) { return New(Config{}) })
	if role, addr, ok := strings.Cut(os.Getenv("HMC_SHM_ATTACK"), ":"); ok {
		attackChild(role, addr)
		return
	}
	if os.Getenv("HMC_SHM_PREEMPT_CHILD") == "1" {
		preemptChild()
		return
	}
	goleak.VerifyTestMain(m)
}

func abstractName(testing.TB) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "@hmc-shm-test-" + hex.EncodeToString(b[:])
}

func newSHM(t testing.TB) transport.Transport {
	tr, err := New(Config{ParallelThreshold: 64 << 10, PieceSize: 16 << 10, Workers: 3})
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func TestConformance(t *testing.T) {
	transporttest.Run(t, transporttest.Options{New: newSHM, Addr: abstractName, ChunkSize: 64 << 10})
}

func TestConformanceDefaultsPathSocket(t *testing.T) {
	transporttest.Run(t, transporttest.Options{
		New:  func(t testing.TB) transport.Transport { tr, _ := New(Config{}); return tr },
		Addr: func(t testing.TB) string { return t.TempDir() + "/shm.sock" },
	})
}

func TestWirePinned(t *testing.T) {
	h := hello{version: version, rank: 7, listenPort: 2025, ip: "10.1.2.3"}
	r, err := decodeHello(h.encode())
	if err != nil || r != h {
		t.Fatal(r, err)
	}
	o := offer{version: version, size: 12345}
	copy(o.bootID[:], "abc")
	got, err := decodeOffer(o.encode())
	if err != nil || got != o {
		t.Fatal(got, err)
	}
	b := hello{rank: 1}.encode()
	b[4] = 9 // a newer initiator: the link runs the highest version both speak
	if h, err := decodeHello(b); err != nil || h.version != version {
		t.Fatal(h, err)
	}
	b[4] = 0
	if _, err := decodeHello(b); !errors.Is(err, status.ErrUnsupported) {
		t.Fatal(err)
	}
	if len(o.encode()) != offerSize || SocketName(2025) != "@hmc-shm-2025" {
		t.Fatal("sizes")
	}
}

// fakeTarget serves one initiator by hand, offering whatever fd and declaration it is given.
func fakeTarget(t *testing.T, o offer, fd int) string {
	name := abstractName(t)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: name, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { l.Close(); <-done })
	go func() {
		defer close(done)
		c, err := l.AcceptUnix()
		if err != nil {
			return
		}
		defer c.Close()
		b := make([]byte, helloSize)
		_, _ = c.Read(b)
		var rights []byte
		if fd >= 0 {
			rights = unix.UnixRights(fd)
		}
		_, _, _ = c.WriteMsgUnix(o.encode(), rights, nil)
		_, _ = c.Read(b) // until the initiator hangs up
	}()
	return name
}

func TestRefusesBadOffers(t *testing.T) {
	boot, err := BootID()
	if err != nil {
		t.Skip(err)
	}
	local, _ := buffer.New(0, 4096, memory.CPU)
	defer local.Close()
	// An unsealed memfd: the target could shrink it under our mapping (SIGBUS).
	unsealed, _ := unix.MemfdCreate("x", unix.MFD_CLOEXEC)
	defer unix.Close(unsealed)
	_ = unix.Ftruncate(unsealed, 8192)
	sealed, _ := buffer.New(0, 8192, memory.CPU)
	defer sealed.Close()
	f, _ := os.CreateTemp(t.TempDir(), "plain")
	defer f.Close()
	other := boot
	other[0] ^= 1
	cases := []struct {
		name string
		o    offer
		fd   int
		want error
	}{
		{"unsealed memfd", offer{version: version, size: 8192, bootID: boot}, unsealed, status.ErrProtocol},
		{"declares more than the file", offer{version: version, size: 1 << 20, bootID: boot}, sealed.FD(), status.ErrProtocol},
		{"no descriptor", offer{version: version, size: 8192, bootID: boot}, -1, status.ErrProtocol},
		{"another host", offer{version: version, size: 8192, bootID: other}, sealed.FD(), status.ErrUnsupported},
		{"zero size", offer{version: version, size: 0, bootID: boot}, sealed.FD(), status.ErrProtocol},
	}
	tr := newSHM(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			addr := fakeTarget(t, c.o, c.fd)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			ep, err := tr.Dial(ctx, transport.DialConfig{Addr: addr, Local: local})
			if err == nil {
				ep.Close()
			}
			if !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
		})
	}
}

func TestNeedsMemfdHostRegion(t *testing.T) {
	tr := newSHM(t)
	if _, err := tr.Listen(transport.ServerConfig{BindAddr: abstractName(t)}); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatal(err)
	}
	if _, err := New(Config{Workers: -1}); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatal(err)
	}
	local, _ := buffer.New(0, 4096, memory.CPU)
	defer local.Close()
	ctx := context.Background()
	if _, err := tr.Dial(ctx, transport.DialConfig{Addr: abstractName(t), Local: local}); !errors.Is(err, status.ErrFailed) {
		t.Fatalf("dial to nobody: %v", err)
	}
}

func BenchmarkPut(b *testing.B) {
	for _, size := range []uint64{8, 64 << 10, 4 << 20, 256 << 20} {
		b.Run(transporttest.SizeName(size), func(b *testing.B) {
			tr, _ := New(Config{})
			transporttest.BenchPut(b, transporttest.NewPairAt(b, tr, abstractName(b), size, size, 0), size)
		})
	}
}

// A GPU ConnBuffer on the initiator side copies with the device's own H2D/D2H straight into
// and out of the peer's mapping; a GPU target is shared through its IPC handle, and reached
// with one device copy from host or device memory. (In one process; TestDeviceTargetProcesses
// runs the target in another.)
func TestDeviceInitiator(t *testing.T) {
	const size = 5<<20 + 5
	dev := transporttest.DeviceBuf(t, size)
	tr := newSHM(t)
	transporttest.DeviceRoundTrip(t, tr, abstractName(t), transporttest.HostBuf(t, size), dev)
	transporttest.DeviceRoundTrip(t, tr, abstractName(t), dev, transporttest.HostBuf(t, size))
	transporttest.DeviceRoundTrip(t, tr, abstractName(t), dev, transporttest.DeviceBuf(t, size))
}

// An initiator with a GPU buffer page-locks the peer's mapping for its device unless the region
// exceeds DevicePinMax (negative: never); the lock is released before the unmap at Close.
func TestDevicePinsPeerRegion(t *testing.T) {
	const size = 1 << 20
	dev := transporttest.DeviceBuf(t, size)
	for _, tc := range []struct {
		max  int64
		want bool
	}{{0, true}, {size, true}, {size - 1, false}, {-1, false}} {
		tr, err := New(Config{DevicePinMax: tc.max})
		if err != nil {
			t.Fatal(err)
		}
		name := abstractName(t)
		srv, err := tr.Listen(transport.ServerConfig{BindAddr: name, Region: transporttest.HostBuf(t, size)})
		if err != nil {
			t.Fatal(err)
		}
		ep, err := tr.Dial(context.Background(), transport.DialConfig{Addr: name, Local: dev})
		if err != nil {
			t.Fatal(err)
		}
		if got := ep.(*endpoint).unpin != nil; got != tc.want {
			t.Errorf("DevicePinMax %d: pinned %v, want %v", tc.max, got, tc.want)
		}
		_ = ep.Close()
		_ = srv.Close()
	}
}

func TestRMA(t *testing.T) {
	transporttest.RunRMA(t, transporttest.Options{New: newSHM, Addr: abstractName})
}

// Eight processes add to one word of this process's memory at once through their mappings of
// it: sync/atomic on shared memory, the sum is exact.
func TestAtomicSumProcesses(t *testing.T) {
	each := 10000
	if testing.Short() {
		each = 1000
	}
	transporttest.AtomicSumProcesses(t, transporttest.Options{New: newSHM, Addr: abstractName}, 8, each)
}

// The link's region requests and answers: decoding never panics, and whatever decodes
// encodes back to the same bytes.
func FuzzLinkMessages(f *testing.F) {
	var qb [linkReqSize]byte
	linkReq{op: lopResolveKey, key: 3, id: 1, addr: 4096, length: 8}.encode(&qb)
	f.Add(qb[:])
	linkReq{op: lopAtomic, aop: 3, id: 2, addr: 1 << 40, length: 8, operand: 1}.encode(&qb)
	f.Add(qb[:])
	var rb [linkRespSize]byte
	linkResp{op: lopResolved, flags: lflagRegionFD | lflagControlFD, key: 3, id: 1, addr: 4096, size: 8192, slot: 9}.encode(&rb)
	f.Add(rb[:])
	dev := append(rb[:], make([]byte, devRecordSize)...)
	devRecord{vendor: 2, device: 1, size: 1 << 30, offset: 4096, raw: [64]byte{1, 2, 3}}.encode(dev[linkRespSize:])
	f.Add(dev)
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) >= linkRespSize+devRecordSize {
			if d, err := decodeDevRecord(b[linkRespSize : linkRespSize+devRecordSize]); err == nil {
				again := make([]byte, devRecordSize)
				d.encode(again)
				if !bytes.Equal(again, b[linkRespSize:linkRespSize+devRecordSize]) {
					t.Fatalf("device record % x re-encodes as % x", b[linkRespSize:linkRespSize+devRecordSize], again)
				}
				if d.offset >= d.size || d.device < 0 {
					t.Fatalf("decoded a device record with offset %d of %d, device %d", d.offset, d.size, d.device)
				}
			}
		}
		if len(b) < linkReqSize {
			return
		}
		var q [linkReqSize]byte
		copy(q[:], b)
		if r, err := decodeLinkReq(&q); err == nil {
			var again [linkReqSize]byte
			r.encode(&again)
			if again != q {
				t.Fatalf("request % x re-encodes as % x", q, again)
			}
		}
		var p [linkRespSize]byte
		copy(p[:], b)
		if r, err := decodeLinkResp(&p); err == nil {
			var again [linkRespSize]byte
			r.encode(&again)
			if again != p {
				t.Fatalf("response % x re-encodes as % x", p, again)
			}
		}
	})
}

// The hello and the offer: decoding never panics; a decoded hello keeps what it was given (an
// IP within bounds), and a decoded offer re-encodes to the same bytes (reserved fields zero).
func FuzzHelloOffer(f *testing.F) {
	f.Add(hello{rank: 1, listenPort: 2, ip: "10.0.0.1"}.encode(), offer{version: version, size: 4096}.encode())
	f.Fuzz(func(t *testing.T, h, o []byte) {
		if d, err := decodeHello(h); err == nil && (len(d.ip) > maxIPLen || d.version < minVersion || d.version > version) {
			t.Fatalf("hello accepted: %+v", d)
		}
		if d, err := decodeOffer(o); err == nil {
			if again := d.encode(); !bytes.Equal(again, o) {
				t.Fatalf("offer % x re-encodes as % x", o, again)
			}
		}
	})
}

// The target sends its control page once, with its first region answer. When that answer's
// requester has given up (or a later answer is handed over first), the page must still be
// mapped: the next requester's region, whose answer has no page, resolves.
func TestControlPageFromAbandonedAnswer(t *testing.T) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]*net.UnixConn, 2)
	for i, fd := range pair {
		f := os.NewFile(uintptr(fd), "pair")
		c, err := net.FileConn(f)
		_ = f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c.(*net.UnixConn)
	}
	initiator, target := conns[0], conns[1]
	defer target.Close()
	ctl, err := unix.MemfdCreate("test-control", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ctl)
	if err := unix.Ftruncate(ctl, ctlSlots*8); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.FcntlInt(uintptr(ctl), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK); err != nil {
		t.Fatal(err)
	}

	var p peerRegions
	p.init()
	done := make(chan error, 1)
	go func() {
		err := p.readReplies(initiator)
		p.linkDown() // a request waiting fails instead of hanging
		done <- err
	}()
	defer func() {
		p.stop()
		_ = initiator.Close()
		<-done
		p.close()
	}()

	answer := func(id, key uint64, withControl bool) {
		var qb [linkReqSize]byte
		if _, err := io.ReadFull(target, qb[:]); err != nil {
			t.Error(err)
			return
		}
		resp := linkResp{op: lopResolved, key: uint32(key), id: id, addr: key << 20, size: 4096, slot: uint32(key)}
		var oob []byte
		if withControl {
			resp.flags |= lflagControlFD
			oob = unix.UnixRights(ctl)
		}
		var rb [linkRespSize]byte
		resp.encode(&rb)
		if _, _, err := target.WriteMsgUnix(rb[:], oob, nil); err != nil {
			t.Error(err)
		}
	}

	// The first requester gives up before the target answers; the answer carries the page.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := p.request(ctx, initiator, linkReq{op: lopResolveKey, key: 1}); !errors.Is(err, status.ErrTimeout) {
		t.Fatalf("abandoned request: %v, want ErrTimeout", err)
	}
	answer(1, 1, true)

	go answer(2, 2, false)
	rep, err := p.request(context.Background(), initiator, linkReq{op: lopResolveKey, key: 2})
	if err != nil {
		t.Fatal(err)
	}
	r, err := p.add(rep.resp, rep.fds)
	if err != nil {
		t.Fatalf("region after an abandoned first answer: %v", err)
	}
	if r.key != 2 || r.slot == nil {
		t.Fatalf("region %d slot %v", r.key, r.slot)
	}
}
