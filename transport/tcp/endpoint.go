package tcp

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hmc-go/hmc/auth"
	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

type endpoint struct {
	cfg        Config
	region     *buffer.ConnBuffer // the local region
	local      []byte             // its bytes; nil for device memory (staged through the lanes' rings)
	remoteSize uint64
	version    uint16 // the wire version every lane runs
	lanes      []*lane
	next       atomic.Uint64 // round-robin lane cursor for chunks
	ids        atomic.Uint64 // request ids, unique per endpoint
	wg         sync.WaitGroup
	closeOnce  sync.Once
}

// lane is one TCP connection: a writer goroutine drains wq, a reader goroutine completes
// requests from their replies.
type lane struct {
	c     net.Conn
	r     io.Reader         // c, or a busy-polling reader over it
	wmu   sync.Mutex        // held while a request is written: by the writer goroutine or a direct poster
	hb    [reqSize]byte     // guarded by wmu
	arr   [2][]byte         // guarded by wmu
	slots chan struct{}     // in-flight semaphore, capacity MaxInflight
	wq    chan outReq       // capacity MaxInflight: a holder of a slot never blocks on it
	done  chan struct{}     // closed by fail
	send  *transport.Stager // device regions: PUT payloads (guarded by wmu)
	recv  *transport.Stager // device regions: GET data (reader goroutine)
	// Rings of the device memory that DeviceRMA transfers move, one per device: PUT payloads
	// (guarded by wmu) and GET data (reader goroutine).
	devSend, devRecv map[memory.Place]*transport.Stager
	bulk             *bulkReader     // large GET replies (reader goroutine); nil: plain reads
	raw              syscall.RawConn // c's socket, for a poster's non-blocking write; nil under TLS

	// A poster's non-blocking writev (writeNow) runs in raw.Write's callback, made once with
	// its arguments and results here (a closure per write would allocate); guarded by wmu.
	wv    func(fd uintptr) bool
	wvIOV [][]byte
	wvN   int
	wvErr error

	// queued counts requests handed to the writer goroutine and not yet written: a poster
	// writes its own request only when it is zero (under wmu), so a lane's requests leave in
	// the order they were posted.
	queued atomic.Int32

	failOnce sync.Once
	mu       sync.Mutex
	pending  map[uint64]pend // guarded by mu; nil once failed
	err      error           // why the lane failed; guarded by mu
}

type outReq struct {
	r       request
	payload []byte                 // a PUT's bytes (a slice of the local region)
	table   []byte                 // a vector request's piece table (version 3)
	pieces  [][]byte               // a PUTV's pieces, in table order
	devOff  uint64                 // device regions: the PUT's local offset (payload is nil)
	dev     *transport.DeviceRange // a DeviceRMA PUT's source (devOff is the offset in it)
	// rest, when set, is what a poster's non-blocking write left of its request (the end of
	// the header, copied, and of the payload): the writer sends exactly these bytes.
	rest net.Buffers
}

type pend struct {
	op     *transport.Op
	reply  uint8                  // the response op expected
	dst    []byte                 // a GET's destination (in the local region, or an RMA read's), an ATOMIC's 8-byte result
	dsts   [][]byte               // a GETV's destinations, in table order
	devOff uint64                 // device regions: the GET's local offset (dst is nil)
	dev    *transport.DeviceRange // a DeviceRMA GET's destination (devOff is the offset in it)
	n      uint64
}

var _ transport.DeviceRMA = (*endpoint)(nil)

// Dial connects cfg.Lanes (or the transport default) lanes to a target.
func (t *Transport) Dial(ctx context.Context, cfg transport.DialConfig) (transport.Endpoint, error) {
	if cfg.Local == nil {
		return nil, fmt.Errorf("tcp: dial without a local region: %w", status.ErrInvalidConfig)
	}
	local := cfg.Local.Bytes() // nil for device memory: staged through rings per lane
	n := cfg.Lanes
	if n == 0 {
		n = t.cfg.Lanes
		if local == nil && !t.lanesSet {
			n = DefaultDeviceLanes
		}
	}
	if n < 1 || n > maxLanes {
		return nil, fmt.Errorf("tcp: %d lanes (1..%d): %w", n, maxLanes, status.ErrInvalidConfig)
	}
	if cfg.ListenPort < 0 || cfg.ListenPort > 65535 {
		return nil, fmt.Errorf("tcp: listen port %d: %w", cfg.ListenPort, status.ErrInvalidConfig)
	}
	var sid [8]byte
	_, _ = rand.Read(sid[:]) // crypto/rand.Read never fails on Linux
	h := hello{lanes: uint16(n), rank: cfg.Rank, session: binary.LittleEndian.Uint64(sid[:]), listenPort: uint16(cfg.ListenPort)}
	ep := &endpoint{cfg: t.cfg, region: cfg.Local, local: local}
	conns, welcomes, err := t.dialLanes(ctx, cfg.Addr, h, n)
	if err != nil {
		return nil, err
	}
	for i, c := range conns {
		w := welcomes[i]
		if i == 0 {
			ep.remoteSize, ep.version = w.regionSize, w.version
		} else if w.regionSize != ep.remoteSize || w.version != ep.version {
			closeConns(conns[i:]) // inconsistent target; the error says why
			ep.Close()
			return nil, fmt.Errorf("tcp: lanes of %s disagree on the region size or version: %w", cfg.Addr, status.ErrProtocol)
		}
		l := &lane{c: c, r: newReader(c, t.cfg.BusyPoll), bulk: newBulkReader(c, t.cfg), slots: make(chan struct{}, t.cfg.MaxInflight), wq: make(chan outReq, t.cfg.MaxInflight),
			done: make(chan struct{}), pending: make(map[uint64]pend)}
		if tc, ok := c.(*net.TCPConn); ok {
			l.raw, _ = tc.SyscallConn() // nil on error: posters write only on an idle lane
			l.wv = l.writev
		}
		if local == nil {
			if l.send, err = transport.NewStager(ep.region, 0, 0); err == nil {
				if l.recv, err = transport.NewStager(ep.region, 0, 0); err != nil {
					_ = l.send.Close()
				}
			}
			if err != nil {
				closeConns(conns[i:])
				ep.Close()
				return nil, fmt.Errorf("tcp: %w", err)
			}
		}
		ep.lanes = append(ep.lanes, l)
		ep.wg.Add(2)
		go ep.writeLoop(l) // owned by ep: Close fails the lane and waits
		go ep.readLoop(l)  // likewise
	}
	return ep, nil
}

// dialLanes connects n lanes at once (each its own TCP handshake, authentication and
// hello/welcome: a round trip or a TLS handshake each, which need not wait for one another).
// The first lane to fail stops the others, every lane connected is closed, and its error is
// returned.
func (t *Transport) dialLanes(ctx context.Context, addr string, h hello, n int) ([]net.Conn, []welcome, error) {
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	conns, welcomes := make([]net.Conn, n), make([]welcome, n)
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for i := range n {
		wg.Add(1)
		go func() { // joined below
			defer wg.Done()
			lh := h
			lh.lane = uint16(i)
			var err error
			if conns[i], welcomes[i], err = t.dialLane(lctx, addr, lh); err != nil {
				once.Do(func() { first = err; cancel() })
			}
		}()
	}
	wg.Wait()
	if first == nil {
		return conns, welcomes, nil
	}
	closeConns(conns)
	if cerr := status.FromContext(ctx); cerr != nil {
		return nil, nil, fmt.Errorf("tcp: dial %s: %w", addr, cerr)
	}
	return nil, nil, first
}

// closeConns closes the non-nil connections of cs (lanes not taken into an endpoint).
func closeConns(cs []net.Conn) {
	for _, c := range cs {
		if c != nil {
			_ = c.Close() // never used; the caller reports why
		}
	}
}

func (t *Transport) dialLane(ctx context.Context, addr string, h hello) (net.Conn, welcome, error) {
	d := net.Dialer{KeepAlive: t.cfg.KeepAlive}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		if cerr := status.FromContext(ctx); cerr != nil {
			return nil, welcome{}, fmt.Errorf("tcp: dial %s: %w", addr, cerr)
		}
		return nil, welcome{}, fmt.Errorf("tcp: dial %s: %w: %w", addr, status.ErrFailed, err)
	}
	tuneConn(c, t.cfg)
	// A canceled dial (the caller's, or a sibling lane's failure) ends the handshake at once.
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(t.cfg.HandshakeTimeout)
	}
	conn, err := auth.Client(spinning(c, t.cfg), t.cfg.Auth, "tcp", dl)
	if err != nil {
		_ = c.Close() // refused; that error is reported
		return nil, welcome{}, fmt.Errorf("tcp: %s: %w", addr, err)
	}
	_ = conn.SetDeadline(dl)
	var hb [helloSize]byte
	h.encode(&hb)
	var wb [welcomeSize]byte
	if _, err = conn.Write(hb[:]); err == nil {
		var n int
		n, err = io.ReadFull(conn, wb[:])
		if aerr := auth.Refusal(wb[:n], addr); aerr != nil {
			err = aerr // the target authenticates its peers; this side has no credentials
		}
	}
	var w welcome
	if err == nil {
		w, err = decodeWelcome(wb[:])
	}
	if err != nil {
		_ = c.Close() // handshake failed; that error is reported
		return nil, welcome{}, fmt.Errorf("tcp: handshake with %s: %w", addr, wrapIO(err))
	}
	_ = conn.SetDeadline(time.Time{})
	if !stop() { // canceled just now: c is closed
		return nil, welcome{}, fmt.Errorf("tcp: dial %s: %w", addr, status.FromContext(ctx))
	}
	return conn, w, nil
}

func wrapIO(err error) error {
	if errors.Is(err, status.ErrFailed) || errors.Is(err, status.ErrUnsupported) || errors.Is(err, status.ErrPermission) {
		return err
	}
	return fmt.Errorf("%w: %w", status.ErrPeerClosed, err)
}

// RemoteSize returns the target's region size from the welcome.
func (ep *endpoint) RemoteSize() uint64 { return ep.remoteSize }

// PutAsync implements transport.Endpoint.
func (ep *endpoint) PutAsync(ctx context.Context, localOff, remoteOff, n uint64) (*transport.Op, error) {
	return ep.post(ctx, opPut, localOff, remoteOff, n)
}

// GetAsync implements transport.Endpoint.
func (ep *endpoint) GetAsync(ctx context.Context, localOff, remoteOff, n uint64) (*transport.Op, error) {
	return ep.post(ctx, opGet, localOff, remoteOff, n)
}

func (ep *endpoint) post(ctx context.Context, op uint8, localOff, remoteOff, n uint64) (*transport.Op, error) {
	if err := transport.CheckRanges(ep.region.Size(), ep.remoteSize, localOff, remoteOff, n); err != nil {
		return nil, fmt.Errorf("tcp: %w", err)
	}
	var span []byte
	if ep.local != nil {
		span = ep.local[localOff : localOff+n : localOff+n]
	}
	return ep.send(ctx, request{op: op, offset: remoteOff}, n, span, localOff, nil)
}

// send posts a transfer of n bytes described by base (op, addressing, remote offset) in parts
// (partSize) spread over the lanes (one-part transfers stay on a hot lane). span is the local
// host memory, or nil for device memory, whose bytes at devOff (of dev, or of the local device
// region when dev is nil) are staged.
func (ep *endpoint) send(ctx context.Context, base request, n uint64, span []byte, devOff uint64, dev *transport.DeviceRange) (*transport.Op, error) {
	if n == 0 {
		return transport.Succeeded(), nil
	}
	p := ep.part(n, dev != nil)
	o := transport.NewOp(int((n + p - 1) / p))
	if err := ep.sendParts(ctx, base, n, span, devOff, dev, o); err != nil {
		return nil, err
	}
	return o, nil
}

// parts is the number of parts send cuts a transfer of n bytes of host memory into.
func (ep *endpoint) parts(n uint64) int {
	chunk := ep.part(n, false)
	return int((n + chunk - 1) / chunk)
}

// part is the size of the parts of a transfer of n bytes. A DeviceRMA transfer is striped over
// the lanes from 2 × devPartMin on (host memory from stripeFrom): its parts' device copies then
// run while the other parts are on the wire.
func (ep *endpoint) part(n uint64, device bool) uint64 {
	if !device {
		return partSize(n, len(ep.lanes), ep.cfg.ChunkSize)
	}
	parts := max(1, min(uint64(len(ep.lanes)), n/devPartMin))
	const page = 4096
	p := ((n+parts-1)/parts + page - 1) &^ (page - 1)
	return min(p, ep.cfg.ChunkSize)
}

// sendParts posts the parts of a transfer, each finishing one part of o; on an error the parts
// not posted are finished with it (posted ones finish on their own).
func (ep *endpoint) sendParts(ctx context.Context, base request, n uint64, span []byte, devOff uint64, dev *transport.DeviceRange, o *transport.Op) error {
	chunk := ep.part(n, dev != nil)
	parts := (n + chunk - 1) / chunk
	var first *lane
	if parts == 1 {
		first = ep.pickLane()
	}
	for i := range parts {
		off := i * chunk
		size := min(chunk, n-off)
		l := first
		if l == nil {
			l = ep.lanes[ep.next.Add(1)%uint64(len(ep.lanes))]
		}
		r := base
		r.id, r.offset, r.length = ep.ids.Add(1), base.offset+off, size
		var piece []byte
		if span != nil {
			piece = span[off : off+size : off+size]
		}
		if err := l.post(ctx, r, piece, devOff+off, dev, o, nil); err != nil {
			for range parts - i {
				o.Finish(err) // the parts never posted; posted ones finish on their own
			}
			return err
		}
	}
	return nil
}

// Striping: a transfer of stripeFrom bytes or more is cut into parts of at least stripeMin,
// one per lane. Smaller parts cost more in requests and wake-ups than the parallel copy gains;
// and a 1 MiB transfer, though 30 % faster as 2 parts on an idle machine, is a third slower
// so when a busy process shares the cores, where one flow on one lane wakes least.
const (
	stripeFrom = 2 << 20
	stripeMin  = 512 << 10
)

// partSize is the part a transfer of n bytes is cut into over lanes lanes: from stripeFrom on,
// n split evenly (page multiples) over as many lanes as parts of at least stripeMin allow; at
// most max.
func partSize(n uint64, lanes int, max uint64) uint64 {
	parts := min(uint64(lanes), n/stripeMin)
	if parts <= 1 || n < stripeFrom {
		return min(n, max)
	}
	const page = 4096
	p := ((n+parts-1)/parts + page - 1) &^ (page - 1)
	return min(p, max)
}

// pickLane chooses the lane for a one-part transfer: the first lane with fewer than
// stickyInflight requests in flight, else the least loaded. Keeping small traffic on one lane
// keeps that lane's reader hot (with busy polling it never parks); spreading every op over the
// lanes would leave each reader idle between its turns.
func (ep *endpoint) pickLane() *lane {
	best := ep.lanes[0]
	for _, l := range ep.lanes {
		if len(l.slots) < stickyInflight {
			return l
		}
		if len(l.slots) < len(best.slots) {
			best = l
		}
	}
	return best
}

// stickyInflight is how many requests a lane takes before one-part transfers spill over to
// the next lane.
const stickyInflight = 4

// post queues request r on the lane. span is a PUT's payload or a GET's destination (host
// memory), or nil for a transfer of device memory at devOff (of dev, or of the local device
// region when dev is nil); an ATOMIC carries its 16-byte payload in extra and its result lands
// in span.
func (l *lane) post(ctx context.Context, r request, span []byte, devOff uint64, dev *transport.DeviceRange, o *transport.Op, extra []byte) error {
	if err := l.acquire(ctx); err != nil {
		return err
	}
	p := pend{op: o, reply: r.op | 0x80, devOff: devOff, n: r.length}
	out := outReq{r: r, devOff: devOff}
	if r.op == opGet {
		p.dev = dev
	} else {
		out.dev = dev
	}
	switch r.op {
	case opGet:
		p.dst = span
	case opAtomic:
		p.dst, out.payload = span, extra
	default:
		out.payload = span
	}
	if err := l.addPending(r.id, p); err != nil {
		return err
	}
	// A small request is written by the caller itself when the writer goroutine has nothing
	// queued: no hand-off on the latency path (a ping-pong posts its next put before the
	// previous one's ack is read). The write must not block (with requests in flight to a peer
	// that stopped answering, the send buffer fills, and no deadline reaches a goroutine
	// blocked in a write): on a plain socket it is one non-blocking writev, and what the
	// socket does not take goes to the writer goroutine, queued before wmu is released so
	// that nothing overtakes it; under TLS, where bytes cannot be split, only an idle lane's
	// request, whose send buffer is empty, is written directly. Large ones are queued, so
	// posting stays non-blocking.
	if l.send == nil && out.dev == nil && len(out.payload) <= directWriteMax && l.queued.Load() == 0 && (l.raw != nil || len(l.slots) == 1) && l.wmu.TryLock() {
		if l.queued.Load() == 0 { // checked again under wmu: the writer may have taken one since
			var err error
			if l.raw == nil {
				err = l.write(out)
			} else if rest, done, werr := l.writeNow(out); werr != nil {
				err = werr
			} else if !done {
				l.queued.Add(1)
				l.wq <- outReq{rest: rest} // never blocks, as below
			}
			l.wmu.Unlock()
			if err != nil {
				l.fail(err) // completes this request's op with err
			}
			return nil
		}
		l.wmu.Unlock()
	}
	l.queued.Add(1)
	l.wq <- out // never blocks: we hold one of MaxInflight slots and wq has MaxInflight places
	return nil
}

// addPending records request id's completion, or returns why the lane failed.
func (l *lane) addPending(id uint64, p pend) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pending == nil {
		return l.err
	}
	l.pending[id] = p
	return nil
}

// acquire takes one of the lane's in-flight slots, waiting within ctx.
func (l *lane) acquire(ctx context.Context) error {
	select {
	case l.slots <- struct{}{}:
		return nil
	case <-l.done:
		return l.failure()
	default:
	}
	select {
	case l.slots <- struct{}{}:
		return nil
	case <-l.done:
		return l.failure()
	case <-ctx.Done():
		return fmt.Errorf("tcp: waiting for an in-flight slot: %w", status.FromContext(ctx))
	}
}

// postVector queues a vector request (version 3) on the lane: its table, and a PUTV's pieces
// to send or a GETV's to fill. The writer goroutine sends it.
func (l *lane) postVector(ctx context.Context, r request, table []byte, pieces [][]byte, o *transport.Op) error {
	if err := l.acquire(ctx); err != nil {
		return err
	}
	p := pend{op: o, reply: opPutAck, n: r.length}
	out := outReq{r: r, table: table}
	if r.op == opGetV {
		p.reply, p.dsts = opGetData, pieces
	} else {
		out.pieces = pieces
	}
	if err := l.addPending(r.id, p); err != nil {
		return err
	}
	l.queued.Add(1)
	l.wq <- out // never blocks: we hold one of MaxInflight slots and wq has MaxInflight places
	return nil
}

// directWriteMax is the largest payload a poster writes itself on an idle lane.
const directWriteMax = 64 << 10

// write sends one request (and a PUT's payload) in one write or writev. Caller holds wmu.
func (l *lane) write(out outReq) error {
	out.r.encode(&l.hb)
	var err error
	switch {
	case out.rest != nil: // what a poster's write left
		err = writeSliced(l.c, out.rest)
	case out.table != nil: // a vector request: header, table, pieces in one writev
		bufs := make(net.Buffers, 0, 2+len(out.pieces))
		bufs = append(append(bufs, l.hb[:], out.table), out.pieces...)
		err = writeSliced(l.c, bufs)
	case out.dev != nil: // a DeviceRMA PUT: the header, then the bytes through the device's ring
		var st *transport.Stager
		if st, err = devRing(&l.devSend, out.dev.Place); err == nil {
			if _, err = l.c.Write(l.hb[:]); err == nil {
				err = st.SendFrom(l.c, *out.dev, out.devOff, out.r.length)
			}
		}
	case l.send != nil && out.payload == nil && out.r.op == opPut && out.r.length > 0: // a device region's PUT
		if _, err = l.c.Write(l.hb[:]); err == nil {
			err = l.send.Send(l.c, out.devOff, out.r.length)
		}
	case len(out.payload) == 0:
		_, err = l.c.Write(l.hb[:])
	default:
		l.arr[0], l.arr[1] = l.hb[:], out.payload
		err = writeSliced(l.c, net.Buffers(l.arr[:]))
	}
	if err != nil {
		return fmt.Errorf("tcp: send: %w", wrapIO(err))
	}
	return nil
}

// writeNow writes out's header and payload with one non-blocking writev and reports whether
// the socket took all of it; if not, rest is what is left (the header's end copied: l.hb is
// reused). Caller holds wmu.
func (l *lane) writeNow(out outReq) (rest net.Buffers, done bool, err error) {
	out.r.encode(&l.hb)
	l.arr[0], l.arr[1] = l.hb[:], out.payload
	iov := l.arr[:1]
	if len(out.payload) > 0 {
		iov = l.arr[:2]
	}
	l.wvIOV = iov
	cerr := l.raw.Write(l.wv)
	n, werr := l.wvN, l.wvErr
	l.wvIOV, l.wvErr = nil, nil
	if cerr != nil {
		return nil, false, fmt.Errorf("tcp: send: %w", wrapIO(cerr))
	}
	switch {
	case werr == unix.EAGAIN:
		n = 0
	case werr != nil:
		return nil, false, fmt.Errorf("tcp: send: %w", wrapIO(werr))
	}
	if n == reqSize+len(out.payload) {
		return nil, true, nil
	}
	leftovers.Add(1)
	if n < reqSize {
		rest = append(rest, append([]byte(nil), l.hb[n:]...))
		n = reqSize
	}
	if p := out.payload[n-reqSize:]; len(p) > 0 {
		rest = append(rest, p)
	}
	return rest, false, nil
}

// writev is raw.Write's callback for writeNow: one non-blocking writev of wvIOV. Caller holds
// wmu.
func (l *lane) writev(fd uintptr) bool {
	for {
		l.wvN, l.wvErr = unix.Writev(int(fd), l.wvIOV)
		if l.wvErr != unix.EINTR {
			return true // never wait for the socket: what it does not take is queued
		}
	}
}

// leftovers counts the poster writes the socket did not take whole (tests look).
var leftovers atomic.Int64

// writeMany sends out and the requests queued behind it (up to writeBatch of them) in one
// writev: a batch of small PUTs costs one system call instead of one each. It returns how
// many requests it took. Caller holds wmu.
func (l *lane) writeMany(out outReq) (int, error) {
	var hdrs [writeBatch][reqSize]byte
	bufs := make(net.Buffers, 0, 2*writeBatch)
	n := 0
	for {
		switch {
		case out.rest != nil:
			bufs = append(bufs, out.rest...)
		case out.table != nil:
			out.r.encode(&hdrs[n])
			bufs = append(append(bufs, hdrs[n][:], out.table), out.pieces...)
		default:
			out.r.encode(&hdrs[n])
			bufs = append(bufs, hdrs[n][:])
			if len(out.payload) > 0 {
				bufs = append(bufs, out.payload)
			}
		}
		if n++; n == writeBatch {
			break
		}
		select {
		case out = <-l.wq:
			if out.dev != nil { // streamed on its own, after what is gathered
				if err := writeSliced(l.c, bufs); err != nil {
					return n + 1, fmt.Errorf("tcp: send: %w", wrapIO(err))
				}
				return n + 1, l.write(out)
			}
			continue
		default:
		}
		break
	}
	if err := writeSliced(l.c, bufs); err != nil {
		return n, fmt.Errorf("tcp: send: %w", wrapIO(err))
	}
	return n, nil
}

// The rings of device memory that a lane or a server connection streams (DeviceRMA transfers,
// device regions of a table): a chunk is a part as the lanes stripe a transfer (512 KiB), so a
// part is one device copy and one write, and a longer one streams chunk by chunk, its copies
// queued ahead. On a lent H100 a host<->device copy costs ~14 us whatever its size.
const (
	devStageChunk = 512 << 10
	devStageDepth = 4
	devPartMin    = stripeMin
)

// devRing returns the staging ring of device memory at pl in *rings, made on first use.
func devRing(rings *map[memory.Place]*transport.Stager, pl memory.Place) (*transport.Stager, error) {
	if st := (*rings)[pl]; st != nil {
		return st, nil
	}
	chunk, depth := transport.StageSizes(devStageChunk, devStageDepth)
	st, err := transport.NewRing(func(n uint64) ([]byte, func() error, error) { return memory.AllocStagingFor(pl, n) }, chunk, depth)
	if err != nil {
		return nil, fmt.Errorf("tcp: staging for %v memory: %w", pl, err)
	}
	if *rings == nil {
		*rings = map[memory.Place]*transport.Stager{}
	}
	(*rings)[pl] = st
	return st, nil
}

// writeBatch bounds the requests one writev carries.
const writeBatch = 32

func (l *lane) failure() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// abort makes c's Close reset the connection (SO_LINGER 0) instead of sending what is still
// queued: every byte not yet acknowledged belongs to a request that fails with the lane, and a
// graceful close would still deliver it later — after a partition heals, say, and after newer
// writes to the same memory over another connection, overwriting them with stale bytes.
func abort(c net.Conn) {
	for {
		switch x := c.(type) {
		case interface{ SetLinger(int) error }:
			_ = x.SetLinger(0)
			return
		case interface{ NetConn() net.Conn }: // TLS (auth): the connection under it
			c = x.NetConn()
		default:
			return
		}
	}
}

// fail ends the lane once: every request in flight completes with err.
func (l *lane) fail(err error) {
	l.failOnce.Do(func() {
		l.mu.Lock()
		l.err = err
		pending := l.pending
		l.pending = nil
		l.mu.Unlock()
		close(l.done)
		if len(pending) > 0 {
			abort(l.c)
		}
		_ = l.c.Close() // ending the lane; its goroutines see the error
		for _, p := range pending {
			p.op.Finish(err)
		}
	})
}

func (ep *endpoint) writeLoop(l *lane) {
	defer ep.wg.Done()
	for {
		select {
		case out := <-l.wq:
			l.wmu.Lock()
			var err error
			n := 1
			if len(l.wq) > 0 && l.send == nil && out.dev == nil {
				n, err = l.writeMany(out)
			} else {
				err = l.write(out)
			}
			l.queued.Add(-int32(n)) // under wmu: a poster that then sees zero writes after these
			l.wmu.Unlock()
			if err != nil {
				l.fail(err)
				return
			}
		case <-l.done:
			return
		}
	}
}

func (ep *endpoint) readLoop(l *lane) {
	defer ep.wg.Done()
	var rb [respSize]byte
	for {
		if _, err := io.ReadFull(l.r, rb[:]); err != nil {
			l.fail(fmt.Errorf("tcp: receive: %w", wrapIO(err)))
			return
		}
		r, err := decodeResponse(&rb)
		if err != nil {
			l.fail(err)
			return
		}
		l.mu.Lock()
		p, ok := l.pending[r.id]
		delete(l.pending, r.id)
		l.mu.Unlock()
		if !ok || p.reply != r.op {
			l.fail(fmt.Errorf("tcp: reply %#x for unknown request %d: %w", r.op, r.id, status.ErrProtocol))
			return
		}
		var opErr error
		get := r.op == opGetData
		if r.status != stOK {
			opErr = refused(r.status)
		} else if r.op == opAtomicAck {
			if _, err := io.ReadFull(l.r, p.dst); err != nil {
				err = fmt.Errorf("tcp: receive: %w", wrapIO(err))
				p.op.Finish(err)
				l.fail(err)
				return
			}
		} else if get && p.dsts != nil {
			if err := l.bulk.readv(l.r, nil, p.dsts); err != nil {
				err = fmt.Errorf("tcp: receive: %w", wrapIO(err))
				p.op.Finish(err)
				l.fail(err)
				return
			}
		} else if get && p.dev != nil {
			st, err := devRing(&l.devRecv, p.dev.Place)
			if err == nil {
				err = st.ReceiveInto(l.bulk.connChunks(l.r), *p.dev, p.devOff, p.n)
			}
			if err != nil {
				err = fmt.Errorf("tcp: receive into device memory: %w", wrapIO(err))
				p.op.Finish(err)
				l.fail(err)
				return
			}
		} else if get && p.dst == nil && l.recv != nil {
			if err := l.recv.Receive(l.bulk.connChunks(l.r), p.devOff, p.n); err != nil {
				err = fmt.Errorf("tcp: receive into device memory: %w", wrapIO(err))
				p.op.Finish(err)
				l.fail(err)
				return
			}
		} else if get {
			if err := l.bulk.readConn(l.r, p.dst); err != nil {
				err = fmt.Errorf("tcp: receive: %w", wrapIO(err))
				p.op.Finish(err)
				l.fail(err)
				return
			}
		}
		<-l.slots
		p.op.Finish(opErr)
	}
}

// refused is the error of a request the target refused with status st.
func refused(st uint8) error {
	switch st {
	case stNotFound:
		return fmt.Errorf("tcp: target has no such region (unknown, stale or deregistered): %w", status.ErrNotFound)
	case stMisaligned:
		return fmt.Errorf("tcp: target refused an atomic on a word not 8-byte aligned: %w", status.ErrInvalidConfig)
	default:
		return fmt.Errorf("tcp: target refused the range: %w", status.ErrOutOfRange)
	}
}

// WriteAsync implements transport.RMA: src goes to dst in chunks over the lanes.
func (ep *endpoint) WriteAsync(ctx context.Context, src []byte, dst transport.Remote) (*transport.Op, error) {
	return ep.postRMA(ctx, opPut, src, dst)
}

// ReadAsync implements transport.RMA.
func (ep *endpoint) ReadAsync(ctx context.Context, dst []byte, src transport.Remote) (*transport.Op, error) {
	return ep.postRMA(ctx, opGet, dst, src)
}

// Atomic implements transport.RMA: the target runs op on the word (sync/atomic) and answers
// with its previous value.
func (ep *endpoint) Atomic(ctx context.Context, op buffer.AtomicOp, dst transport.Remote, operand, compare uint64) (uint64, error) {
	if !op.Valid() {
		return 0, fmt.Errorf("tcp: %v: %w", op, status.ErrInvalidConfig)
	}
	r, err := ep.rmaRequest(opAtomic, dst, 8)
	if err != nil {
		return 0, err
	}
	r.aop, r.id = uint8(op), ep.ids.Add(1)
	var payload [atomicPayload]byte
	binary.LittleEndian.PutUint64(payload[0:], operand)
	binary.LittleEndian.PutUint64(payload[8:], compare)
	var old [8]byte
	o := transport.NewOp(1)
	if err := ep.pickLane().post(ctx, r, old[:], 0, nil, o, payload[:]); err != nil {
		return 0, err
	}
	if err := o.Wait(ctx); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(old[:]), nil
}

// rmaRequest starts a request addressed to dst: the server's default region, a key, or an
// address. It needs wire version 2.
func (ep *endpoint) rmaRequest(op uint8, dst transport.Remote, n uint64) (request, error) {
	if ep.version < 2 {
		return request{}, fmt.Errorf("tcp: the target speaks wire version %d, which has no registered regions or atomics: %w",
			ep.version, status.ErrUnsupported)
	}
	r := request{op: op, offset: dst.Addr, length: n}
	switch dst.Key {
	case transport.DefaultRegion:
		r.mode = modeDefault
	case 0:
		r.mode = modeAddr
	default:
		r.mode, r.key = modeKey, uint32(dst.Key)
	}
	if r.offset+n < r.offset {
		return request{}, fmt.Errorf("tcp: %d bytes at %#x wrap around: %w", n, r.offset, status.ErrOutOfRange)
	}
	return r, nil
}

// postRMA posts a transfer between host memory span and a registered region of the target.
func (ep *endpoint) postRMA(ctx context.Context, op uint8, span []byte, remote transport.Remote) (*transport.Op, error) {
	base, err := ep.rmaRequest(op, remote, uint64(len(span)))
	if err != nil {
		return nil, err
	}
	if len(span) == 0 {
		return transport.Succeeded(), nil
	}
	return ep.send(ctx, base, uint64(len(span)), span, 0, nil)
}

// WriteFromDeviceAsync implements transport.DeviceRMA: one request per part (as WriteAsync
// cuts them), whose bytes stream from the device through the lane's ring, the device copies
// overlapping the wire; the target's ring overlaps them with its own copies likewise.
func (ep *endpoint) WriteFromDeviceAsync(ctx context.Context, src memory.Ptr, pl memory.Place, n uint64, dst transport.Remote) (*transport.Op, error) {
	return ep.postDevice(ctx, opPut, transport.DeviceRange{Ptr: src, Place: pl, Size: n}, dst)
}

// ReadToDeviceAsync implements transport.DeviceRMA: the reply's bytes stream into the device
// through the lane's ring.
func (ep *endpoint) ReadToDeviceAsync(ctx context.Context, dst memory.Ptr, pl memory.Place, n uint64, src transport.Remote) (*transport.Op, error) {
	return ep.postDevice(ctx, opGet, transport.DeviceRange{Ptr: dst, Place: pl, Size: n}, src)
}

func (ep *endpoint) postDevice(ctx context.Context, op uint8, local transport.DeviceRange, remote transport.Remote) (*transport.Op, error) {
	if !local.Place.OnDevice() {
		return nil, fmt.Errorf("tcp: %v memory at %#x is not device memory: %w", local.Place, uintptr(local.Ptr), status.ErrInvalidConfig)
	}
	base, err := ep.rmaRequest(op, remote, local.Size)
	if err != nil || local.Size == 0 {
		if err == nil {
			return transport.Succeeded(), nil
		}
		return nil, err
	}
	return ep.send(ctx, base, local.Size, nil, 0, &local)
}

// Vector requests: pieces under vecPieceMax travel together, at most vecSplit's bytes and
// maxPieces to a message (a message per lane in turn, so a large batch still uses every lane);
// larger pieces go on their own, cut into parts as any transfer.
const (
	vecPieceMax = 256 << 10
	vecBytes    = 1 << 20
	vecMin      = 256 << 10
	vecSpread   = 4
)

// vecSplit is the most bytes one vector message of a batch carries, given the batch's small
// bytes (those of its pieces under vecPieceMax): vecBytes, except that a batch of 1 to 4 MiB
// goes as vecSpread messages of at least vecMin on as many lanes, so that the target reads
// some while the rest are sent. Measured one thread at a time over loopback: 2 MiB of 4 KiB
// pieces moved at 3.1-3.7 GB/s in two 1 MiB messages, 3.9-4.4 in four (six pairs); 1 MiB at
// 3.3-3.5 in one, 3.8-4.1 in four; 512 KiB lost in two (2.7-3.3 against 3.3-3.5 in one), so
// smaller batches stay one message.
func vecSplit(small uint64) uint64 {
	if small < vecBytes {
		return vecBytes
	}
	return min(vecBytes, max(vecMin, ((small+vecSpread-1)/vecSpread+4095)&^4095))
}

// WriteVAsync implements transport.VectorRMA: srcs[i] goes to dsts[i], the small pieces many
// to a message (one header and table, one ack), the large ones as WriteAsync sends them. The Op
// completes when every piece has landed, or with the first error. A target that speaks wire
// version 2 gets a request per piece.
func (ep *endpoint) WriteVAsync(ctx context.Context, srcs [][]byte, dsts []transport.Remote) (*transport.Op, error) {
	return ep.postVector(ctx, opPutV, srcs, dsts)
}

// ReadVAsync implements transport.VectorRMA, as WriteVAsync: srcs[i] is read into dsts[i].
func (ep *endpoint) ReadVAsync(ctx context.Context, dsts [][]byte, srcs []transport.Remote) (*transport.Op, error) {
	return ep.postVector(ctx, opGetV, dsts, srcs)
}

func (ep *endpoint) postVector(ctx context.Context, op uint8, bufs [][]byte, remotes []transport.Remote) (*transport.Op, error) {
	if len(bufs) != len(remotes) {
		return nil, fmt.Errorf("tcp: %d buffers for %d remote ranges: %w", len(bufs), len(remotes), status.ErrInvalidConfig)
	}
	single := uint8(opPut)
	if op == opGetV {
		single = opGet
	}
	type message struct {
		idx   []int
		bytes uint64
	}
	var (
		msgs    []message
		singles []int
		reqs    = make([]request, len(bufs))
		parts   int
		small   uint64 // the bytes that go in vector messages
	)
	for _, b := range bufs {
		if n := uint64(len(b)); n < vecPieceMax {
			small += n
		}
	}
	per := vecSplit(small)
	for i, b := range bufs {
		n := uint64(len(b))
		if n == 0 {
			continue
		}
		r, err := ep.rmaRequest(single, remotes[i], n)
		if err != nil {
			return nil, err
		}
		reqs[i] = r
		if ep.version < 3 || n >= vecPieceMax {
			singles = append(singles, i)
			parts += ep.parts(n)
			continue
		}
		if m := len(msgs) - 1; m < 0 || len(msgs[m].idx) == maxPieces || msgs[m].bytes+n > per {
			msgs = append(msgs, message{})
		}
		m := &msgs[len(msgs)-1]
		m.idx, m.bytes = append(m.idx, i), m.bytes+n
	}
	if parts+len(msgs) == 0 {
		return transport.Succeeded(), nil
	}
	o := transport.NewOp(parts + len(msgs))
	left := parts + len(msgs) // parts not yet posted, finished with the error that stops posting
	fail := func(err error) (*transport.Op, error) {
		for range left {
			o.Finish(err)
		}
		return nil, err
	}
	for _, m := range msgs {
		table := make([]byte, len(m.idx)*pieceSize)
		pieces := make([][]byte, len(m.idx))
		for j, i := range m.idx {
			r := reqs[i]
			p := piece{addr: r.offset, length: r.length}
			switch r.mode {
			case modeDefault:
				p.key = uint32(transport.DefaultRegion)
			case modeKey:
				p.key = r.key
			}
			p.encode(table[j*pieceSize:])
			pieces[j] = bufs[i]
		}
		r := request{op: op, id: ep.ids.Add(1), offset: uint64(len(m.idx)), length: m.bytes}
		l := ep.lanes[ep.next.Add(1)%uint64(len(ep.lanes))]
		if err := l.postVector(ctx, r, table, pieces, o); err != nil {
			return fail(err)
		}
		left--
	}
	for _, i := range singles {
		n := uint64(len(bufs[i]))
		k := ep.parts(n)
		left -= k // sendParts finishes its own unposted parts
		if err := ep.sendParts(ctx, reqs[i], n, bufs[i], 0, nil, o); err != nil {
			return fail(err)
		}
	}
	return o, nil
}

// Close fails everything in flight with ErrClosed and waits for the lanes' goroutines.
func (ep *endpoint) Close() error {
	ep.closeOnce.Do(func() {
		for _, l := range ep.lanes {
			l.fail(fmt.Errorf("tcp: endpoint: %w", status.ErrClosed))
		}
		ep.wg.Wait()
		for _, l := range ep.lanes { // the lanes' goroutines are gone: the rings are idle
			if l.send != nil {
				_ = l.send.Close()
				_ = l.recv.Close()
			}
			for _, st := range l.devSend {
				_ = st.Close()
			}
			for _, st := range l.devRecv {
				_ = st.Close()
			}
		}
	})
	ep.wg.Wait()
	return nil
}
