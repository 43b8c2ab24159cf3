//go:build ucx && cgo

package ucx

/*
#include "hmc_ucx.h"
*/
import "C"

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/internal/memcopy"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// Vector puts and gets as active messages (bootstrap version 3, docs/wire/ucx.md "Vector puts
// and gets").
//
// Over tcp, UCX 1.13 emulates every put with a message and its answer, about 5 µs each on
// loopback, so a KV batch of 512 scattered 4 KiB blocks posted as 512 puts moved at an eighth
// of one contiguous put. Where an endpoint's RMA lanes are all tcp, or it has none and UCP moves
// RMA over its active-message lanes (hmc_ep_rma_emulated), a vector put goes instead as PUTV active messages: each carries a table of up to a chunk's
// worth of pieces in its header and their bytes as its data (one eager message, UCX's iov
// datatype gathering them from the caller's memory), and the target copies each piece into
// place after checking it against the regions that initiator's link was granted, then answers
// with an ACK. Over RDMA and shared memory, where a put is the hardware's or one copy, pieces
// stay puts. Vector gets go likewise as GETVs, each answered with the pieces' bytes (DATA).

const (
	// amChunk is the payload of one PUTV: large enough that a message's fixed costs vanish
	// (at 1 MiB, 512 pieces of 4 KiB moved at 0.7 of a contiguous put; at 2 MiB, 0.95), small
	// enough that the target's assembly of the whole message stays in the caches (one 32 MiB
	// message moved at a third).
	amChunk = 2 << 20
	// amGetChunk is the pieces' bytes one GETV asks for. A GETV's answer is gathered by the
	// target, sent, assembled whole by the initiator's UCX and scattered into place, one
	// after the other, so smaller answers let four in flight overlap those steps: 512 pieces
	// of 4 KiB (one 2 MiB GETV before) read at 0.72 of a contiguous get instead of 0.65, 16
	// KiB at 0.67 instead of 0.63 and 64 KiB at 0.90 instead of 0.83 (medians of four
	// interleaved runs; 256 KiB answers lost at 4 KiB, 1 MiB ones gained less).
	amGetChunk = 512 << 10
	// amPieceMax is the largest piece sent inside a PUTV; larger ones go as puts.
	amPieceMax = 256 << 10
	// putvFixed is a PUTV header's fixed part: u64 token, u64 seq, u32 count, u32 reserved.
	putvFixed = 24
	// putvPiece is one piece's entry: u64 address at the target, u64 length.
	putvPiece = 16

	ackOK      = 0 // every piece copied
	ackRefused = 1 // a piece outside the regions granted to the link: nothing copied
	ackBad     = 2 // a malformed message: nothing copied
)

// amSpan is memory a link may write with PUTV and read with GETV: a region it was given the
// rkey of.
type amSpan struct {
	key  buffer.Key
	addr uint64
	mem  []byte
}

// amGrants are the spans of one link, replaced whole on change (read without a lock by the
// worker's progress).
type amGrants struct {
	mu    sync.Mutex // serializes changes
	spans atomic.Pointer[[]amSpan]
}

func (g *amGrants) grant(s amSpan) {
	g.mu.Lock()
	defer g.mu.Unlock()
	old := g.load()
	for _, o := range old {
		if o.key == s.key && o.addr == s.addr {
			return
		}
	}
	n := append(append(make([]amSpan, 0, len(old)+1), old...), s)
	g.spans.Store(&n)
}

func (g *amGrants) revoke(k buffer.Key) {
	g.mu.Lock()
	defer g.mu.Unlock()
	old := g.load()
	n := make([]amSpan, 0, len(old))
	for _, o := range old {
		if o.key != k {
			n = append(n, o)
		}
	}
	g.spans.Store(&n)
}

func (g *amGrants) load() []amSpan {
	if p := g.spans.Load(); p != nil {
		return *p
	}
	return nil
}

// find returns the n bytes at addr, and their region's key, if one span holds them all.
func (g *amGrants) find(addr, n uint64) ([]byte, buffer.Key) {
	for _, s := range g.load() {
		if addr >= s.addr && addr-s.addr <= uint64(len(s.mem)) && n <= uint64(len(s.mem))-(addr-s.addr) {
			off := addr - s.addr
			return s.mem[off : off+n], s.key
		}
	}
	return nil, 0
}

// newToken returns a random link token (never 0).
func newToken() uint64 {
	for {
		var b [8]byte
		_, _ = rand.Read(b[:])
		if t := binary.LittleEndian.Uint64(b[:]); t != 0 {
			return t
		}
	}
}

// amDrain applies the PUTVs, GETVs, ACKs and DATAs the worker's handlers queued during
// progress. Caller holds pmu.
func (w *worker) amDrain() bool {
	any := false
	for m := C.hmc_am_pop(w.amq); m != nil; m = C.hmc_am_pop(w.amq) {
		hdr := unsafe.Slice((*byte)(unsafe.Pointer(m.hdr)), int(m.hlen))
		var data []byte
		if m.data != nil && m.rndv == 0 {
			data = unsafe.Slice((*byte)(m.data), int(m.len))
		}
		switch m.kind {
		case C.HMC_AM_ACK, C.HMC_AM_DATA:
			w.acked(binary.LittleEndian.Uint64(hdr), binary.LittleEndian.Uint64(hdr[8:]), m.kind == C.HMC_AM_DATA, data)
			C.hmc_am_free(w.w, m)
		case C.HMC_AM_GETV:
			w.answerGetv(m, hdr)
		default:
			w.applyPutv(m, hdr, data)
		}
		any = true
	}
	return any
}

// applyPutv copies a received PUTV's pieces if every one lies in memory its link was granted,
// and answers with an ACK. Caller holds pmu.
func (w *worker) applyPutv(m *C.hmc_amrx, hdr, data []byte) {
	seq, dsts, total, st := w.amPieces(hdr)
	if st == ackOK && total != uint64(m.len) {
		st = ackBad
	}
	if st == ackOK && m.rndv != 0 {
		w.recvPutv(m, seq, dsts)
		return
	}
	if st == ackOK {
		off := 0
		for _, d := range dsts {
			off += memcopy.Copy(d, data[off:])
		}
		w.putvs.Add(1)
	}
	w.amDone(dsts)
	w.amAnswer(m, C.HMC_AM_ACK, seq, st, 0)
}

// recvPutv receives a rendezvous PUTV's bytes straight into its pieces (dsts, from amPieces),
// then answers with an ACK. Until the receive ends, the pieces' regions count it in rxRegions,
// which their deregistration waits for after revoking them (srvRegions.fence). Caller holds
// pmu.
func (w *worker) recvPutv(m *C.hmc_amrx, seq uint64, dsts [][]byte) {
	k := len(dsts)
	m.out = C.malloc(C.size_t(k * putvPiece)) // the iov, freed with m
	iov := unsafe.Slice((*byte)(m.out), k*putvPiece)
	var keys []buffer.Key // the regions it writes, each once
	for j, d := range dsts {
		putIov(iov[j*putvPiece:], uint64(uintptr(unsafe.Pointer(unsafe.SliceData(d)))), uint64(len(d)))
		if key := w.amKeys[j]; !slices.Contains(keys, key) {
			keys = append(keys, key)
		}
	}
	w.amDone(dsts)
	for _, key := range keys {
		w.rxRegions[key]++
	}
	answer := func(rst C.ucs_status_t) {
		for _, key := range keys {
			if w.rxRegions[key]--; w.rxRegions[key] == 0 {
				delete(w.rxRegions, key)
			}
		}
		st := uint64(ackOK)
		if rst != C.UCS_OK {
			st = ackBad // the sender's side failed it, or the endpoint did (then no ACK arrives)
		} else {
			w.putvs.Add(1)
			w.putvsRndv.Add(1)
		}
		w.amAnswer(m, C.HMC_AM_ACK, seq, st, 0)
	}
	var cst C.ucs_status_t
	req := C.hmc_am_recv(w.w, m, m.out, C.size_t(k), &cst)
	switch {
	case cst != C.UCS_OK:
		answer(cst)
	case req == nil:
		answer(C.UCS_OK)
	default:
		w.add(&pend{req: req, what: "vector put (receive)", after: answer})
	}
}

// putIov writes a ucp_dt_iov_t of addr and n at the start of b, as the C struct lays them out
// on this 64-bit ABI (hmc_ucx.c asserts its size).
func putIov(b []byte, addr, n uint64) {
	binary.NativeEndian.PutUint64(b, addr)
	binary.NativeEndian.PutUint64(b[8:], n)
}

// rxWait waits until no rendezvous PUTV is being received into region k (any region if all),
// or ctx ends. The worker's loop progresses them meanwhile.
func (w *worker) rxWait(ctx context.Context, k buffer.Key, all bool) error {
	for {
		w.pmu.Lock()
		busy := !w.gone && (w.rxRegions[k] > 0 || all && len(w.rxRegions) > 0)
		w.pmu.Unlock()
		if !busy {
			return nil
		}
		select {
		case <-ctx.Done():
			if all {
				return fmt.Errorf("ucx: closing: vector puts are still being received: %w", status.FromContext(ctx))
			}
			return fmt.Errorf("ucx: deregistering region %d: a vector put is still being received into it: %w", k, status.FromContext(ctx))
		case <-time.After(100 * time.Microsecond):
		}
	}
}

// answerGetv answers a GETV with its pieces' bytes (gathered into one buffer, which the
// answer's send owns: a deregistration may unmap the regions before UCX has sent them), or
// with a refusal. Caller holds pmu.
func (w *worker) answerGetv(m *C.hmc_amrx, hdr []byte) {
	seq, srcs, n, st := w.amPieces(hdr) // n is 0 unless st is ackOK
	if n > 0 {
		m.out = C.malloc(C.size_t(n))
		out := unsafe.Slice((*byte)(m.out), n)
		off := 0
		for _, s := range srcs {
			off += memcopy.Copy(out[off:], s)
		}
	}
	if st == ackOK {
		w.getvs.Add(1)
	}
	w.amDone(srcs)
	w.amAnswer(m, C.HMC_AM_DATA, seq, st, n)
}

// amAnswer answers m (id HMC_AM_ACK or HMC_AM_DATA) with seq and status st, and n bytes of
// m.out for a DATA, and frees m when that send is done. Caller holds pmu.
func (w *worker) amAnswer(m *C.hmc_amrx, id C.unsigned, seq, st uint64, n uint64) {
	var cst C.ucs_status_t
	w.lastAnswer = time.Now()
	req := C.hmc_am_answer(m.reply_ep, m, id, C.uint64_t(seq), C.uint64_t(st), C.size_t(n), &cst)
	if cst != C.UCS_OK || req == nil {
		C.hmc_am_free(w.w, m)
		return
	}
	w.add(&pend{req: req, what: "answer", after: func(C.ucs_status_t) { C.hmc_am_free(w.w, m) }})
}

func pieceBytes(ps [][]byte) uint64 {
	var n uint64
	for _, p := range ps {
		n += uint64(len(p))
	}
	return n
}

// amPieces reads a PUTV's or GETV's table (hdr) and returns its seq and, if every piece lies in
// memory its link was granted, the pieces' memory here (w.amDsts, for amDone; their regions'
// keys in w.amKeys) and their total bytes; else the status to answer with.
func (w *worker) amPieces(hdr []byte) (seq uint64, mem [][]byte, total, st uint64) {
	if len(hdr) < putvFixed {
		return 0, nil, 0, ackBad
	}
	seq = binary.LittleEndian.Uint64(hdr[8:])
	token := binary.LittleEndian.Uint64(hdr)
	count := uint64(binary.LittleEndian.Uint32(hdr[16:]))
	if binary.LittleEndian.Uint32(hdr[20:]) != 0 || count == 0 || uint64(len(hdr)) != putvFixed+count*putvPiece {
		return seq, nil, 0, ackBad
	}
	v, ok := w.amLinks.Load(token)
	if !ok {
		return seq, nil, 0, ackRefused
	}
	g := v.(*amGrants)
	for i := range count {
		n := binary.LittleEndian.Uint64(hdr[putvFixed+i*putvPiece+8:])
		if total+n < total {
			return seq, nil, 0, ackBad
		}
		total += n
	}
	mem = w.amDsts[:0]
	w.amKeys = w.amKeys[:0]
	for i := range count {
		e := hdr[putvFixed+i*putvPiece:]
		d, key := g.find(binary.LittleEndian.Uint64(e), binary.LittleEndian.Uint64(e[8:]))
		if d == nil {
			w.amDone(mem)
			return seq, nil, 0, ackRefused
		}
		mem = append(mem, d)
		w.amKeys = append(w.amKeys, key)
	}
	return seq, mem, total, ackOK
}

// amDone gives amPieces' slice back (cleared: it must not keep regions' memory reachable).
func (w *worker) amDone(mem [][]byte) {
	clear(mem)
	w.amDsts = mem[:0]
}

// amVec is one vector put's PUTVs or get's GETVs: its Op has a part per message, finished when
// both its send and its answer (ACK, DATA) have completed. At most amWindow are in flight; the
// rest wait in queue.
type amVec struct {
	e        *endpoint
	op       *transport.Op
	regs     []*peerRegion  // held (inflight) until every PUTV is done
	left     int            // PUTVs not done
	queue    []*amChunkWait // built, not sent yet
	inFlight int            // sent and not done
	failed   error          // the first failure: queued PUTVs fail with it unsent
	sending  bool           // sendNext is running (a failure inside it must not re-enter)
	dsts     [][]byte       // a get's pieces (local memory), in the GETVs' order; nil for a put
}

func (v *amVec) what() string {
	if v.dsts != nil {
		return "get"
	}
	return "put"
}

// amWindow bounds a vector's messages in flight: the target assembles a PUTV whole before it
// copies it out, and 16 messages of 2 MiB at once (a 32 MiB batch) no longer fit the caches.
const amWindow = 4

// amChunkWait is one PUTV or GETV: what of it is still to come.
type amChunkWait struct {
	v           *amVec
	seq         uint64
	hlen, k     int // header bytes, pieces
	first       int // a GETV's first piece in v.dsts
	sent, acked bool
	rndv        bool // a PUTV sent as a rendezvous: the target receives its bytes into place
	err         error
	cmem        unsafe.Pointer // its header and iov (C memory), freed when the send completes
}

// step records that the message's send (send) or answer completed with err, and finishes its
// part of the Op once both did. Caller holds pmu.
func (c *amChunkWait) step(w *worker, send bool, err error) {
	v := c.v
	if send {
		c.sent = true
		C.free(c.cmem)
		c.cmem = nil
		if err != nil && !c.acked { // no answer comes for a message that was not sent
			delete(w.amWaits, c.seq)
			c.acked = true
			v.e.inflight--
		}
	} else {
		c.acked = true
		delete(w.amWaits, c.seq)
		v.e.inflight--
	}
	if c.err == nil {
		c.err = err
	}
	if err != nil && v.failed == nil {
		v.failed = err
	}
	if !c.sent || !c.acked {
		return
	}
	v.op.Finish(c.err)
	if v.left--; v.left == 0 {
		for _, r := range v.regs {
			r.inflight--
		}
	}
	v.inFlight--
	v.sendNext(w)
}

// sendNext sends queued messages while fewer than amWindow are in flight, or fails them all
// once the vector failed. Caller holds pmu.
func (v *amVec) sendNext(w *worker) {
	if v.sending {
		return
	}
	v.sending = true
	defer func() { v.sending = false }()
	for len(v.queue) > 0 && (v.inFlight < amWindow || v.failed != nil) {
		c := v.queue[0]
		v.queue = v.queue[1:]
		v.inFlight++
		if v.failed != nil {
			c.step(w, true, v.failed)
			continue
		}
		id, n := C.unsigned(C.HMC_AM_PUTV), C.size_t(c.k)
		if v.dsts != nil {
			id, n = C.HMC_AM_GETV, 0 // the table alone
		}
		var st C.ucs_status_t
		rndv := C.int(0)
		if c.rndv {
			rndv = 1
		}
		req := C.hmc_post_am(handle(unsafe.Pointer(v.e.ep)), id, handle(c.cmem), C.size_t(c.hlen), n, rndv, &st)
		what := "vector " + v.what() + " (active message)"
		switch {
		case st != C.UCS_OK:
			c.step(w, true, ucsErr(what, st))
		case req == nil:
			c.step(w, true, nil)
		default:
			w.add(&pend{req: req, ep: v.e, what: what, after: func(st C.ucs_status_t) {
				var err error
				if st != C.UCS_OK {
					err = ucsErr(what, st)
				}
				c.step(w, true, err)
			}})
		}
	}
}

// acked handles an ACK, or a GETV's DATA (isData) with its bytes. Caller holds pmu.
func (w *worker) acked(seq, st uint64, isData bool, data []byte) {
	c := w.amWaits[seq]
	if c == nil || isData != (c.v.dsts != nil) {
		return // its vector failed meanwhile (the endpoint failed), or not an answer of this kind
	}
	var err error
	switch st {
	case ackOK:
		if d := c.v.dsts; d != nil { // a GETV's pieces, in its table's order
			ps := d[c.first : c.first+c.k]
			if want := pieceBytes(ps); want != uint64(len(data)) {
				err = fmt.Errorf("ucx: vector get: the target answered %d bytes for %d: %w", len(data), want, status.ErrProtocol)
				break
			}
			off := 0
			for _, p := range ps {
				off += memcopy.Copy(p, data[off:])
			}
		}
	case ackRefused:
		err = fmt.Errorf("ucx: vector %s: the target refused a piece outside the regions it granted this endpoint (deregistered meanwhile?): %w", c.v.what(), status.ErrNotFound)
	default:
		err = fmt.Errorf("ucx: vector %s: the target found the message malformed (status %d): %w", c.v.what(), st, status.ErrProtocol)
	}
	c.step(w, false, err)
}

// failAMLocked fails every PUTV and GETV of e still waiting for its answer, and those not sent
// yet (the endpoint failed or its link ended: no answer will come). Caller holds pmu.
func (e *endpoint) failAMLocked(err error) {
	for _, c := range e.w.amWaits {
		if c.v.e == e && !c.acked {
			c.step(e.w, false, err) // sets c.v.failed
			c.v.sendNext(e.w)       // which fails the vector's unsent ones
		}
	}
}

// vecAM posts a vector put's (put) or get's pieces: those of up to amPieceMax bytes as PUTVs
// of up to amChunk bytes each or GETVs of up to amGetChunk, larger ones as puts or gets with
// one flush. locals are the pieces' local memory (addrs, lens). Caller holds pmu and has
// checked the endpoint and regions.
func (e *endpoint) vecAM(put bool, locals [][]byte, addrs []C.uintptr_t, lens []C.size_t, raddrs []C.uint64_t, rkeys []C.uintptr_t, regs []*peerRegion) *transport.Op {
	w := e.w
	var small, big []int // pieces sent in PUTVs or GETVs, and on their own
	for i := range lens {
		if uint64(lens[i]) <= amPieceMax {
			small = append(small, i)
		} else {
			big = append(big, i)
		}
	}
	maxPieces := max(1, (int(w.amq.max_header)-putvFixed)/putvPiece) // the header limit bounds a PUTV's pieces
	var bounds [][2]int                                              // [first, end) of each PUTV in small
	chunkB := uint64(amChunk)
	if !put {
		chunkB = amGetChunk
	}
	for s := 0; s < len(small); {
		start, pay := s, uint64(0)
		for s < len(small) && s-start < maxPieces && (s == start || pay+uint64(lens[small[s]]) <= chunkB) {
			pay += uint64(lens[small[s]])
			s++
		}
		bounds = append(bounds, [2]int{start, s})
	}
	chunks := len(bounds)
	parts := chunks
	if len(big) > 0 {
		parts++
	}
	op := e.newOp(parts)
	if len(big) > 0 {
		ba := make([]C.uintptr_t, len(big))
		bl := make([]C.size_t, len(big))
		br := make([]C.uint64_t, len(big))
		bk := make([]C.uintptr_t, len(big))
		for j, i := range big {
			ba[j], bl[j], br[j], bk[j] = addrs[i], lens[i], raddrs[i], rkeys[i]
		}
		e.postVecLocked(put, ba, bl, br, bk, regs, op)
	}
	if chunks == 0 {
		return op
	}
	v := &amVec{e: e, op: op, regs: regs, left: chunks, queue: make([]*amChunkWait, 0, chunks)}
	if !put {
		v.dsts = make([][]byte, len(small))
		for j, i := range small {
			v.dsts[j] = locals[i]
		}
	}
	for _, r := range regs {
		r.inflight++
	}
	for _, b := range bounds {
		idx := small[b[0]:b[1]]
		k := len(idx)
		hlen := putvFixed + k*putvPiece
		cmem := C.malloc(C.size_t(hlen + k*putvPiece)) // the header, then k ucp_dt_iov_t
		w.amSeq++
		c := &amChunkWait{v: v, seq: w.amSeq, hlen: hlen, k: k, first: b[0], cmem: cmem}
		buf := unsafe.Slice((*byte)(cmem), hlen+k*putvPiece)
		binary.LittleEndian.PutUint64(buf, e.token)
		binary.LittleEndian.PutUint64(buf[8:], c.seq)
		binary.LittleEndian.PutUint32(buf[16:], uint32(k))
		binary.LittleEndian.PutUint32(buf[20:], 0)
		for j, i := range idx {
			binary.LittleEndian.PutUint64(buf[putvFixed+j*putvPiece:], uint64(raddrs[i]))
			binary.LittleEndian.PutUint64(buf[putvFixed+j*putvPiece+8:], uint64(lens[i]))
			// The piece's address (the caller's memory, live until the Op completes).
			putIov(buf[hlen+j*putvPiece:], uint64(addrs[i]), uint64(lens[i]))
		}
		// A vector of one PUTV goes as a rendezvous to targets that take one (version 4):
		// the target's UCX receives the bytes straight into the pieces as they stream in,
		// where an eager PUTV is assembled whole and only then copied into place, with
		// nothing to overlap those steps (512 x 4 KiB: 0.73 -> 0.90 of a contiguous put,
		// medians of four interleaved rounds). With several PUTVs in flight the eager ones
		// overlap each other, and a rendezvous, whose sender packs the pieces into UCX's
		// segments where an eager send gathers them, was slower (512 x 16 KiB, four PUTVs).
		c.rndv = put && chunks == 1 && e.rndvPutv
		e.inflight++ // the ACK or DATA
		w.amWaits[c.seq] = c
		v.queue = append(v.queue, c)
	}
	v.sendNext(w)
	C.ucp_worker_progress(w.w)
	w.signalLocked()
	return op
}

// rawVec sends bufs to (put) or reads them from the target's raddrs as PUTVs or GETVs without
// the initiator's own checks: what a misbehaving peer could send (tests of the target's).
func (e *endpoint) rawVec(put bool, bufs [][]byte, raddrs []uint64) *transport.Op {
	addrs := make([]C.uintptr_t, len(bufs))
	lens := make([]C.size_t, len(bufs))
	ra := make([]C.uint64_t, len(bufs))
	for i, b := range bufs {
		addrs[i], lens[i], ra[i] = handle(unsafe.Pointer(unsafe.SliceData(b))), C.size_t(len(b)), C.uint64_t(raddrs[i])
	}
	e.w.pmu.Lock()
	defer e.w.pmu.Unlock()
	return e.vecAM(put, bufs, addrs, lens, ra, make([]C.uintptr_t, len(bufs)), nil)
}
