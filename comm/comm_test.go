package comm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/ctrl"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/shm"
	"github.com/hmc-go/hmc/transport/tcp"
	"github.com/hmc-go/hmc/transport/transporttest"
	"github.com/hmc-go/hmc/transport/ucx"
)

const parentBufSize = 64 << 20

// forEachTransport runs one two-process test body over every transport (the same conformance
// at the Communicator level).
func forEachTransport(t *testing.T, f func(*testing.T, transport.ConnType)) {
	for _, ct := range []transport.ConnType{transport.TCP, transport.SHM} {
		t.Run(ct.String(), func(t *testing.T) { f(t, ct) })
	}
}

// forEachTransportAndUCX adds UCX (-tags ucx builds) to forEachTransport's list: the tests of
// one-sided transfers from the parent, which do not need the child to reach back over UCX.
func forEachTransportAndUCX(t *testing.T, f func(*testing.T, transport.ConnType)) {
	forEachTransport(t, f)
	if ucx.Built {
		t.Run("ucx", func(t *testing.T) { f(t, transport.UCX) })
	}
}

// session is the parent side connected to a child peer (rank 0); the parent is rank 1.
type session struct {
	t   *testing.T
	ct  transport.ConnType // the transport the test asked for
	c   *Communicator
	buf *buffer.ConnBuffer
	ch  *child
	ctx context.Context
}

func connect(t *testing.T, link ctrl.Transport, ct transport.ConnType) *session {
	t.Helper()
	return connectMem(t, link, ct, memory.CPU)
}

// connectMem is connect with the parent's buffer in memory of type mt.
func connectMem(t *testing.T, link ctrl.Transport, ct transport.ConnType, mt memory.Type) *session {
	t.Helper()
	ch := startChild(t)
	buf, err := buffer.New(0, parentBufSize, mt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { buf.Close() })
	c, err := New(buf, Config{NumChannels: 2, Stream: StreamConfig{SlotSize: 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// The parent serves too, so the child can put back and stream to it.
	if err := c.InitServer("127.0.0.1", 0, -1, "", transport.AUTO); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	l := CtrlLink{Transport: ctrl.TCP, IP: "127.0.0.1", Port: ch.ctrlPort}
	if link == ctrl.UDS {
		l = CtrlLink{Transport: ctrl.UDS, UDSPath: ch.uds}
	}
	port := ch.dataPort
	if ct == transport.UCX {
		port = ch.ucxPort
	}
	if err := c.ConnectTo(ctx, 0, 1, "127.0.0.1", port, l, ct); err != nil {
		t.Fatal(err)
	}
	return &session{t: t, ct: ct, c: c, buf: buf, ch: ch, ctx: ctx}
}

func (s *session) ask(cmd uint64, r request) bool {
	s.t.Helper()
	return s.askValue(cmd, r) == 1
}

// askValue sends the child a command and returns its reply.
func (s *session) askValue(cmd uint64, r request) uint64 {
	s.t.Helper()
	if err := s.c.CtrlSend(s.ctx, 0, cmd); err != nil {
		s.t.Fatal(err)
	}
	if err := s.c.Ctrl().SendStruct(s.ctx, 0, r); err != nil {
		s.t.Fatal(err)
	}
	v, err := s.c.CtrlRecv(s.ctx, 0)
	if err != nil {
		s.t.Fatal(err)
	}
	return v
}

// peerPort is the child's data port for the session's transport (UCX serves on its own).
func (s *session) peerPort() int {
	if s.ct == transport.UCX {
		return s.ch.ucxPort
	}
	return s.ch.dataPort
}

func (s *session) myPort() uint32 { return uint32(transporttestPort(s.c.DataAddr(transport.TCP))) }

func (s *session) fillLocal(off, n uint64, seed uint32) {
	b, err := s.buf.Slice(off, n)
	if err != nil {
		s.t.Fatal(err)
	}
	transporttest.Fill(b, seed)
}

func (s *session) localIs(off, n uint64, seed uint32) bool {
	want := make([]byte, n)
	transporttest.Fill(want, seed)
	got, _ := s.buf.Slice(off, n)
	return bytes.Equal(got, want)
}

func TestPutGetTwoProcesses(t *testing.T) { forEachTransportAndUCX(t, testPutGetTwoProcesses) }

func testPutGetTwoProcesses(t *testing.T, ct transport.ConnType) {
	for _, link := range []ctrl.Transport{ctrl.TCP, ctrl.UDS} {
		t.Run(link.String(), func(t *testing.T) {
			s := connect(t, link, ct)
			p := s.peerPort()
			for i, n := range []uint64{1, 4097, 1 << 20, 5<<20 + 3} {
				seed := uint32(10 + i)
				s.fillLocal(100, n, seed)
				if err := s.c.Peer("127.0.0.1", p, s.ct).Put(s.ctx, 100, 4096, n); err != nil {
					t.Fatal(err)
				}
				if !s.ask(cmdCheck, request{Off: 4096, Len: n, Seed: seed}) {
					t.Fatalf("put of %d bytes: child's region differs", n)
				}
				// Get: the child fills, we read.
				if !s.ask(cmdFill, request{Off: 8 << 20, Len: n, Seed: seed + 100}) {
					t.Fatal("fill")
				}
				if err := s.c.Peer("127.0.0.1", p, s.ct).Get(s.ctx, 16<<20, 8<<20, n); err != nil {
					t.Fatal(err)
				}
				if !s.localIs(16<<20, n, seed+100) {
					t.Fatalf("get of %d bytes differs", n)
				}
			}
		})
	}
}

// TestPutThenCtrlSendIsVisible is the race upstream HMC loses 87–99 times in 100: put, then
// send a tag; the target checks the whole range the moment the tag arrives.
func TestPutThenCtrlSendIsVisible(t *testing.T) {
	forEachTransportAndUCX(t, testPutThenCtrlSendIsVisible)
}

func testPutThenCtrlSendIsVisible(t *testing.T, ct transport.ConnType) {
	s := connect(t, ctrl.UDS, ct)
	iters := 3000
	if testing.Short() {
		iters = 500
	}
	for i := range iters {
		n := uint64(1 + (i*7919)%(256<<10))
		if i%100 == 0 {
			n = 4<<20 + uint64(i)
		}
		off := uint64(i%64) * 4096
		seed := uint32(i + 1)
		s.fillLocal(off, n, seed)
		if err := s.c.Peer("127.0.0.1", s.peerPort(), s.ct).Put(s.ctx, off, off, n); err != nil {
			t.Fatal(err)
		}
		if !s.ask(cmdCheck, request{Off: off, Len: n, Seed: seed}) {
			t.Fatalf("iteration %d: %d bytes not visible when the tag arrived", i, n)
		}
	}
}

func TestNonBlockingAndPipelines(t *testing.T) {
	forEachTransportAndUCX(t, testNonBlockingAndPipelines)
}

func testNonBlockingAndPipelines(t *testing.T, ct transport.ConnType) {
	s := connect(t, ctrl.TCP, ct)
	p := s.peerPort()
	const n, size = 16, 1<<20 + 5
	s.fillLocal(0, n*size, 42)
	var ids []uint64
	for i := range n {
		id, err := s.c.Peer("127.0.0.1", p, s.ct).PutNB(s.ctx, uint64(i*size), uint64(i*size), size)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	// Wait in reverse, one at a time, then check the whole range remotely.
	for i := n - 1; i >= 0; i-- {
		if err := s.c.Wait(s.ctx, ids[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.c.Wait(s.ctx, ids[0]); !errors.Is(err, status.ErrNotFound) {
		t.Fatalf("second wait: %v", err)
	}
	if !s.ask(cmdCheck, request{Off: 0, Len: n * size, Seed: 42}) {
		t.Fatal("NB puts: child's region differs")
	}
	// GetNB, all waited at once.
	ids = ids[:0]
	clear(s.buf.Bytes()[32<<20 : 32<<20+n*size])
	for i := range n {
		id, err := s.c.Peer("127.0.0.1", p, s.ct).GetNB(s.ctx, 32<<20+uint64(i*size), uint64(i*size), size)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := s.c.Wait(s.ctx, ids...); err != nil {
		t.Fatal(err)
	}
	if !s.localIs(32<<20, n*size, 42) {
		t.Fatal("NB gets differ")
	}
	if s.c.Pending() != 0 {
		t.Fatal("ops left pending")
	}
	// Pipelines with an odd chunk and a small window.
	const total = 20<<20 + 11
	s.fillLocal(0, total, 43)
	if err := s.c.Peer("127.0.0.1", p, s.ct).PutPipeline(s.ctx, 0, 1000, total, 1<<20+3, 3); err != nil {
		t.Fatal(err)
	}
	if !s.ask(cmdCheck, request{Off: 1000, Len: total, Seed: 43}) {
		t.Fatal("put pipeline differs")
	}
	clear(s.buf.Bytes()[:total])
	if err := s.c.Peer("127.0.0.1", p, s.ct).GetPipeline(s.ctx, 0, 1000, total, 0, 0); err != nil {
		t.Fatal(err)
	}
	if !s.localIs(0, total, 43) {
		t.Fatal("get pipeline differs")
	}
}

func TestSendRecvData(t *testing.T) { forEachTransport(t, testSendRecvData) }

func testSendRecvData(t *testing.T, ct transport.ConnType) {
	s := connect(t, ctrl.UDS, ct)
	p := s.peerPort()
	// The child's ring is 32 MiB of 1 MiB slots, ours 64 MiB of 1 MiB slots: payloads far larger
	// than either buffer must arrive whole (upstream re-sends the first chunk).
	for i, n := range []uint64{0, 1, 1<<20 - 1, 1 << 20, 3<<20 + 17, 150 << 20} {
		seed := uint32(200 + i)
		src := make([]byte, n)
		transporttest.Fill(src, seed)
		errc := make(chan bool, 1)
		go func() { errc <- s.ask(cmdRecvData, request{Len: n, Seed: seed, Port: s.myPort()}) }()
		if err := s.c.Peer("127.0.0.1", p, s.ct).SendDataTo(s.ctx, HostData(src)); err != nil {
			t.Fatalf("send %d: %v", n, err)
		}
		if !<-errc {
			t.Fatalf("child received %d bytes wrong", n)
		}
	}
	// And the other direction: the child streams to us over its dial-back connection.
	for i, n := range []uint64{5, 70<<20 + 3} {
		seed := uint32(300 + i)
		dst := make([]byte, n)
		errc := make(chan error, 1)
		var got uint64
		go func() {
			var err error
			got, err = s.c.Peer("127.0.0.1", p, s.ct).RecvDataFrom(s.ctx, HostData(dst))
			errc <- err
		}()
		if !s.ask(cmdSendData, request{Len: n, Seed: seed, Port: s.myPort()}) {
			t.Fatal("child's send failed")
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		want := make([]byte, n)
		transporttest.Fill(want, seed)
		if got != n || !bytes.Equal(dst, want) {
			t.Fatalf("received %d of %d bytes, equal=%v", got, n, bytes.Equal(dst, want))
		}
	}
	// A payload larger than the receiver's destination fails on both sides, without a hang.
	src := make([]byte, 1<<20)
	resp := make(chan bool, 1)
	go func() { resp <- s.ask(cmdRecvData, request{Len: 100, Seed: 1, Port: s.myPort()}) }()
	if err := s.c.Peer("127.0.0.1", p, s.ct).SendDataTo(s.ctx, HostData(src)); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatalf("oversized stream: %v", err)
	}
	if <-resp {
		t.Fatal("child accepted an oversized stream")
	}
}

func TestTargetPutsBack(t *testing.T) { forEachTransport(t, testTargetPutsBack) }

func testTargetPutsBack(t *testing.T, ct transport.ConnType) {
	s := connect(t, ctrl.TCP, ct)
	if err := s.c.Peer("127.0.0.1", s.peerPort(), s.ct).Check(); err != nil {
		t.Fatal(err)
	}
	if !s.ask(cmdPutBack, request{Off: 12345, Len: 3<<20 + 1, Seed: 77, Port: s.myPort()}) {
		t.Fatal("child could not put back")
	}
	if !s.localIs(12345, 3<<20+1, 77) {
		t.Fatal("put back differs")
	}
}

// A GPU ConnBuffer (a real one with a CUDA device, else the emulation) works over TCP, SHM and
// AUTO (SHM on one host) in both roles: the parent puts from it and gets into it (TCP: initiator
// staging; SHM: one device copy into the child's mapping), and the child puts back into it (TCP:
// target staging; SHM: the child opens the buffer's IPC handle and copies once). The child's
// buffer is host memory and checks every byte.
func TestDeviceBufferTwoProcesses(t *testing.T) {
	if memory.Probe(memory.NvidiaGPU) != nil {
		transporttest.EmulateGPU(t)
	}
	for _, ct := range []transport.ConnType{transport.TCP, transport.SHM, transport.AUTO} {
		t.Run(ct.String(), func(t *testing.T) {
			s := connectMem(t, ctrl.TCP, ct, memory.NvidiaGPU)
			if s.buf.Bytes() != nil {
				t.Fatal("device buffer exposes host bytes")
			}
			const off, n = 4097, 5<<20 + 3
			src := make([]byte, n)
			transporttest.Fill(src, 21)
			if err := s.buf.WriteFromCPU(src, off); err != nil {
				t.Fatal(err)
			}
			if err := s.c.Peer("127.0.0.1", s.peerPort(), ct).Put(s.ctx, off, off, n); err != nil {
				t.Fatal(err)
			}
			if !s.ask(cmdCheck, request{Off: off, Len: n, Seed: 21}) {
				t.Fatal("child saw other bytes")
			}
			if !s.ask(cmdFill, request{Off: 0, Len: n, Seed: 22}) {
				t.Fatal("child fill")
			}
			if err := s.c.Peer("127.0.0.1", s.peerPort(), ct).Get(s.ctx, 1, 0, n); err != nil {
				t.Fatal(err)
			}
			want := make([]byte, n)
			transporttest.Fill(want, 22)
			got := make([]byte, n)
			if err := s.buf.ReadToCPU(got, 1); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatal("get into the device buffer differs")
			}
			if !s.ask(cmdPutBack, request{Off: 777, Len: 3<<20 + 1, Seed: 23, Port: s.myPort()}) {
				t.Fatal("child could not put back into the device buffer")
			}
			want = make([]byte, 3<<20+1)
			transporttest.Fill(want, 23)
			got = make([]byte, len(want))
			if err := s.buf.ReadToCPU(got, 777); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatal("put back into the device buffer differs")
			}
		})
	}
}

func TestBadInput(t *testing.T) { forEachTransportAndUCX(t, testBadInput) }

func testBadInput(t *testing.T, ct transport.ConnType) {
	s := connect(t, ctrl.TCP, ct)
	p := s.peerPort()
	ctx := s.ctx
	// Out of range on either side: typed error, nothing written remotely.
	if !s.ask(cmdFill, request{Off: 0, Len: childBufSize, Seed: 9}) {
		t.Fatal("fill")
	}
	for _, c := range []struct{ lo, ro, n uint64 }{
		{0, childBufSize - 1, 2},
		{parentBufSize - 1, 0, 2},
		{0, ^uint64(0), 2},
	} {
		err := s.c.Peer("127.0.0.1", p, s.ct).Put(ctx, c.lo, c.ro, c.n)
		if !errors.Is(err, status.ErrOutOfRange) || status.CodeOf(err) != status.InvalidConfig {
			t.Fatalf("put %+v: %v", c, err)
		}
		if _, err := s.c.Peer("127.0.0.1", p, s.ct).GetNB(ctx, c.lo, c.ro, c.n); !errors.Is(err, status.ErrOutOfRange) {
			t.Fatalf("getNB %+v: %v", c, err)
		}
		if err := s.c.Peer("127.0.0.1", p, s.ct).PutPipeline(ctx, c.lo, c.ro, c.n, 0, 0); !errors.Is(err, status.ErrOutOfRange) {
			t.Fatalf("pipeline %+v: %v", c, err)
		}
	}
	if !s.ask(cmdCheck, request{Off: 0, Len: childBufSize, Seed: 9}) {
		t.Fatal("a refused put changed the child's region")
	}
	// Unknown peer.
	if err := s.c.Peer("127.0.0.1", 1, s.ct).Put(ctx, 0, 0, 1); !errors.Is(err, status.ErrNotFound) {
		t.Fatalf("unknown peer: %v", err)
	}
	if err := s.c.Peer("127.0.0.2", p, s.ct).Check(); !errors.Is(err, status.ErrNotFound) {
		t.Fatal(err)
	}
	if err := s.c.Wait(ctx, 987654); !errors.Is(err, status.ErrNotFound) {
		t.Fatal(err)
	}
	// Transports not usable here: RDMA (no device), UCX when not built in.
	others := []transport.ConnType{transport.RDMA}
	if !ucx.Built {
		others = append(others, transport.UCX)
	}
	for _, other := range others {
		if err := s.c.Peer("127.0.0.1", p, other).Put(ctx, 0, 0, 1); !errors.Is(err, status.ErrUnsupported) {
			t.Fatalf("%v: %v", other, err)
		}
	}
	if err := s.c.Peer("127.0.0.1", p, transport.ConnType(42)).Put(ctx, 0, 0, 1); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatal(err)
	}
	// A ctrl link that cannot be made leaves nothing behind.
	err := s.c.ConnectTo(ctx, 5, 1, "127.0.0.1", 1, CtrlLink{Transport: ctrl.UDS}, s.ct)
	if !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatal(err)
	}
	if err := s.c.Peer("127.0.0.1", p, s.ct).Disconnect(); err != nil {
		t.Fatal(err)
	}
	if err := s.c.Peer("127.0.0.1", p, s.ct).Put(ctx, 0, 0, 1); !errors.Is(err, status.ErrNotFound) {
		t.Fatalf("after disconnect: %v", err)
	}
}

func TestInitServerBindErrorsAreReturned(t *testing.T) {
	buf, _ := buffer.New(0, 4096, memory.CPU)
	defer buf.Close()
	a, _ := New(buf, Config{})
	defer a.Close()
	if err := a.InitServer("127.0.0.1", 0, 0, "", transport.TCP); err != nil {
		t.Fatal(err)
	}
	b, _ := New(buf, Config{})
	defer b.Close()
	port := transporttestPort(a.DataAddr(transport.TCP))
	if err := b.InitServer("127.0.0.1", port, -1, "", transport.TCP); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatalf("data port in use: %v", err)
	}
	if err := b.InitServer("127.0.0.1", 0, a.CtrlAddr().Port, "", transport.TCP); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatalf("ctrl port in use: %v", err)
	}
	if err := b.InitServer("127.0.0.1", 70000, -1, "", transport.TCP); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatal(err)
	}
	if err := b.InitServer("127.0.0.1", 0, -1, "", transport.UCX); ucx.Built == errors.Is(err, status.ErrUnsupported) {
		t.Fatalf("ucx server (built in: %v): %v", ucx.Built, err)
	}
	if err := b.InitServer("127.0.0.1", 0, -1, "", transport.RDMA); !errors.Is(err, status.ErrUnsupported) {
		t.Fatalf("rdma without a device: %v", err)
	}
	// AUTO also serves shared memory on the TCP port's abstract socket; a second server for
	// the same port is refused there too.
	c2, _ := New(buf, Config{})
	defer c2.Close()
	if err := c2.InitServer("127.0.0.1", 0, -1, "", transport.AUTO); err != nil {
		t.Fatal(err)
	}
	if got := c2.DataAddr(transport.SHM); got != shm.SocketName(transporttestPort(c2.DataAddr(transport.AUTO))) {
		t.Fatalf("shm address %q", got)
	}
	if _, err := New(nil, Config{}); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatal(err)
	}
	if _, err := New(buf, Config{Stream: StreamConfig{Offset: 8192}}); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatal(err)
	}
}

// TestPeerKilledMidTransfer kills the child with SIGKILL while large transfers are in flight:
// every call returns an error before its deadline and no goroutine is left (goleak).
func TestPeerKilledMidTransfer(t *testing.T) { forEachTransportAndUCX(t, testPeerKilledMidTransfer) }

func testPeerKilledMidTransfer(t *testing.T, ct transport.ConnType) {
	s := connect(t, ctrl.TCP, ct)
	p := s.peerPort()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errs := make(chan error, 3)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			if err := s.c.Peer("127.0.0.1", p, s.ct).PutPipeline(ctx, 0, 0, 60<<20, 0, 0); err != nil {
				errs <- err
				return
			}
		}
	})
	wg.Go(func() {
		for {
			if err := s.c.Peer("127.0.0.1", p, s.ct).Get(ctx, 0, 0, 60<<20); err != nil {
				errs <- err
				return
			}
		}
	})
	wg.Go(func() {
		_, err := s.c.CtrlRecv(ctx, 0)
		errs <- err
	})
	time.Sleep(200 * time.Millisecond)
	if err := s.ch.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err == nil || status.CodeOf(err) == status.Timeout {
			t.Fatalf("after the peer died: %v", err)
		}
		t.Logf("got: %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("took %v to notice the dead peer", d)
	}
	s.c.Close()
}

// TestSHMWorksWhileTargetIsStopped proves one-sidedness: with the target process stopped
// (SIGSTOP: no thread of it runs), shared-memory puts and gets still complete.
func TestSHMWorksWhileTargetIsStopped(t *testing.T) {
	s := connect(t, ctrl.UDS, transport.SHM)
	p := s.peerPort()
	const n = 8<<20 + 5
	s.fillLocal(0, n, 31)
	if err := s.ch.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			_ = s.ch.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
	defer cancel()
	if err := s.c.Peer("127.0.0.1", p, transport.SHM).Put(ctx, 0, 4096, n); err != nil {
		t.Fatalf("put to a stopped target: %v", err)
	}
	clear(s.buf.Bytes()[16<<20 : 16<<20+n])
	if err := s.c.Peer("127.0.0.1", p, transport.SHM).Get(ctx, 16<<20, 4096, n); err != nil {
		t.Fatalf("get from a stopped target: %v", err)
	}
	if !s.localIs(16<<20, n, 31) {
		t.Fatal("get from a stopped target differs")
	}
	_ = s.ch.cmd.Process.Signal(syscall.SIGCONT)
	stopped = false
	if !s.ask(cmdCheck, request{Off: 4096, Len: n, Seed: 31}) {
		t.Fatal("target's region differs after it resumed")
	}
}

// TestCloseUnderLoad closes the Communicator while goroutines have transfers of every kind in
// flight to a peer process (blocking, non-blocking + Wait, pipelines, a control receive): each
// ends with a result or ErrClosed / ErrPeerClosed, promptly, and nothing leaks (goleak).
func TestCloseUnderLoad(t *testing.T) { forEachTransportAndUCX(t, testCloseUnderLoad) }

func testCloseUnderLoad(t *testing.T, ct transport.ConnType) {
	s := connect(t, ctrl.TCP, ct)
	p := s.peerPort()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 8 << 20
	work := []func(i int) error{
		func(i int) error { return s.c.Peer("127.0.0.1", p, s.ct).Put(ctx, uint64(i)*n, uint64(i)*n, n) },
		func(i int) error { return s.c.Peer("127.0.0.1", p, s.ct).Get(ctx, uint64(i)*n, uint64(i)*n, n) },
		func(i int) error {
			var ids []uint64
			for k := range 4 {
				id, err := s.c.Peer("127.0.0.1", p, s.ct).PutNB(ctx, uint64(i)*n+uint64(k)<<20, uint64(i)*n, 1<<20)
				if err != nil {
					return err
				}
				ids = append(ids, id)
			}
			return s.c.Wait(ctx, ids...)
		},
		func(i int) error {
			return s.c.Peer("127.0.0.1", p, s.ct).PutPipeline(ctx, uint64(i)*n, uint64(i)*n, n, 1<<20, 4)
		},
	}
	errs := make(chan error, len(work)+1)
	var wg sync.WaitGroup
	for i, f := range work {
		wg.Go(func() {
			for {
				if err := f(i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Go(func() {
		_, err := s.c.CtrlRecv(ctx, 0)
		errs <- err
	})
	time.Sleep(50 * time.Millisecond)
	if err := s.c.Close(); err != nil {
		t.Fatalf("close under load: %v", err)
	}
	start := time.Now()
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, status.ErrClosed) && !errors.Is(err, status.ErrPeerClosed) {
			t.Errorf("after Close: %v", err)
		}
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("transfers took %v to end after Close", d)
	}
}

// TestPutFromGetToTwoProcesses: the zero-copy forms move bytes between plain Go memory of this
// process and the peer's buffer, byte for byte, on every transport; the local buffer is not
// touched.
func TestPutFromGetToTwoProcesses(t *testing.T) { forEachTransportAndUCX(t, testPutFromGetTo) }

func testPutFromGetTo(t *testing.T, ct transport.ConnType) {
	s := connect(t, ctrl.TCP, ct)
	p := s.peerPort()
	for i, n := range []uint64{1, 4097, 1 << 20, 5<<20 + 3} {
		seed := uint32(200 + i)
		src := make([]byte, n)
		transporttest.Fill(src, seed)
		if err := s.c.Peer("127.0.0.1", p, s.ct).PutFrom(s.ctx, src, 4096); err != nil {
			t.Fatal(err)
		}
		if !s.ask(cmdCheck, request{Off: 4096, Len: n, Seed: seed}) {
			t.Fatalf("put from %d bytes of Go memory: child's region differs", n)
		}
		if !s.ask(cmdFill, request{Off: 8 << 20, Len: n, Seed: seed + 100}) {
			t.Fatal("fill")
		}
		dst := make([]byte, n)
		if err := s.c.Peer("127.0.0.1", p, s.ct).GetTo(s.ctx, dst, 8<<20); err != nil {
			t.Fatal(err)
		}
		want := make([]byte, n)
		transporttest.Fill(want, seed+100)
		if !bytes.Equal(dst, want) {
			t.Fatalf("get to %d bytes of Go memory differs", n)
		}
	}
	if bytes.ContainsFunc(s.buf.Bytes(), func(r rune) bool { return r != 0 }) { // fresh buffers are zeroed
		t.Fatal("the local buffer was written")
	}
	if err := s.c.Peer("127.0.0.1", p, s.ct).PutFrom(s.ctx, make([]byte, 8), parentBufSize); !errors.Is(err, status.ErrOutOfRange) {
		t.Fatalf("put from past the peer's buffer: %v", err)
	}
}

// Peer handles: by name and by rank they reach the same process; Put/Get, RMA writes, atomics
// and control messages go through them, checked byte for byte by the child.
func TestPeerHandles(t *testing.T) { forEachTransportAndUCX(t, testPeerHandles) }

func testPeerHandles(t *testing.T, ct transport.ConnType) {
	s := connect(t, ctrl.TCP, ct)
	p := s.c.Peer("127.0.0.1", s.peerPort(), s.ct)
	byRank, err := s.c.PeerByRank(0)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := p.Rank(); err != nil || r != 0 {
		t.Fatalf("rank by name: %d %v", r, err)
	}
	const n = 1<<20 + 7
	s.fillLocal(0, n, 31)
	if err := p.Put(s.ctx, 0, 4096, n); err != nil {
		t.Fatal(err)
	}
	if !s.ask(cmdCheck, request{Off: 4096, Len: n, Seed: 31}) {
		t.Fatal("Peer.Put: child's region differs")
	}
	src := make([]byte, n)
	transporttest.Fill(src, 32)
	if err := byRank.Write(s.ctx, src, transport.Remote{Key: transport.DefaultRegion, Addr: 8 << 20}); err != nil {
		t.Fatal(err)
	}
	if !s.ask(cmdCheck, request{Off: 8 << 20, Len: n, Seed: 32}) {
		t.Fatal("Peer.Write by rank: child's region differs")
	}
	word := transport.Remote{Key: transport.DefaultRegion, Addr: 16 << 20}
	for i := range 10 {
		if old, err := p.Atomic(s.ctx, buffer.AtomicFetchAdd, word, 3, 0); err != nil || old != uint64(3*i) {
			t.Fatalf("fetch-add %d: old %d, %v", i, old, err)
		}
	}
	got := make([]byte, 8)
	if err := p.Read(s.ctx, got, word); err != nil || binary.LittleEndian.Uint64(got) != 30 {
		t.Fatalf("read back the word: % x %v", got, err)
	}
	if _, err := s.c.PeerByRank(7); !errors.Is(err, status.ErrNotFound) {
		t.Fatalf("unknown rank: %v", err)
	}
}

func TestRegionChurnTwoProcesses(t *testing.T) { forEachTransportAndUCX(t, testRegionChurn) }

// testRegionChurn: the peer process registers a region, this one writes it by key, the peer
// checks the bytes and deregisters it, over and over (a server that registers a buffer per
// request); every cycle works, and the first cycle's key, stale, reaches nothing.
func testRegionChurn(t *testing.T, ct transport.ConnType) {
	s := connect(t, ctrl.TCP, ct)
	p := s.c.Peer("127.0.0.1", s.peerPort(), s.ct)
	const off, n = 24 << 20, 4096
	cycles := 1000
	if testing.Short() {
		cycles = 200
	}
	src := make([]byte, n)
	var first uint64
	for i := range cycles {
		key := s.askValue(cmdRegister, request{Off: off, Len: n})
		if i == 0 {
			first = key
		}
		transporttest.Fill(src, uint32(i))
		if err := p.Write(s.ctx, src, transport.Remote{Key: buffer.Key(key)}); err != nil {
			t.Fatalf("cycle %d: write to region %d: %v", i, key, err)
		}
		if !s.ask(cmdCheck, request{Off: off, Len: n, Seed: uint32(i)}) {
			t.Fatalf("cycle %d: the peer's region differs", i)
		}
		if !s.ask(cmdDereg, request{Off: key}) {
			t.Fatalf("cycle %d: the peer could not deregister region %d", i, key)
		}
	}
	transporttest.Fill(src, 7)
	if err := p.Write(s.ctx, src, transport.Remote{Key: buffer.Key(first)}); !errors.Is(err, status.ErrNotFound) {
		t.Fatalf("write with the first cycle's key: %v", err)
	}
	if !s.ask(cmdCheck, request{Off: off, Len: n, Seed: uint32(cycles - 1)}) {
		t.Fatal("a stale key reached the peer's memory")
	}
}

// tcpOnly returns a Communicator over a 1 MiB buffer whose registry holds TCP alone.
func tcpOnly(t *testing.T) *Communicator {
	t.Helper()
	buf, err := buffer.New(0, 1<<20, memory.CPU)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { buf.Close() })
	tr, err := tcp.New(tcp.Config{})
	if err != nil {
		t.Fatal(err)
	}
	reg := NewRegistry()
	reg.Add(tr)
	c, err := New(buf, Config{Transports: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A Communicator uses the transports its registry holds: with TCP alone, AUTO takes TCP and
// SHM says why it cannot.
func TestRegistryInjectsTransports(t *testing.T) {
	c := tcpOnly(t)
	if err := c.InitServer("127.0.0.1", 0, -1, "", transport.AUTO); err != nil {
		t.Fatal(err)
	}
	if c.DataAddr(transport.SHM) != "" {
		t.Fatal("a shared-memory server without a shared-memory transport")
	}
	if err := c.InitServer("127.0.0.1", 0, -1, "", transport.SHM); !errors.Is(err, status.ErrUnsupported) {
		t.Fatalf("SHM without it registered: %v", err)
	}
}

// A registry without UCX makes UCX an error that says so, not a missing transport used later.
func TestRegistryWithoutUCX(t *testing.T) {
	c := tcpOnly(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, ct := range []transport.ConnType{transport.UCX, transport.RDMA} {
		if err := c.Peer("127.0.0.1", 1, ct).Put(ctx, 0, 0, 1); !errors.Is(err, status.ErrUnsupported) {
			t.Fatalf("%v without it registered: %v", ct, err)
		}
	}
}
