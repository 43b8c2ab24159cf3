package shm

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// peerRegion is a region of the target that this endpoint resolved: mapped from its memfd, or
// reached with cross-memory attach when it has none.
type peerRegion struct {
	key        buffer.Key
	addr, size uint64
	mem        []byte       // the region in our mapping; nil: cross-memory attach or device memory
	whole      []byte       // the mapping, for munmap
	dev        memory.Ptr   // device memory: the region opened here through its IPC handle
	devPlace   memory.Place // where dev lives here
	closeDev   func() error // unmaps dev

	pinMu    sync.Mutex     // guards pinned and unpin
	pinned   bool           // a device copy asked to page-lock mem (once)
	unpin    func() error   // releases mem's page lock, or nil
	slot     *atomic.Uint64 // its word in the target's control page
	gen      uint32         // the word's generation when the target gave it (checked on version-3 links)
	checkGen bool

	local sync.RWMutex // copies hold it shared; dropping the mapping takes it
}

// peerRegions caches the target's regions this endpoint resolved, by key and by address, and
// carries its region requests on the link.
type peerRegions struct {
	version uint16 // the link's version: 3 checks slot generations
	pid     int    // the target's process id (SO_PEERCRED)

	sweepAt int // guarded by mu: the cache size at which add sweeps out deregistered regions
	mu      sync.Mutex
	index   transport.RegionIndex[*peerRegion] // guarded by mu
	ctl     []byte                             // the target's control page, mapped; guarded by mu
	closed  bool                               // guarded by mu

	reqMu   sync.Mutex     // one request on the link at a time
	ids     atomic.Uint64  // request ids
	replies chan linkReply // the link reader's answers (capacity 1)
	down    chan struct{}  // closed when the link ends
	downO   sync.Once
	quit    chan struct{} // closed by the endpoint's Close: the link reader stops handing answers
	quitO   sync.Once
}

// linkReply is one answer read from the link, with the descriptors that came with it.
type linkReply struct {
	resp linkResp
	fds  []int
}

func (p *peerRegions) init() {
	p.replies = make(chan linkReply, 1)
	p.down = make(chan struct{})
	p.quit = make(chan struct{})
}

func (p *peerRegions) stop() { p.quitO.Do(func() { close(p.quit) }) }

func (p *peerRegions) linkDown() { p.downO.Do(func() { close(p.down) }) }

// readReplies reads the target's answers until the link ends, and hands each to the waiting
// requester (one at a time). An answer nobody waits for any more (its requester gave up) is
// dropped, its descriptors closed.
func (p *peerRegions) readReplies(c *net.UnixConn) error {
	var b [linkRespSize]byte
	oob := make([]byte, unix.CmsgSpace(4*4))
	for {
		n, oobn, _, _, err := c.ReadMsgUnix(b[:], oob)
		if err != nil {
			return err
		}
		fds := parseRights(oob[:oobn])
		if n < linkRespSize {
			if _, err := io.ReadFull(c, b[n:]); err != nil {
				closeFDs(fds)
				return err
			}
		}
		resp, err := decodeLinkResp(&b)
		if err == nil && p.version < 3 && resp.gen != 0 {
			err = fmt.Errorf("shm: a generation in an answer on a version-%d link: %w", p.version, status.ErrProtocol)
		}
		if err == nil && resp.flags&lflagDevice != 0 {
			var d [devRecordSize]byte
			if p.version < 4 {
				err = fmt.Errorf("shm: a device region on a version-%d link: %w", p.version, status.ErrProtocol)
			} else if _, err = io.ReadFull(c, d[:]); err == nil {
				resp.dev, err = decodeDevRecord(d[:])
			}
		}
		if err != nil {
			closeFDs(fds)
			return err
		}
		if fds, err = p.takeControl(&resp, fds); err != nil {
			return err
		}
		select { // a requester that gave up leaves its answer here; the next one discards it by id
		case p.replies <- linkReply{resp, fds}:
		case <-p.quit:
			closeFDs(fds)
			return nil
		}
	}
}

// takeControl maps the target's control page when resp carries it (the last descriptor) and
// returns the descriptors left for the requester. The link reader does this as it reads, in the
// target's order: the one answer that carries the page may belong to a requester that gave up,
// or be handed over after a later answer is, and every region needs the page.
func (p *peerRegions) takeControl(resp *linkResp, fds []int) ([]int, error) {
	if resp.flags&lflagControlFD == 0 {
		return fds, nil
	}
	want := 1
	if resp.flags&lflagRegionFD != 0 {
		want = 2
	}
	if len(fds) < want {
		closeFDs(fds)
		return nil, fmt.Errorf("shm: region answer names a descriptor that did not come: %w", status.ErrProtocol)
	}
	ctlFD := fds[want-1]
	rest := fds[:want-1]
	closeFDs(fds[want:])
	defer unix.Close(ctlFD) // the mapping keeps the page
	resp.flags &^= lflagControlFD
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ctl != nil || p.closed {
		return rest, nil
	}
	m, err := mapRegion(ctlFD, 0, ctlSlots*8)
	if err != nil {
		closeFDs(rest)
		return nil, fmt.Errorf("shm: control page: %w", err)
	}
	p.ctl = m.mapping
	return rest, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd) // received descriptors we do not keep
	}
}

// request sends q on the link and waits for its answer (ctx bounds the wait).
func (p *peerRegions) request(ctx context.Context, c *net.UnixConn, q linkReq) (linkReply, error) {
	p.reqMu.Lock()
	defer p.reqMu.Unlock()
	q.id = p.ids.Add(1)
	var b [linkReqSize]byte
	q.encode(&b)
	for { // drop answers to requests whose requester gave up
		select {
		case r := <-p.replies:
			closeFDs(r.fds)
			continue
		default:
		}
		break
	}
	if _, err := c.Write(b[:]); err != nil {
		return linkReply{}, fmt.Errorf("shm: region request: %w: %w", status.ErrPeerClosed, err)
	}
	for {
		select {
		case r := <-p.replies:
			if r.resp.id != q.id {
				closeFDs(r.fds)
				continue
			}
			return r, nil
		case <-p.down:
			return linkReply{}, fmt.Errorf("shm: region request: target gone: %w", status.ErrPeerClosed)
		case <-ctx.Done():
			return linkReply{}, fmt.Errorf("shm: region request: %w", status.FromContext(ctx))
		}
	}
}

// lookup returns the cached region holding n bytes at dst, and the offset there.
func (p *peerRegions) lookup(dst transport.Remote, n uint64) (*peerRegion, uint64, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.index.Lookup(dst, n)
}

// add caches a region the target described (mapping its memfd if one came), unless already.
func (p *peerRegions) add(resp linkResp, fds []int) (*peerRegion, error) {
	defer closeFDs(fds) // a mapping keeps the memory; the descriptors are not needed
	regionFD := -1
	if resp.flags&lflagRegionFD != 0 {
		if len(fds) == 0 {
			return nil, fmt.Errorf("shm: region answer names a descriptor that did not come: %w", status.ErrProtocol)
		}
		regionFD = fds[0]
	}
	if resp.size == 0 || resp.addr+resp.size < resp.addr || resp.slot >= ctlSlots || resp.key == 0 {
		return nil, fmt.Errorf("shm: region answer [%#x, +%d) slot %d: %w", resp.addr, resp.size, resp.slot, status.ErrProtocol)
	}
	var stale []*peerRegion // regions forgotten below, unmapped after mu (once no copy uses them)
	defer func() {
		for _, old := range stale {
			old.local.Lock()
			old.unmap()
			old.local.Unlock()
		}
	}()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, fmt.Errorf("shm: endpoint: %w", status.ErrClosed)
	}
	if p.ctl == nil { // the link reader maps it from the first answer, which carries it
		return nil, fmt.Errorf("shm: region answer before the control page: %w", status.ErrProtocol)
	}
	key := buffer.Key(resp.key)
	if r, ok := p.index.Get(key); ok {
		return r, nil // another requester cached it meanwhile
	}
	r := &peerRegion{key: key, addr: resp.addr, size: resp.size, slot: word(p.ctl, resp.slot), gen: resp.gen, checkGen: p.version >= 3}
	if resp.flags&lflagDevice != 0 {
		d := resp.dev
		if d.size-d.offset < resp.size {
			return nil, fmt.Errorf("shm: device region %d of %d bytes at offset %d of a %d-byte allocation: %w", key, resp.size, d.offset, d.size, status.ErrProtocol)
		}
		h := d.handle(p.pid, -1)
		if d.emulated {
			if regionFD < 0 {
				return nil, fmt.Errorf("shm: an emulated device region without its descriptor: %w", status.ErrProtocol)
			}
			h.FD = regionFD
		}
		dev, pl, closeDev, err := memory.OpenIPC(h)
		if err != nil {
			return nil, fmt.Errorf("shm: opening device region %d of the target: %w", key, err)
		}
		r.dev, r.devPlace, r.closeDev = dev, pl, closeDev
	} else if regionFD >= 0 {
		m, err := mapRegion(regionFD, resp.fdOff, resp.size)
		if err != nil {
			return nil, fmt.Errorf("shm: region %d: %w", key, err)
		}
		r.mem, r.whole = m.region, m.mapping
	}
	// The target may have deregistered a cached region this one overlaps (it tells nobody: the
	// cache learns it from the control word) and registered the memory again: forget those.
	for _, old := range p.index.Overlapping(r.addr, r.size) {
		if !old.stale() {
			break // a live one: Add says the target contradicts itself
		}
		p.index.Remove(old.key)
		stale = append(stale, old)
	}
	// Deregistered regions nobody touches again would stay cached, each holding a mapping of
	// memory the target has freed: sweep them out whenever the cache has doubled since the
	// last sweep (amortized, at most twice the live regions are kept).
	if p.index.Len() >= p.sweepAt {
		for _, old := range p.index.All() {
			if old.stale() {
				p.index.Remove(old.key)
				stale = append(stale, old)
			}
		}
		p.sweepAt = max(2*p.index.Len(), minSweep)
	}
	if err := p.index.Add(key, r.addr, r.size, r); err != nil {
		r.unmap()
		return nil, fmt.Errorf("shm: %w", err)
	}
	return r, nil
}

// minSweep is the smallest cache that add sweeps for deregistered regions.
const minSweep = 64

// stale says whether the target deregistered r (its control word says so; it may since have
// gone to another region).
func (r *peerRegion) stale() bool { return r.staleAt(r.slot.Load()) }

// staleAt says whether control word v (r's word, read now) marks r deregistered: dead, or on a
// version-3 link given to another region since.
func (r *peerRegion) staleAt(v uint64) bool {
	return v&ctlDead != 0 || r.checkGen && genOf(v) != r.gen
}

// drop forgets a region the target deregistered and unmaps it once no copy uses it.
func (p *peerRegions) drop(r *peerRegion) {
	p.mu.Lock()
	if cur, ok := p.index.Get(r.key); ok && cur == r {
		p.index.Remove(r.key)
	}
	p.mu.Unlock()
	r.local.Lock()
	r.unmap()
	r.local.Unlock()
}

func (r *peerRegion) unmap() {
	r.pinMu.Lock()
	if r.unpin != nil {
		_ = r.unpin() // before the munmap; a driver's error changes nothing here
		r.unpin = nil
	}
	r.pinMu.Unlock()
	if r.closeDev != nil {
		_ = r.closeDev() // r is out of the cache and nobody copies
		r.closeDev, r.dev = nil, 0
	}
	if r.whole != nil {
		_ = unix.Munmap(r.whole) // r is out of the cache and nobody copies: none can fault
		r.whole, r.mem = nil, nil
	}
}

// close unmaps every region and the control page; called by the endpoint's Close after the
// link reader is gone.
func (p *peerRegions) close() {
	p.mu.Lock()
	regs := p.index.Reset()
	p.closed = true
	ctl := p.ctl
	p.ctl = nil
	p.mu.Unlock()
	for _, r := range regs {
		r.local.Lock()
		r.unmap()
		r.local.Unlock()
	}
	if ctl != nil {
		_ = unix.Munmap(ctl) // every region is unmapped: no slot is in use
	}
}

// errDeregistered is what an operation on a region the target deregistered fails with.
func errDeregistered(k buffer.Key) error {
	return fmt.Errorf("shm: region %d: deregistered by the target: %w", k, status.ErrNotFound)
}

// enter marks an operation on r in flight in the target's control page, or reports the region
// deregistered (then drops it). The caller calls exit after its copy.
func (ep *endpoint) enter(r *peerRegion) error {
	if r.staleAt(r.slot.Add(1)) {
		r.slot.Add(^uint64(0))
		ep.peer.drop(r)
		return errDeregistered(r.key)
	}
	r.local.RLock()
	if enteredHook != nil {
		enteredHook(r)
	}
	return nil
}

// enteredHook, when set (tests), runs each time an operation has entered a region.
var enteredHook func(r *peerRegion)

func exit(r *peerRegion) {
	r.local.RUnlock()
	r.slot.Add(^uint64(0))
}

// enterResolved resolves dst and enters its region (the caller exits it). A region named by
// address that the cache held but the target deregistered is resolved once more: the address
// may belong to a region registered since.
func (ep *endpoint) enterResolved(ctx context.Context, dst transport.Remote, n uint64) (*peerRegion, uint64, error) {
	for try := 0; ; try++ {
		r, off, err := ep.resolve(ctx, dst, n)
		if err != nil {
			return nil, 0, err
		}
		if err := ep.enter(r); err != nil {
			if dst.Key != 0 || try > 0 {
				return nil, 0, err
			}
			continue
		}
		return r, off, nil
	}
}

// resolve finds the target's region for n bytes at dst, asking the target on a cache miss.
func (ep *endpoint) resolve(ctx context.Context, dst transport.Remote, n uint64) (*peerRegion, uint64, error) {
	if r, off, ok := ep.peer.lookup(dst, n); ok {
		return r, off, nil
	}
	if ep.version < 2 {
		return nil, 0, fmt.Errorf("shm: the target speaks link version %d, which has no registered regions: %w", ep.version, status.ErrUnsupported)
	}
	q := linkReq{op: lopResolveAddr, addr: dst.Addr, length: n}
	if dst.Key != 0 {
		q.op, q.key = lopResolveKey, uint32(dst.Key)
	}
	rep, err := ep.peer.request(ctx, ep.conn, q)
	if err != nil {
		return nil, 0, err
	}
	if rep.resp.status != lstOK {
		closeFDs(rep.fds)
		return nil, 0, linkRefusal(rep.resp.status)
	}
	r, err := ep.peer.add(rep.resp, rep.fds)
	if err != nil {
		return nil, 0, err
	}
	off := dst.Addr
	if dst.Key == 0 {
		off = dst.Addr - r.addr
	}
	if err := buffer.CheckRange(r.size, off, n); err != nil { // the target checked; so do we
		return nil, 0, fmt.Errorf("shm: region %d: %w", r.key, err)
	}
	return r, off, nil
}

// linkRefusal is the error of a region request the target refused with status st.
func linkRefusal(st uint8) error {
	switch st {
	case lstOutOfRange:
		return fmt.Errorf("shm: target refused the range: %w", status.ErrOutOfRange)
	case lstMisaligned:
		return fmt.Errorf("shm: target refused an atomic on a word not 8-byte aligned: %w", status.ErrInvalidConfig)
	case lstNoSlot:
		return fmt.Errorf("shm: the target serves %d regions to peers already, its most: %w", ctlSlots, status.ErrUnsupported)
	case lstDevice:
		return fmt.Errorf("shm: the region is device memory the target could not export to this process (its log says why): %w", status.ErrUnsupported)
	default:
		return fmt.Errorf("shm: target has no such region (unknown, stale or deregistered): %w", status.ErrNotFound)
	}
}

// usable checks the endpoint before an RMA operation; the caller holds mu shared.
func (ep *endpoint) usable(ctx context.Context) error {
	if e := ep.dead.Load(); e != nil {
		return *e
	}
	if !ep.open {
		return fmt.Errorf("shm: endpoint: %w", status.ErrClosed)
	}
	return status.FromContext(ctx)
}

// WriteAsync implements transport.RMA: one copy into the target's mapping (or one
// process_vm_writev for a region without a memfd), by this process alone; the returned Op is
// complete.
func (ep *endpoint) WriteAsync(ctx context.Context, src []byte, dst transport.Remote) (*transport.Op, error) {
	return ep.rma(ctx, true, src, dst)
}

// ReadAsync implements transport.RMA, as WriteAsync.
func (ep *endpoint) ReadAsync(ctx context.Context, dst []byte, src transport.Remote) (*transport.Op, error) {
	return ep.rma(ctx, false, dst, src)
}

func (ep *endpoint) rma(ctx context.Context, write bool, b []byte, remote transport.Remote) (*transport.Op, error) {
	ep.mu.RLock()
	defer ep.mu.RUnlock()
	if err := ep.usable(ctx); err != nil {
		return nil, err
	}
	return ep.rmaHeld(ctx, write, b, remote)
}

// rmaHeld is rma for a caller that holds ep.mu shared and checked the endpoint.
func (ep *endpoint) rmaHeld(ctx context.Context, write bool, b []byte, remote transport.Remote) (*transport.Op, error) {
	n := uint64(len(b))
	if remote.Key == transport.DefaultRegion {
		if err := buffer.CheckRange(ep.rsize, remote.Addr, n); err != nil {
			return nil, fmt.Errorf("shm: %w", err)
		}
		if ep.rdev != 0 {
			if err := copyDevice(write, ep.rdev+memory.Ptr(remote.Addr), ep.rplace, memory.Ptr(memory.AddrOf(b)), memory.HostPlace, n); err != nil {
				return nil, fmt.Errorf("shm: device copy: %w", err)
			}
			return transport.Succeeded(), nil
		}
		m := ep.remote[remote.Addr : remote.Addr+n]
		if write {
			ep.copy(m, b)
		} else {
			ep.copy(b, m)
		}
		return transport.Succeeded(), nil
	}
	if n == 0 {
		return transport.Succeeded(), nil
	}
	r, off, err := ep.enterResolved(ctx, remote, n)
	if err != nil {
		return nil, err
	}
	defer exit(r)
	if r.dev != 0 {
		if err := copyDevice(write, r.dev+memory.Ptr(off), r.devPlace, memory.Ptr(memory.AddrOf(b)), memory.HostPlace, n); err != nil {
			return nil, fmt.Errorf("shm: device region %d: %w", r.key, err)
		}
		return transport.Succeeded(), nil
	}
	if r.mem != nil {
		m := r.mem[off : off+n]
		if write {
			ep.copy(m, b)
		} else {
			ep.copy(b, m)
		}
		return transport.Succeeded(), nil
	}
	p, err := OpenProcess(ep.pid)
	if err == nil {
		if write {
			err = p.Write(uintptr(r.addr+off), b)
		} else {
			err = p.Read(b, uintptr(r.addr+off))
		}
	}
	if err != nil {
		return nil, fmt.Errorf("shm: region %d (cross-memory attach): %w", r.key, err)
	}
	return transport.Succeeded(), nil
}

// Atomic implements transport.RMA: sync/atomic on the word in the target's mapping, which is
// atomic with respect to the target's and every other peer's atomics on it. A region without a
// memfd has no shared mapping: the target runs the atomic for us (a request on the link).
func (ep *endpoint) Atomic(ctx context.Context, op buffer.AtomicOp, dst transport.Remote, operand, compare uint64) (uint64, error) {
	if !op.Valid() {
		return 0, fmt.Errorf("shm: %v: %w", op, status.ErrInvalidConfig)
	}
	ep.mu.RLock()
	defer ep.mu.RUnlock()
	if err := ep.usable(ctx); err != nil {
		return 0, err
	}
	if dst.Key == transport.DefaultRegion {
		if ep.rdev != 0 {
			return 0, fmt.Errorf("shm: the target's region is device memory: atomics reach host memory only: %w", status.ErrUnsupported)
		}
		old, err := buffer.Atomic(ep.remote, dst.Addr, op, operand, compare)
		if err != nil {
			return 0, fmt.Errorf("shm: %w", err)
		}
		return old, nil
	}
	r, off, err := ep.enterResolved(ctx, dst, 8)
	if err != nil {
		return 0, err
	}
	if r.dev != 0 {
		exit(r)
		return 0, fmt.Errorf("shm: region %d is device memory: atomics reach host memory only: %w", r.key, status.ErrUnsupported)
	}
	if r.mem != nil {
		old, err := buffer.Atomic(r.mem, off, op, operand, compare)
		exit(r)
		if err != nil {
			return 0, fmt.Errorf("shm: region %d: %w", r.key, err)
		}
		return old, nil
	}
	exit(r) // no mapping: the target runs it, and checks the region itself
	rep, err := ep.peer.request(ctx, ep.conn, linkReq{op: lopAtomic, aop: uint8(op), key: uint32(r.key), addr: off, length: 8,
		operand: operand, compare: compare})
	if err != nil {
		return 0, err
	}
	closeFDs(rep.fds)
	if rep.resp.status != lstOK {
		return 0, linkRefusal(rep.resp.status)
	}
	return rep.resp.addr, nil
}

// ShareRegion implements transport.RegionSharer: it asks the target for the region holding n
// bytes at r and returns a duplicate of its memfd (the endpoint caches the region too).
func (ep *endpoint) ShareRegion(ctx context.Context, r transport.Remote, n uint64) (transport.SharedRegion, error) {
	ep.mu.RLock()
	defer ep.mu.RUnlock()
	if err := ep.usable(ctx); err != nil {
		return transport.SharedRegion{}, err
	}
	if ep.version < 2 {
		return transport.SharedRegion{}, fmt.Errorf("shm: the target speaks link version %d, which has no registered regions: %w", ep.version, status.ErrUnsupported)
	}
	q := linkReq{op: lopResolveAddr, addr: r.Addr, length: n}
	if r.Key != 0 {
		q.op, q.key = lopResolveKey, uint32(r.Key)
	}
	rep, err := ep.peer.request(ctx, ep.conn, q)
	if err != nil {
		return transport.SharedRegion{}, err
	}
	if rep.resp.status != lstOK {
		closeFDs(rep.fds)
		return transport.SharedRegion{}, linkRefusal(rep.resp.status)
	}
	if rep.resp.flags&lflagDevice != 0 {
		closeFDs(rep.fds)
		return transport.SharedRegion{}, fmt.Errorf("shm: region at %#x is device memory, which is not mapped into host memory: %w", rep.resp.addr, status.ErrUnsupported)
	}
	if rep.resp.flags&lflagRegionFD == 0 || len(rep.fds) == 0 {
		closeFDs(rep.fds)
		return transport.SharedRegion{}, fmt.Errorf("shm: region at %#x has no memfd to share: %w", rep.resp.addr, status.ErrUnsupported)
	}
	dup, err := unix.FcntlInt(uintptr(rep.fds[0]), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		closeFDs(rep.fds)
		return transport.SharedRegion{}, fmt.Errorf("shm: dup: %w: %w", status.ErrFailed, err)
	}
	sr := transport.SharedRegion{FD: dup, FDOffset: rep.resp.fdOff, Addr: rep.resp.addr, Size: rep.resp.size}
	if _, err := ep.peer.add(rep.resp, rep.fds); err != nil { // closes rep.fds
		_ = unix.Close(dup)
		return transport.SharedRegion{}, err
	}
	return sr, nil
}

// copyDevice copies n bytes between the target's memory at remote (at rp) and this process's
// at local (at lp): into the target when write.
func copyDevice(write bool, remote memory.Ptr, rp memory.Place, local memory.Ptr, lp memory.Place, n uint64) error {
	if write {
		return memory.CopyPlaced(remote, rp, local, lp, n)
	}
	return memory.CopyPlaced(local, lp, remote, rp, n)
}

// WriteFromDeviceAsync implements transport.DeviceRMA: n bytes of this process's device memory
// at src (at pl) go straight into the target's memory (its mapping, or its device memory
// opened through IPC: one device copy), by this process alone.
func (ep *endpoint) WriteFromDeviceAsync(ctx context.Context, src memory.Ptr, pl memory.Place, n uint64, dst transport.Remote) (*transport.Op, error) {
	return ep.rmaDevice(ctx, true, src, pl, n, dst)
}

// ReadToDeviceAsync implements transport.DeviceRMA, as WriteFromDeviceAsync.
func (ep *endpoint) ReadToDeviceAsync(ctx context.Context, dst memory.Ptr, pl memory.Place, n uint64, src transport.Remote) (*transport.Op, error) {
	return ep.rmaDevice(ctx, false, dst, pl, n, src)
}

func (ep *endpoint) rmaDevice(ctx context.Context, write bool, local memory.Ptr, lp memory.Place, n uint64, remote transport.Remote) (*transport.Op, error) {
	ep.mu.RLock()
	defer ep.mu.RUnlock()
	if err := ep.usable(ctx); err != nil {
		return nil, err
	}
	if remote.Key == transport.DefaultRegion {
		if err := buffer.CheckRange(ep.rsize, remote.Addr, n); err != nil {
			return nil, fmt.Errorf("shm: %w", err)
		}
		rp, rpl := memory.Ptr(memory.AddrOf(ep.remote)), memory.HostPlace
		if ep.rdev != 0 {
			rp, rpl = ep.rdev, ep.rplace
		}
		if err := copyDevice(write, rp+memory.Ptr(remote.Addr), rpl, local, lp, n); err != nil {
			return nil, fmt.Errorf("shm: %w", err)
		}
		return transport.Succeeded(), nil
	}
	if n == 0 {
		return transport.Succeeded(), nil
	}
	r, off, err := ep.enterResolved(ctx, remote, n)
	if err != nil {
		return nil, err
	}
	defer exit(r)
	switch {
	case r.dev != 0:
		err = copyDevice(write, r.dev+memory.Ptr(off), r.devPlace, local, lp, n)
	case r.mem != nil:
		ep.pinForDevice(r, lp)
		err = copyDevice(write, memory.Ptr(memory.AddrOf(r.mem))+memory.Ptr(off), memory.HostPlace, local, lp, n)
	default: // host memory without a memfd: through a host bounce and cross-memory attach
		err = ep.bounceCMA(write, r.addr+off, local, lp, n)
	}
	if err != nil {
		return nil, fmt.Errorf("shm: region %d: %w", r.key, err)
	}
	return transport.Succeeded(), nil
}

// bounceCMA moves n bytes between device memory here and the target's host memory at addr
// that has no memfd, through a host chunk and cross-memory attach.
func (ep *endpoint) bounceCMA(write bool, addr uint64, local memory.Ptr, lp memory.Place, n uint64) error {
	p, err := OpenProcess(ep.pid)
	if err != nil {
		return err
	}
	chunk := make([]byte, min(n, 1<<20))
	for done := uint64(0); done < n; {
		k := min(uint64(len(chunk)), n-done)
		c := chunk[:k]
		cp := memory.Ptr(memory.AddrOf(c))
		if write {
			if err := memory.CopyPlaced(cp, memory.HostPlace, local+memory.Ptr(done), lp, k); err != nil {
				return err
			}
			if err := p.Write(uintptr(addr+done), c); err != nil {
				return err
			}
		} else {
			if err := p.Read(c, uintptr(addr+done)); err != nil {
				return err
			}
			if err := memory.CopyPlaced(local+memory.Ptr(done), lp, cp, memory.HostPlace, k); err != nil {
				return err
			}
		}
		done += k
	}
	return nil
}

// pinForDevice page-locks r's mapping for the device at lp the first time a device copy uses it
// (copies into pageable memory run at a fraction of the link's rate: H100, 12 vs 54 GB/s
// device-to-host at 4 MiB), unless it exceeds DevicePinMax. A failure only costs speed.
func (ep *endpoint) pinForDevice(r *peerRegion, lp memory.Place) {
	r.pinMu.Lock()
	defer r.pinMu.Unlock()
	if r.pinned {
		return
	}
	r.pinned = true
	if ep.cfg.DevicePinMax < 0 || int64(len(r.mem)) > ep.cfg.DevicePinMax {
		return
	}
	unpin, err := memory.PinHostFor(lp, r.mem)
	if err != nil {
		ep.cfg.Logger.Debug("shm: peer region not page-locked", "region", r.key, "err", err)
		return
	}
	r.unpin = unpin
}

// vecScratch holds a vector copy's list of mapped ranges between calls: a KV batch of 512
// blocks made 12 KiB of it per call, a garbage collection every few milliseconds at tens of
// thousands of batches a second, whose mark worker takes a P from the copy.
type vecScratch struct{ mapped [][]byte }

var vecPool = sync.Pool{New: func() any { return new(vecScratch) }}

// put clears the list (it must not keep the pieces' memory alive) and pools it. The copy is
// complete: no helper reads it after (a helper that comes late finds every piece claimed).
func (v *vecScratch) put() {
	clear(v.mapped)
	v.mapped = v.mapped[:0]
	vecPool.Put(v)
}

// holds says whether r, a region with a mapping, holds the n bytes rem names, and at which
// offset in its mapping.
func (r *peerRegion) holds(rem transport.Remote, n uint64) (uint64, bool) {
	if rem.Key == 0 {
		off := rem.Addr - r.addr
		return off, rem.Addr >= r.addr && off <= r.size && n <= r.size-off
	}
	return rem.Addr, rem.Key == r.key && rem.Addr <= r.size && n <= r.size-rem.Addr
}

// oneRegion is rmaVector's fast path, for a vector whose pieces all lie in one mapped region
// and name it the same way (by address, or by its key), as a KV batch's blocks do: one pass
// checks every piece and adds up the bytes, and the copy finds each piece's range in the
// mapping from its remote address, so no list of mapped ranges is built and read back (a
// transfer engine batch of 512 blocks: 6.2 -> 5.4 µs at 64 bytes, 23.9 -> 23.1 at 4 KiB,
// medians of ten interleaved runs). It reports false, having moved nothing, for any other
// vector: the general path then moves it, or names the piece it refuses. Caller holds ep.mu
// shared.
func (ep *endpoint) oneRegion(ctx context.Context, write bool, bufs [][]byte, remotes []transport.Remote) bool {
	first := 0
	for first < len(bufs) && len(bufs[first]) == 0 {
		first++
	}
	if first == len(bufs) || remotes[first].Key == transport.DefaultRegion {
		return false
	}
	r, _, err := ep.enterResolved(ctx, remotes[first], uint64(len(bufs[first])))
	if err != nil {
		return false
	}
	defer exit(r)
	if r.mem == nil || r.dev != 0 {
		return false // moved piece by piece (cross-memory attach, device memory)
	}
	key, base := r.key, uint64(0) // named by key: Addr is an offset in the region
	if remotes[first].Key == 0 {
		key, base = 0, r.addr // named by address
	}
	var total uint64
	for i, b := range bufs[first:] {
		n, rem := uint64(len(b)), remotes[first+i]
		if n == 0 {
			continue
		}
		if off := rem.Addr - base; rem.Key != key || rem.Addr < base || off > r.size || n > r.size-off {
			return false
		}
		total += n
	}
	j := &copyJob{locs: bufs, rems: remotes, rmem: r.mem, rbase: base, toRemote: write}
	runV(&ep.cfg, ep.helpers, j, total, len(bufs))
	return true
}

// WriteVAsync implements transport.VectorRMA: the pieces are copied into the target's mappings
// as one vector copy (shared among the endpoint's copy goroutines when they add up to a parallel
// copy's worth: a batch of blocks each too small to split), each region looked up and marked in
// flight once for all its pieces. The Op is complete on return.
func (ep *endpoint) WriteVAsync(ctx context.Context, srcs [][]byte, dsts []transport.Remote) (*transport.Op, error) {
	return ep.rmaVector(ctx, true, srcs, dsts)
}

// ReadVAsync implements transport.VectorRMA, as WriteVAsync.
func (ep *endpoint) ReadVAsync(ctx context.Context, dsts [][]byte, srcs []transport.Remote) (*transport.Op, error) {
	return ep.rmaVector(ctx, false, dsts, srcs)
}

func (ep *endpoint) rmaVector(ctx context.Context, write bool, bufs [][]byte, remotes []transport.Remote) (*transport.Op, error) {
	if len(bufs) != len(remotes) {
		return nil, fmt.Errorf("shm: %d buffers for %d remote ranges: %w", len(bufs), len(remotes), status.ErrInvalidConfig)
	}
	ep.mu.RLock()
	defer ep.mu.RUnlock()
	if err := ep.usable(ctx); err != nil {
		return nil, err
	}
	if ep.oneRegion(ctx, write, bufs, remotes) {
		return transport.Succeeded(), nil
	}
	var entered []*peerRegion // every region entered for this vector, exited after the copy
	defer func() {
		for _, r := range entered {
			exit(r)
		}
	}()
	// mapped[i] is piece i's range in the target's mapping, nil where the piece is empty or
	// was moved on its own: the caller's list is the vector copy's other side as it is.
	v := vecPool.Get().(*vecScratch)
	mapped := slices.Grow(v.mapped[:0], len(bufs))[:len(bufs)]
	defer func() {
		v.mapped = mapped // grown: kept for the next vector
		v.put()
	}()
	var last *peerRegion // the region the previous piece was in: a KV batch's next piece mostly is
	for i, b := range bufs {
		n := uint64(len(b))
		rem := remotes[i]
		mapped[i] = nil
		if n == 0 {
			continue
		}
		r, off := last, uint64(0)
		alone := rem.Key == transport.DefaultRegion
		if !alone {
			var in bool
			if r != nil {
				off, in = r.holds(rem, n)
			}
			for j := len(entered) - 1; !in && j >= 0; j-- {
				r = entered[j]
				off, in = r.holds(rem, n)
			}
			if !in {
				var err error
				if r, off, err = ep.enterResolved(ctx, rem, n); err != nil {
					return nil, fmt.Errorf("shm: piece %d: %w", i, err)
				}
				if alone = r.mem == nil || r.dev != 0; alone {
					// rmaHeld enters the region itself: kept entered here as well, its
					// r.local would be read-locked twice by this goroutine, and a
					// deregistration waiting for the lock in between would deadlock both.
					exit(r)
				} else {
					entered = append(entered, r)
				}
			}
		}
		if alone {
			// The default region, device regions and regions reached by cross-memory attach:
			// this piece on its own, as RMA moves it (ep.mu is held).
			if _, err := ep.rmaHeld(ctx, write, b, rem); err != nil {
				return nil, fmt.Errorf("shm: piece %d: %w", i, err)
			}
			continue
		}
		last = r
		mapped[i] = r.mem[off : off+n : off+n]
	}
	if write {
		copyVWith(&ep.cfg, ep.helpers, mapped, bufs)
	} else {
		copyVWith(&ep.cfg, ep.helpers, bufs, mapped)
	}
	return transport.Succeeded(), nil
}
