package shm

import (
	"context"
	"errors"
	"fmt"
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
// initiator that resolves one of its registered regions. Each such region gets one word for
// life (keys are never reused): its low bits count the peers' operations in flight on the
// region, ctlDead marks it deregistered. A peer adds one before it touches the region and
// subtracts it after, and gives up if it finds ctlDead; the owner's Deregister sets ctlDead and
// waits for the count to drain (the Table fence), so no peer copy runs into memory that was
// deregistered — one-sided, the owner's CPU never takes part in a transfer.
const (
	ctlSlots = 1 << 17 // 1 MiB of words
	ctlDead  = uint64(1) << 63
)

// regionServer serves a server's region table to its initiators.
type regionServer struct {
	table  *buffer.Table
	ctl    []byte // the control page, mapped
	ctlFD  int
	pid    int
	remove func() // removes the fence

	mu    sync.Mutex
	slots map[buffer.Key]uint32 // guarded by mu
	next  uint32                // guarded by mu
}

func newRegionServer(t *buffer.Table) (*regionServer, error) {
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
	rs := &regionServer{table: t, ctl: m, ctlFD: fd, pid: os.Getpid(), slots: make(map[buffer.Key]uint32)}
	rs.remove = t.AddFence(rs.fence)
	return rs, nil
}

func (rs *regionServer) close() {
	rs.remove()
	_ = unix.Munmap(rs.ctl)
	_ = unix.Close(rs.ctlFD)
}

// slot returns region k's word, giving it one on first use.
func (rs *regionServer) slot(k buffer.Key) (uint32, bool) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if s, ok := rs.slots[k]; ok {
		return s, true
	}
	if rs.next == ctlSlots {
		return 0, false
	}
	s := rs.next
	rs.next++
	rs.slots[k] = s
	return s, true
}

// fence marks region r dead for peers and waits for their operations on it to end. Peers run
// in other processes, so their count is polled (a futex would save the polling; a deregistration
// is rare and short).
func (rs *regionServer) fence(ctx context.Context, r *buffer.Region) error {
	rs.mu.Lock()
	s, ok := rs.slots[r.Key()]
	rs.mu.Unlock()
	if !ok {
		return nil // no peer ever resolved it
	}
	w := word(rs.ctl, s)
	w.Or(ctlDead)
	for w.Load() != ctlDead {
		if err := status.FromContext(ctx); err != nil {
			return fmt.Errorf("shm: peers' operations on region %d still in flight: %w", r.Key(), err)
		}
		time.Sleep(20 * time.Microsecond)
	}
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

// answer handles one region request of the link of the peer of rank peer; fds are the
// descriptors to send with the reply. controlSent says whether this link already has the
// control page. A region not published to the peer is not found.
func (rs *regionServer) answer(peer uint32, q linkReq, controlSent bool) (resp linkResp, fds []int) {
	resp = linkResp{op: lopResolved, id: q.id}
	if q.op == lopAtomic {
		resp.op = lopAtomicOK
	}
	if rs == nil {
		resp.status = lstNotFound
		return resp, nil
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
		return resp, nil
	}
	defer reg.Release()
	resp.key = uint32(reg.Key())
	if q.op == lopAtomic {
		old, err := buffer.Atomic(reg.Bytes(), off, buffer.AtomicOp(q.aop), q.operand, q.compare)
		if err != nil {
			resp.status = lstMisaligned
		}
		resp.addr = old
		return resp, nil
	}
	s, ok := rs.slot(reg.Key())
	if !ok {
		resp.status = lstNoSlot
		return resp, nil
	}
	resp.addr, resp.size, resp.slot = reg.Addr(), reg.Size(), s
	if fd, fdOff := reg.FD(); fd >= 0 {
		resp.flags |= lflagRegionFD
		resp.fdOff = fdOff
		fds = append(fds, fd)
	}
	if !controlSent {
		resp.flags |= lflagControlFD
		fds = append(fds, rs.ctlFD)
	}
	return resp, fds
}
