package shm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
)

// The control page: a memfd of ctlSlots 8-byte words that a server shares with every
// initiator that resolves one of its registered regions. A region a peer resolved has one word
// while it is registered: its low 32 bits count the peers' operations in flight on the region,
// bits 32-62 are the word's generation, and ctlDead marks the region deregistered. A peer adds
// one before it touches the region and subtracts it after, and gives up if it finds ctlDead or
// (version-3 links) another generation than its answer named; the owner's Deregister sets
// ctlDead and waits for the count to drain (the Table fence), so no peer copy runs into memory
// that was deregistered — one-sided, the owner's CPU never takes part in a transfer.
//
// A drained word is reused for a later region with the next generation, so a process that
// registers a buffer per request serves peers for ever (without reuse, 131,072 regions over its
// life were its last). The generation is what keeps a peer that still caches the old region
// out of the new one. A word a version-2 peer was given (it does not check generations) is
// never reused.
const (
	ctlSlots = 1 << 17 // 1 MiB of words
	ctlDead  = uint64(1) << 63
	ctlCount = uint64(1)<<32 - 1
	genShift = 32
	genMax   = 1<<31 - 1
)

// genOf is the generation in control word v.
func genOf(v uint64) uint32 { return uint32(v>>genShift) & genMax }

// regionServer serves a server's region table to its initiators.
type regionServer struct {
	table  *buffer.Table
	ctl    []byte // the control page, mapped
	ctlFD  int
	pid    int
	remove func() // removes the fence
	log    *slog.Logger

	mu    sync.Mutex
	slots map[buffer.Key]slotUse // guarded by mu: the words of live regions peers resolved
	free  []uint32               // guarded by mu: drained words, ready for reuse
	next  uint32                 // guarded by mu: the first word never used
}

// slotUse is a region's word in the control page.
type slotUse struct {
	slot, gen uint32
	legacy    bool // a version-2 peer has it: never reuse it
}

func newRegionServer(t *buffer.Table, log *slog.Logger) (*regionServer, error) {
	fd, err := unix.MemfdCreate("hmc-shm-control", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("shm: control page: %w: %w", status.ErrFailed, err)
	}
	size := ctlSlots * 8
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("shm: control page: %w: %w", status.ErrFailed, err)
	}
	_, _ = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL)
	m, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("shm: control page: %w: %w", status.ErrFailed, err)
	}
	rs := &regionServer{table: t, ctl: m, ctlFD: fd, pid: os.Getpid(), slots: make(map[buffer.Key]slotUse), log: log}
	rs.remove = t.AddFence(rs.fence)
	return rs, nil
}

func (rs *regionServer) close() {
	rs.remove()
	_ = unix.Munmap(rs.ctl)
	_ = unix.Close(rs.ctlFD)
}

// slot returns region r's word and its generation, giving it one on first use (a drained
// word when there is one); legacy says the asking peer runs a version-2 link. It refuses a
// region already deregistered (notFound): its fence may have run, and would not mark a word
// given now.
func (rs *regionServer) slot(r *buffer.Region, legacy bool) (s, gen uint32, st uint8) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if r.Deregistered() {
		return 0, 0, lstNotFound
	}
	if u, ok := rs.slots[r.Key()]; ok {
		if legacy && !u.legacy {
			u.legacy = true
			rs.slots[r.Key()] = u
		}
		return u.slot, u.gen, lstOK
	}
	var busy []uint32
	defer func() { rs.free = append(rs.free, busy...) }()
	for len(rs.free) > 0 {
		s = rs.free[len(rs.free)-1]
		rs.free = rs.free[:len(rs.free)-1]
		w := word(rs.ctl, s)
		// A peer that still caches the word's last region may be between its add and its
		// subtract (it then backs out): take the word only with no count in it.
		if v := w.Load(); v&ctlCount == 0 {
			gen = (genOf(v) + 1) & genMax
			if w.CompareAndSwap(v, uint64(gen)<<genShift) {
				rs.slots[r.Key()] = slotUse{slot: s, gen: gen, legacy: legacy}
				return s, gen, lstOK
			}
		}
		busy = append(busy, s)
	}
	if rs.next == ctlSlots {
		return 0, 0, lstNoSlot
	}
	s = rs.next
	rs.next++
	rs.slots[r.Key()] = slotUse{slot: s, legacy: legacy} // a fresh word: zero, generation 0
	return s, 0, lstOK
}

// fence marks region r dead for peers and waits for their operations on it to end; its word
// is then free for another region. Peers run in other processes, so their count is polled (a
// futex would save the polling; a deregistration is rare and short).
func (rs *regionServer) fence(ctx context.Context, r *buffer.Region) error {
	rs.mu.Lock()
	u, ok := rs.slots[r.Key()]
	rs.mu.Unlock()
	if !ok {
		return nil // no peer resolved it (and slot refuses it from now on: it is dead)
	}
	w := word(rs.ctl, u.slot)
	w.Or(ctlDead)
	for w.Load()&ctlCount != 0 {
		if err := status.FromContext(ctx); err != nil {
			rs.mu.Lock()
			delete(rs.slots, r.Key()) // the word stays dead and counted: never reused
			rs.mu.Unlock()
			return fmt.Errorf("shm: peers' operations on region %d still in flight: %w", r.Key(), err)
		}
		time.Sleep(20 * time.Microsecond)
	}
	rs.mu.Lock()
	if u, ok = rs.slots[r.Key()]; ok { // legacy may have been set meanwhile
		delete(rs.slots, r.Key())
		if !u.legacy {
			rs.free = append(rs.free, u.slot)
		}
	}
	rs.mu.Unlock()
	return nil
}

// word returns slot s of a control page.
func word(ctl []byte, s uint32) *atomic.Uint64 {
	w, err := memory.Word64(ctl, uint64(s)*8)
	if err != nil { // s < ctlSlots and the page is page-aligned: cannot happen
		panic(err)
	}
	return w
}

// answer handles one region request of the link (of version ver) of the peer of rank peer;
// fds are the descriptors to send with the reply, owned those of them to close once sent.
// controlSent says whether this link already has the control page. A region not published to
// the peer is not found; a device region is answered with its IPC handle (version 4; earlier
// peers are told it does not exist, as they could not reach it).
func (rs *regionServer) answer(peer uint32, q linkReq, controlSent bool, ver uint16) (resp linkResp, fds, owned []int) {
	gens := ver >= 3
	resp = linkResp{op: lopResolved, id: q.id}
	if q.op == lopAtomic {
		resp.op = lopAtomicOK
	}
	if rs == nil {
		resp.status = lstNotFound
		return resp, nil, nil
	}
	var (
		reg *buffer.Region
		off uint64
		err error
	)
	if q.key != 0 {
		off = q.addr
		reg, err = rs.table.LookupFor(peer, buffer.Key(q.key), q.addr, q.length)
	} else {
		reg, off, err = rs.table.FindFor(peer, q.addr, q.length)
	}
	if err != nil {
		resp.status = lstNotFound
		if errors.Is(err, status.ErrOutOfRange) {
			resp.status = lstOutOfRange
		}
		return resp, nil, nil
	}
	defer reg.Release()
	resp.key = uint32(reg.Key())
	if reg.OnDevice() {
		switch {
		case ver < 4:
			resp.status = lstNotFound
			return resp, nil, nil
		case q.op == lopAtomic:
			resp.status = lstMisaligned // no device word is reachable from the host
			return resp, nil, nil
		}
		h, err := memory.ExportIPC(memory.Ptr(reg.Addr()), reg.Place())
		if err != nil {
			rs.log.Warn("shm: a device region cannot be shared with a peer", "region", reg.Key(), "err", err)
			resp.status = lstDevice
			return resp, nil, nil
		}
		resp.flags |= lflagDevice
		resp.dev = recordOf(h)
		if h.Emulated() {
			resp.flags |= lflagRegionFD
			fds = append(fds, h.FD)
			owned = append(owned, h.FD)
		}
	}
	if q.op == lopAtomic {
		old, err := buffer.Atomic(reg.Bytes(), off, buffer.AtomicOp(q.aop), q.operand, q.compare)
		if err != nil {
			resp.status = lstMisaligned
		}
		resp.addr = old
		return resp, nil, nil
	}
	s, gen, st := rs.slot(reg, !gens)
	if st != lstOK {
		resp.status = st
		closeFDs(owned)
		return linkResp{op: resp.op, id: resp.id, key: resp.key, status: st}, nil, nil
	}
	resp.addr, resp.size, resp.slot = reg.Addr(), reg.Size(), s
	if gens {
		resp.gen = gen
	}
	if fd, fdOff := reg.FD(); fd >= 0 && !reg.OnDevice() {
		resp.flags |= lflagRegionFD
		resp.fdOff = fdOff
		fds = append(fds, fd)
	}
	if !controlSent {
		resp.flags |= lflagControlFD
		fds = append(fds, rs.ctlFD)
	}
	return resp, fds, owned
}
