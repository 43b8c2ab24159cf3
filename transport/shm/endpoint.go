package shm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/hmc-go/hmc/auth"
	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/internal/memcopy"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

type endpoint struct {
	cfg    Config
	region *buffer.ConnBuffer // the local region
	local  []byte             // its bytes; nil for device memory (copied by the device's own copies)
	conn   *net.UnixConn
	dead   atomic.Pointer[error]
	wg     sync.WaitGroup
	closeO sync.Once

	mu     sync.RWMutex // copies hold it shared; Close takes it to unmap
	remote []byte       // the target's region, mapped; nil after Close and for device memory
	whole  []byte       // the whole page-rounded mapping behind remote, for munmap
	rsize  uint64       // the target's region size
	open   bool         // false after Close; guarded by mu

	rdev     memory.Ptr   // the target's region when it is device memory, opened through IPC
	rplace   memory.Place // where rdev lives here
	closeDev func() error // unmaps rdev
	lplace   memory.Place // where the local region lives (device when local is nil)

	helpers *helpers // copy goroutines for large transfers; nil with one worker

	unpin func() error // releases the device's page lock on remote (device local regions), or nil

	version uint16 // the link's version: 2 serves region requests
	pid     int    // the target's pid (SO_PEERCRED), for cross-memory attach
	peer    peerRegions
}

// Dial connects to a target's socket, receives its memfd and maps it.
func (t *Transport) Dial(ctx context.Context, cfg transport.DialConfig) (transport.Endpoint, error) {
	if cfg.Local == nil {
		return nil, fmt.Errorf("shm: dial without a local region: %w", status.ErrInvalidConfig)
	}
	local := cfg.Local.Bytes() // nil for device memory: copied with the device's H2D/D2H into the peer's mapping
	lplace := memory.HostPlace
	if local == nil {
		var err error
		if lplace, err = memory.LocateRange(cfg.Local.Ptr(), cfg.Local.Size()); err != nil {
			return nil, fmt.Errorf("shm: local region: %w", err)
		}
	}
	myBoot, err := BootID()
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", cfg.Addr)
	if err != nil {
		if cerr := status.FromContext(ctx); cerr != nil {
			return nil, fmt.Errorf("shm: dial %s: %w", cfg.Addr, cerr)
		}
		return nil, fmt.Errorf("shm: dial %s: %w: %w", cfg.Addr, status.ErrFailed, err)
	}
	c := nc.(*net.UnixConn)
	if cfg.ListenPort < 0 || cfg.ListenPort > 65535 {
		_ = c.Close()
		return nil, fmt.Errorf("shm: listen port %d: %w", cfg.ListenPort, status.ErrInvalidConfig)
	}
	// Whoever holds the socket's name gets our hello and would get our puts: a process of
	// another user that took the name first is refused before anything is sent.
	cred, err := t.cfg.peers().Check(c)
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("shm: dial %s: %w", cfg.Addr, err)
	}
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(t.cfg.HandshakeTimeout)
	}
	if _, err := auth.Client(c, t.cfg.Auth.Local(), "shm", dl); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("shm: %s: %w", cfg.Addr, err)
	}
	whole, err := t.handshake(ctx, c, hello{rank: cfg.Rank, listenPort: uint16(cfg.ListenPort), ip: cfg.LocalIP}, myBoot, cred.PID)
	if err != nil {
		_ = c.Close() // the handshake failed; its error is reported
		return nil, fmt.Errorf("shm: %s: %w", cfg.Addr, err)
	}
	ep := &endpoint{cfg: t.cfg, region: cfg.Local, local: local, conn: c, whole: whole.mapping, remote: whole.region,
		rsize: whole.size, open: true, rdev: whole.dev, rplace: whole.devPlace, closeDev: whole.closeDev,
		version: whole.version, pid: cred.PID, lplace: memory.HostPlace}
	ep.peer.version, ep.peer.pid = whole.version, cred.PID
	ep.peer.init()
	if local == nil {
		ep.lplace = lplace
	}
	if local == nil && ep.remote != nil {
		// Device copies into and out of pageable memory run at a fraction of the link's rate
		// (H100: 12 vs 54 GB/s device-to-host at 4 MiB), so the peer's mapping is page-locked
		// for this device, as RDMA registration pins a region. Where that fails the copies
		// still work, through the driver's own staging.
		if int64(len(ep.remote)) <= t.cfg.DevicePinMax {
			if unpin, err := cfg.Local.Memory().PinHost(ep.remote); err == nil {
				ep.unpin = unpin
			} else {
				t.cfg.Logger.Debug("shm: peer region not page-locked", "addr", cfg.Addr, "err", err)
			}
		}
	}
	workers := t.cfg.Workers
	if workers == 0 {
		workers = min(runtime.GOMAXPROCS(0), 8)
	}
	ep.helpers = newHelpers(workers-1, t.cfg.HelperSpin)
	ep.wg.Add(1)
	go ep.watch() // owned by ep: Close closes the link and waits
	return ep, nil
}

type mapping struct {
	mapping, region []byte
	version         uint16 // the handshake's: the version the link runs
	size            uint64 // the region's size

	// A device region, opened through its IPC handle (region and mapping are then nil).
	dev      memory.Ptr
	devPlace memory.Place
	closeDev func() error
}

// handshake sends the hello and takes the offer of the target (of process pid): its memfd
// mapped, or its device region opened.
func (t *Transport) handshake(ctx context.Context, c *net.UnixConn, h hello, myBoot [bootIDSize]byte, pid int) (mapping, error) {
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(t.cfg.HandshakeTimeout)
	}
	_ = c.SetDeadline(dl)
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	if _, err := c.Write(h.encode()); err != nil {
		return mapping{}, fmt.Errorf("%w: %w", status.ErrPeerClosed, err)
	}
	b := make([]byte, offerSize)
	oob := make([]byte, unix.CmsgSpace(4*4)) // room for a few descriptors, so extras are seen and closed
	n, oobn, _, _, err := c.ReadMsgUnix(b, oob)
	if err != nil {
		return mapping{}, fmt.Errorf("%w: %w", status.ErrPeerClosed, err)
	}
	fds := parseRights(oob[:oobn])
	defer func() {
		for _, fd := range fds {
			_ = unix.Close(fd) // the mapping (if any) keeps the memory; descriptors are not needed
		}
	}()
	if n < offerSize { // the rest of the offer may follow in another read
		var m int
		m, err = io.ReadFull(c, b[n:])
		n += m
	}
	if aerr := auth.Refusal(b[:n], "target"); aerr != nil {
		return mapping{}, aerr // the target demands a secret; this side has none
	}
	if err != nil {
		return mapping{}, fmt.Errorf("%w: %w", status.ErrPeerClosed, err)
	}
	o, err := decodeOffer(b)
	if err != nil {
		return mapping{}, err
	}
	if o.bootID != myBoot {
		return mapping{}, fmt.Errorf("target runs on another kernel (boot id %q): %w", o.bootID, status.ErrUnsupported)
	}
	if o.flags&offerDevice != 0 {
		return openDeviceOffer(c, o, fds, pid)
	}
	if len(fds) != 1 {
		return mapping{}, fmt.Errorf("offer carried %d descriptors, want 1: %w", len(fds), status.ErrProtocol)
	}
	m, err := mapRegion(fds[0], 0, o.size)
	m.version, m.size = o.version, o.size
	return m, err
}

// openDeviceOffer reads a device region's record after its offer and opens its IPC handle
// (with the emulated GPU's memfd, the one descriptor that came; none for a real device's).
func openDeviceOffer(c *net.UnixConn, o offer, fds []int, pid int) (mapping, error) {
	var b [devRecordSize]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return mapping{}, fmt.Errorf("device record: %w: %w", status.ErrPeerClosed, err)
	}
	d, err := decodeDevRecord(b[:])
	if err != nil {
		return mapping{}, err
	}
	if o.size == 0 || d.size-d.offset < o.size {
		return mapping{}, fmt.Errorf("device region of %d bytes at offset %d of a %d-byte allocation: %w", o.size, d.offset, d.size, status.ErrProtocol)
	}
	h := d.handle(pid, -1)
	want := 0
	if d.emulated {
		want = 1
	}
	if len(fds) != want {
		return mapping{}, fmt.Errorf("device offer carried %d descriptors, want %d: %w", len(fds), want, status.ErrProtocol)
	}
	if d.emulated {
		h.FD = fds[0]
	}
	p, pl, closeDev, err := memory.OpenIPC(h)
	if err != nil {
		return mapping{}, fmt.Errorf("opening the target's device region: %w", err)
	}
	return mapping{version: o.version, size: o.size, dev: p, devPlace: pl, closeDev: closeDev}, nil
}

func parseRights(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for _, m := range msgs {
		if r, err := unix.ParseUnixRights(&m); err == nil {
			fds = append(fds, r...)
		}
	}
	return fds
}

// mapRegion maps the target's memfd after checking what the target declared against what the
// descriptor is: a peer's declaration is peer input.
func mapRegion(fd int, off, size uint64) (mapping, error) {
	if size == 0 || size > 1<<46 || off > 1<<46 {
		return mapping{}, fmt.Errorf("declared region of %d bytes: %w", size, status.ErrProtocol)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || uint64(st.Size) < off+size {
		return mapping{}, fmt.Errorf("descriptor is not a regular file of at least %d bytes: %w", off+size, status.ErrProtocol)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || seals&unix.F_SEAL_SHRINK == 0 {
		return mapping{}, fmt.Errorf("target memfd's size is not sealed (seals %#x): it could shrink under the mapping: %w", seals, status.ErrProtocol)
	}
	page := uint64(os.Getpagesize())
	start := off &^ (page - 1) // mmap's offset is page-aligned; the region starts lead bytes in
	lead := off - start
	mapped := (lead + size + page - 1) &^ (page - 1)
	m, err := unix.Mmap(fd, int64(start), int(mapped), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return mapping{}, fmt.Errorf("mmap: %w: %w", status.ErrFailed, err)
	}
	return mapping{mapping: m, region: m[lead : lead+size : lead+size]}, nil
}

// watch reads the link until it ends (the target exited or closed its server): on a version-2
// link it also hands the target's answers to region requests to the requester.
func (ep *endpoint) watch() {
	defer ep.wg.Done()
	var err error
	if ep.version >= 2 {
		err = ep.peer.readReplies(ep.conn)
	} else {
		var one [1]byte
		_, err = ep.conn.Read(one[:])
	}
	if err == nil || errors.Is(err, io.EOF) {
		err = io.EOF
	}
	e := fmt.Errorf("shm: target gone: %w: %w", status.ErrPeerClosed, err)
	ep.dead.CompareAndSwap(nil, &e)
	ep.peer.linkDown()
}

func (ep *endpoint) RemoteSize() uint64 {
	ep.mu.RLock()
	defer ep.mu.RUnlock()
	return ep.rsize
}

// PutAsync copies at once; the returned Op is already complete.
func (ep *endpoint) PutAsync(ctx context.Context, localOff, remoteOff, n uint64) (*transport.Op, error) {
	return ep.copyOp(ctx, true, localOff, remoteOff, n)
}

// GetAsync copies at once; the returned Op is already complete.
func (ep *endpoint) GetAsync(ctx context.Context, localOff, remoteOff, n uint64) (*transport.Op, error) {
	return ep.copyOp(ctx, false, localOff, remoteOff, n)
}

func (ep *endpoint) copyOp(ctx context.Context, put bool, localOff, remoteOff, n uint64) (*transport.Op, error) {
	ep.mu.RLock()
	defer ep.mu.RUnlock()
	if e := ep.dead.Load(); e != nil {
		return nil, *e
	}
	if !ep.open {
		return nil, fmt.Errorf("shm: endpoint: %w", status.ErrClosed)
	}
	if err := transport.CheckRanges(ep.region.Size(), ep.rsize, localOff, remoteOff, n); err != nil {
		return nil, fmt.Errorf("shm: %w", err)
	}
	if err := status.FromContext(ctx); err != nil {
		return nil, err
	}
	if ep.rdev != 0 { // the target's device memory: one driver copy from or to the local region
		l := ep.region.Ptr() + memory.Ptr(localOff)
		if err := copyDevice(put, ep.rdev+memory.Ptr(remoteOff), ep.rplace, l, ep.lplace, n); err != nil {
			return nil, fmt.Errorf("shm: device copy: %w", err)
		}
		return transport.Succeeded(), nil
	}
	if ep.local == nil { // one device copy between the local GPU region and the peer's mapping
		r := ep.remote[remoteOff : remoteOff+n]
		var err error
		if put {
			err = ep.region.ReadToCPU(r, localOff)
		} else {
			err = ep.region.WriteFromCPU(r, localOff)
		}
		if err != nil {
			return nil, fmt.Errorf("shm: device copy: %w", err)
		}
		return transport.Succeeded(), nil
	}
	l, r := ep.local[localOff:localOff+n], ep.remote[remoteOff:remoteOff+n]
	if put {
		ep.copy(r, l)
	} else {
		ep.copy(l, r)
	}
	return transport.Succeeded(), nil
}

// copy copies src to dst, splitting large copies across the endpoint's helper goroutines. The
// caller copies pieces from the job's front and helpers from its back when they pick it up
// (claim): a helper that comes late finds little or nothing left, so a slow wake-up (tens of
// µs on a VM) never delays the copy beyond the piece it is working on, and the caller waits
// only for pieces already claimed. Helpers spin for a while after each job (HelperSpin), so
// back-to-back large copies find them awake.
//
// Both spins (the helpers' and the caller's wait for claimed pieces) stay out of the scheduler:
// with runtime.Gosched the spinning goroutine keeps passing through the global run queue, and
// when the caller is a C thread (libhmc.so: its P sits in syscall state between calls) sysmon
// then hands that P to another thread; the returning caller finds no P, queues behind the
// helper, and the helper ends up without one. Python's puts ran at half the CLI's speed that
// way (4 MiB: 80 µs per put, helper idle in most of them; with plain spins 46 µs, as the CLI).
//
// The caller's wait is bounded (claimWait), then parks until the last piece is done, and its
// spin makes a function call per turn. Both matter: a helper preempted mid-piece needs a P, and
// the caller must give its own up. A call-free spin relies on asynchronous preemption, which a
// C thread calling libhmc.so can lose: as we read runtime/signal_unix.go (Go 1.26), a preemption
// signal that lands while the thread is back in C returns without clearing the M's
// signal-pending flag, after which no further signal is sent to it. Python's bench hung that way
// in 2 of 8 runs on the H100 machine: the caller spinning on one P, the GC worker on the other
// waiting to scan the caller's stack, the helper it waited for runnable with no P
// (GODEBUG=schedtrace). TestCopyWithoutAsyncPreemption recreates it with asyncpreemptoff=1.
func (ep *endpoint) copy(dst, src []byte) { copyWith(&ep.cfg, ep.helpers, dst, src) }

func copyWith(cfg *Config, h *helpers, dst, src []byte) {
	n := uint64(len(src))
	big := n > cfg.HugeCopy/2 // far beyond the caches: Go's non-temporal copy wins
	if n < cfg.ParallelThreshold || h == nil {
		pieceCopy(dst, src, cfg.PieceSize, big)
		return
	}
	start := time.Now()
	shared := h.choice.pick(n, start)
	if shared {
		workers := uint64(cap(h.jobs) + 1)
		piece := max(cfg.PieceSize, (n/(workers*4)+4095)&^4095)
		h.share(&copyJob{dst: dst, src: src, n: n, big: big, pieceMin: cfg.PieceSize,
			piece: piece, units: uint32((n + piece - 1) / piece)}, int(workers-1))
	} else {
		pieceCopy(dst, src, cfg.PieceSize, big)
	}
	h.choice.record(n, shared, start, time.Now())
}

// Copier copies host memory the way the endpoints copy into and out of a peer's mapping:
// glibc's memcpy for pieces that fit the caches, Go's non-temporal copy for huge ones, split
// across helper goroutines from Config.ParallelThreshold. The fabric faces use it for copies
// through co-located peers' memory that they mapped themselves.
type Copier struct {
	cfg     Config
	helpers *helpers
}

// NewCopier starts a Copier with cfg's copy settings (Workers, HelperSpin, ParallelThreshold,
// PieceSize, HugeCopy).
func NewCopier(cfg Config) (*Copier, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	workers := cfg.Workers
	if workers == 0 {
		workers = min(runtime.GOMAXPROCS(0), 8)
	}
	return &Copier{cfg: cfg, helpers: newHelpers(workers-1, cfg.HelperSpin)}, nil
}

// Copy copies src into dst (len(src) bytes; dst must be as long). Safe for concurrent use.
func (c *Copier) Copy(dst, src []byte) { copyWith(&c.cfg, c.helpers, dst[:len(src)], src) }

// CopyV copies srcs[i] into dsts[i] for every i, the pieces shared among the helpers when
// they add up to a parallel copy's worth (a batch of discrete pieces, each too small to split).
// Each piece is as long as the shorter of its two ranges: an empty range is a piece to skip.
func (c *Copier) CopyV(dsts, srcs [][]byte) { copyVWith(&c.cfg, c.helpers, dsts, srcs) }

func copyVWith(cfg *Config, h *helpers, dsts, srcs [][]byte) {
	var n uint64
	for i, s := range srcs {
		n += uint64(min(len(s), len(dsts[i])))
	}
	if n < cfg.ParallelThreshold || h == nil || len(srcs) < 2 {
		copyEach(cfg, dsts, srcs) // no job to make
		return
	}
	runV(cfg, h, &copyJob{vd: dsts, vs: srcs}, n, len(srcs))
}

// copyEach copies the pieces of a CopyV on the caller alone.
func copyEach(cfg *Config, dsts, srcs [][]byte) {
	for i, s := range srcs {
		m := min(len(s), len(dsts[i]))
		pieceCopy(dsts[i][:m], s[:m], cfg.PieceSize, uint64(m) > cfg.HugeCopy/2)
	}
}

// Close stops the helpers; Copy must not be called after.
func (c *Copier) Close() { c.helpers.close() }

// claimWait bounds the caller's spin for pieces that helpers are still copying: a few pieces'
// worth. Beyond it the caller parks, which costs a wake-up (tens of µs) but frees its P.
const claimWait = 200 * time.Microsecond

type copyJob struct {
	dst, src []byte
	n, piece uint64
	pieceMin uint64
	big      bool
	ends     atomic.Uint64 // the unclaimed units [front, back): front in the low 32 bits (claim)
	units    uint32        // the job's units: pieces of piece bytes, or a vector's pieces
	left     atomic.Int64  // bytes still to copy, or a vector job's pieces (share)
	done     chan struct{} // closed by whoever takes left to 0
	vd, vs   [][]byte      // a vector job (CopyV): pieces claimed whole, by index
	group    int64         // a vector job's pieces per claim

	// An addressed vector job (an endpoint's one-region vector): piece k is locs[k] and as many
	// bytes of rmem at rems[k].Addr-rbase (checked before), copied into rmem when toRemote,
	// out of it otherwise.
	locs     [][]byte
	rems     []transport.Remote
	rmem     []byte
	rbase    uint64
	toRemote bool
}

// runV copies the vector job j (a CopyV's lists, or an endpoint's one-region vector: total
// bytes in pieces pieces) on the caller, or shared with the helpers in claims of about a piece
// size (PieceSize, at least one piece) when the pieces add up to a parallel copy's worth and
// sharing has been paying (choiceV).
func runV(cfg *Config, h *helpers, j *copyJob, total uint64, pieces int) {
	j.pieceMin = cfg.PieceSize
	if total < cfg.ParallelThreshold || h == nil || pieces < 2 || uint64(pieces) > math.MaxUint32 {
		j.solo(cfg)
		return
	}
	start := time.Now()
	shared := h.choiceV.pick(total, start)
	if shared {
		j.group = int64(max(1, cfg.PieceSize/max(1, total/uint64(pieces))))
		j.units = uint32(pieces)
		h.share(j, min(cap(h.jobs), pieces-1))
	} else {
		j.solo(cfg)
	}
	h.choiceV.record(total, shared, start, time.Now())
}

// solo copies every piece of the vector job j on the caller alone.
func (j *copyJob) solo(cfg *Config) {
	if j.locs != nil {
		j.copyPieces(0, len(j.locs), true, cfg.HugeCopy/2)
	} else {
		copyEach(cfg, j.vd, j.vs)
	}
}

// copyPieces copies the addressed job's pieces [from, to). On the
// caller alone (solo) a piece over half bytes is copied as a large one, as copyEach does;
// shared, as workV copies a CopyV's.
func (j *copyJob) copyPieces(from, to int, solo bool, half uint64) {
	locs, rems, rmem, rbase, piece := j.locs[from:to], j.rems[from:to], j.rmem, j.rbase, j.pieceMin
	// The common piece is copied here rather than two calls down (pieceCopy, memcopy.Copy):
	// each call after a `rep movsb` waits on the copy's stores, and the two took ~5 % of a
	// 512 × 4 KiB batch's CPU (perf record of hmc trans bench).
	movsb := memcopy.HaveMovsb
	for k, l := range locs {
		if len(l) == 0 {
			continue
		}
		n := uint64(len(l))
		off := rems[k].Addr - rbase
		r := rmem[off : off+n]
		dst, src := l, r
		if j.toRemote {
			dst, src = r, l
		}
		if movsb && n >= memcopy.MovsbMin && n < libcMin { // a KV block: pieceCopy's choice, in place
			memcopy.Movsb(unsafe.Pointer(unsafe.SliceData(dst)), unsafe.Pointer(unsafe.SliceData(src)), uintptr(n))
			continue
		}
		pieceCopy(dst, src, piece, solo && n > half)
	}
}

// claim takes up to g of the job's unclaimed units, from the front for the caller and from the
// back for a helper, and returns them as [from, to) (empty when none is left). A vector job's
// claims (g > 1) are guided: a quarter of what is left, at least an eighth of g, so that the
// cores' last claims are small and end together; with claims of g throughout, the caller of a
// 512 × 4 KiB batch (four claims of 128 pieces) often finished its half and then waited for the
// helper's last 512 KiB (the caller's wait loop was ~3 % of both cores' time), and guided
// claims took that batch from 0.74-0.75 of one contiguous copy to 0.84 (`hmc trans bench
// --protocol shm --batch-size 512 --block-size 4KiB`, old and new binaries interleaved, medians
// of six and eight; busy the same, 16 and 64 KiB blocks and the KV layouts unchanged). Taking
// the two ends keeps each core on the same part of the job from one copy to the next, so that a
// batch copied again and again finds its bytes in that core's caches: with one shared cursor
// the parts changed hands copy to copy, and a 2 MiB vector of 4 KiB pieces shared by two cores
// of a 2 MiB-L2 VM took 67.5 µs (median of six runs of BenchmarkVector) where it takes 59.7
// from the two ends; one 2 MiB copy 54.6 and 52.0.
func (j *copyJob) claim(g uint32, back bool) (from, to uint32) {
	for {
		s := j.ends.Load()
		f, b := uint32(s), uint32(s>>32)
		if f >= b {
			return 0, 0
		}
		k := g
		if g > 1 { // guided: a quarter of what is left, down to an eighth of g
			k = min(g, max(g/8, (b-f)/4, 1))
		}
		if back {
			from, to = f, b
			if b-f > k {
				from = b - k
			}
			if j.ends.CompareAndSwap(s, uint64(f)|uint64(from)<<32) {
				return from, to
			}
		} else {
			from, to = f, b
			if b-f > k {
				to = f + k
			}
			if j.ends.CompareAndSwap(s, uint64(to)|uint64(b)<<32) {
				return from, to
			}
		}
	}
}

// workV copies whole pieces of a vector job until none is left, claiming them up to group
// pieces at a time (a claim per piece would bounce the job's counters between the cores for
// every small block of a KV batch).
func (j *copyJob) workV(back bool) {
	g := uint32(min(max(j.group, 1), math.MaxUint32))
	for {
		i, e := j.claim(g, back)
		if i >= e {
			return
		}
		if j.locs != nil {
			j.copyPieces(int(i), int(e), false, 0)
		} else {
			for k := i; k < e; k++ {
				m := min(len(j.vs[k]), len(j.vd[k]))
				pieceCopy(j.vd[k][:m], j.vs[k][:m], j.pieceMin, j.big)
			}
		}
		// A vector job counts pieces, not bytes: a claim of empty pieces (a piece moved on its
		// own has none here) counted nothing when it counted bytes, and the caller, done once
		// every byte was, returned and reused its lists while this loop still read them.
		if j.left.Add(-int64(e-i)) == 0 { // only the claim that takes left to 0 closes done
			close(j.done)
		}
	}
}

// work copies pieces of j until none is left to claim: the caller from the job's front, a
// helper (back) from its back.
func (j *copyJob) work(back bool) {
	if j.vd != nil || j.locs != nil {
		j.workV(back)
		return
	}
	for {
		i, e := j.claim(1, back)
		if i >= e {
			return
		}
		off := uint64(i) * j.piece
		end := min(off+j.piece, j.n)
		pieceCopy(j.dst[off:end], j.src[off:end], j.pieceMin, j.big)
		if j.left.Add(-int64(end-off)) == 0 {
			close(j.done)
		}
	}
}

// helpers are an endpoint's copy goroutines: GOMAXPROCS-1 of them (at most Workers-1). Whether
// a copy is shared with them or made by the caller alone is chosen per copy (chooser.go).
type helpers struct {
	jobs chan *copyJob
	spin time.Duration
	stop chan struct{}
	wg   sync.WaitGroup

	// choice learns contiguous copies, choiceV vectors of pieces: a vector shares less well
	// than one copy of its bytes (a piece per claim's edge), and one history for both let a
	// run of contiguous copies set the way for the vectors that followed (a batch of 512 x 4
	// KiB blocks timed 23 or 29 µs run to run by which copies had come before).
	choice, choiceV chooser
}

// share copies j on the caller and up to n helpers and waits for every piece.
func (h *helpers) share(j *copyJob, n int) {
	if j.vd != nil || j.locs != nil {
		j.left.Store(int64(j.units)) // a vector job: pieces (workV)
	} else {
		j.left.Store(int64(j.n)) // bytes
	}
	j.ends.Store(uint64(j.units) << 32)
	j.done = make(chan struct{})
	for range n {
		select {
		case h.jobs <- j:
		default: // helpers busy with an earlier job's tail: do without them
		}
	}
	j.work(false)
	for until := time.Now().Add(claimWait); j.left.Load() != 0; { // pieces claimed by helpers
		if !time.Now().Before(until) { // time.Now is also the loop's preemption point
			<-j.done
			return
		}
	}
}

func newHelpers(n int, spin time.Duration) *helpers {
	if n < 1 {
		return nil
	}
	h := &helpers{jobs: make(chan *copyJob, n), spin: spin, stop: make(chan struct{})}
	for range n {
		h.wg.Add(1)
		go h.run() // owned by the endpoint: Close stops and waits for them
	}
	return h
}

func (h *helpers) run() {
	defer h.wg.Done()
	for {
		var j *copyJob
		until := time.Now().Add(h.spin)
		for j == nil {
			// The spin reads the channel's length, which takes no lock: polling it with a
			// select took the lock the caller's send needs (lock2 and unlock2 were 3 % of a
			// batch process's CPU, all of it this loop's).
			if len(h.jobs) > 0 {
				select {
				case j = <-h.jobs:
					continue
				default: // another helper took it
				}
			}
			if time.Now().Before(until) {
				continue // a plain spin: see copy's comment on why not runtime.Gosched
			}
			select { // idle: park until the next job
			case j = <-h.jobs:
			case <-h.stop:
				return
			}
		}
		j.work(true)
	}
}

func (h *helpers) close() {
	if h != nil {
		close(h.stop)
		h.wg.Wait()
	}
}

// libcMin is the smallest copy handed to glibc: below it the call through purego (about half
// a microsecond) costs more than glibc's copy saves over Go's (BenchmarkSmallCopies: Go's copy
// is as fast from 16 KiB to 1 MiB), which matters for batches of discrete pieces.
const libcMin = 1 << 20

// pieceCopy copies src to dst: from libcMin with glibc's memcpy when it is loadable and the
// transfer is not far beyond the caches (`rep movsb`, faster than Go's AVX loop there), from
// memcopy.MovsbMin with `rep movsb` itself (memcopy.Copy: a KV batch of 512 x 4 KiB between
// two memfd mappings takes 22 µs instead of 24.5 on two cores, BenchmarkVector), else with
// Go's copy (non-temporal stores from 1 MiB: best for data far larger than the caches), in
// pieces of piece bytes when the data should stay cache-resident.
func pieceCopy(dst, src []byte, piece uint64, big bool) {
	n := uint64(len(src))
	if n == 0 {
		return
	}
	if !big && n >= libcMin {
		if mc := libcMemcpy(); mc != nil {
			mc(unsafe.Pointer(unsafe.SliceData(dst)), unsafe.Pointer(unsafe.SliceData(src)), uintptr(n))
			return
		}
	}
	if !big && n >= memcopy.MovsbMin && n < libcMin && memcopy.HaveMovsb {
		dst = dst[:n] // as long as src (every caller's pieces are): checked, not assumed
		memcopy.Movsb(unsafe.Pointer(unsafe.SliceData(dst)), unsafe.Pointer(unsafe.SliceData(src)), uintptr(n))
		return
	}
	if big || n <= piece {
		copy(dst, src)
		return
	}
	for off := uint64(0); off < n; off += piece {
		end := min(off+piece, n)
		copy(dst[off:end], src[off:end])
	}
}

// Close unmaps the target's region (after copies in progress) and closes the liveness link.
func (ep *endpoint) Close() error {
	ep.closeO.Do(func() {
		e := fmt.Errorf("shm: endpoint: %w", status.ErrClosed)
		ep.dead.CompareAndSwap(nil, &e)
		ep.peer.stop()
		_ = ep.conn.Close() // ends watch
		ep.wg.Wait()
		ep.helpers.close()
		ep.peer.close() // the region mappings, after every copy (copies hold mu shared)
		ep.mu.Lock()
		ep.open = false
		if ep.remote != nil {
			if ep.unpin != nil {
				_ = ep.unpin() // before the unmap; the error (a driver's) changes nothing here
			}
			_ = unix.Munmap(ep.whole) // copies hold mu shared: none is running
			ep.remote, ep.whole = nil, nil
		}
		if ep.closeDev != nil {
			_ = ep.closeDev() // copies hold mu shared: none is running
			ep.closeDev, ep.rdev = nil, 0
		}
		ep.mu.Unlock()
	})
	return nil
}
