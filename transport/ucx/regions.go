//go:build ucx && cgo

package ucx

/*
#include "hmc_ucx.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
)

// srvRegions serves a server's region table to initiators (bootstrap version 2). A region is
// registered with UCX (ucp_mem_map) when a peer first resolves it, and its packed rkey goes to
// that peer on the link. Its deregistration (a Table fence) revokes the rkey at every peer that
// resolved it — each one lets its operations on the region complete, destroys the rkey and
// acknowledges — before UCX's registration is undone, so no one-sided operation reaches memory
// that is no longer registered.
type srvRegions struct {
	s      *server
	table  *buffer.Table
	remove func()

	mu     sync.Mutex
	mapped map[buffer.Key]*srvRegion // guarded by mu
	kept   []*srvRegion              // deregistered, but a fence could not finish: undone at close; guarded by mu
	closed bool                      // guarded by mu
	fences sync.WaitGroup            // fences running; close waits for them (they use the worker)
}

// srvRegion is a region registered with UCX for peers.
type srvRegion struct {
	unregister func()
	rkey       []byte
	resolvers  map[*srvLink]struct{} // links that were sent the rkey; guarded by srvRegions.mu
}

// srvLink is one initiator's bootstrap link.
type srvLink struct {
	c      net.Conn
	peer   uint32                       // the initiator's rank (its hello's): regions are resolved for it
	wmu    sync.Mutex                   // one message at a time
	mu     sync.Mutex                   // guards acks
	acks   map[buffer.Key]chan struct{} // revokes waiting for the peer's REVOKED
	gone   chan struct{}                // closed when the link ends
	grants *amGrants                    // version 3: what its PUTVs and GETVs may reach (am.go); nil before
}

func newSrvRegions(s *server, t *buffer.Table) *srvRegions {
	r := &srvRegions{s: s, table: t, mapped: make(map[buffer.Key]*srvRegion)}
	r.remove = t.AddFence(r.fence)
	return r
}

// close undoes every registration the peers were given (the links are closed by then).
func (r *srvRegions) close() {
	r.remove()
	r.mu.Lock()
	mapped := r.mapped
	r.mapped, r.closed = map[buffer.Key]*srvRegion{}, true
	r.mu.Unlock()
	r.fences.Wait()
	for _, sr := range mapped {
		sr.unregister()
	}
	for _, sr := range r.kept { // the fences are done: kept is final
		sr.unregister()
	}
}

// serveLink answers a version-2 initiator's region messages until the link ends.
func (r *srvRegions) serveLink(l *srvLink) {
	defer close(l.gone)
	for {
		m, err := readLinkMsg(l.c, lmResolve, lmRevoked)
		if err != nil {
			return
		}
		if m.typ == lmRevoked {
			l.mu.Lock()
			if ch := l.acks[buffer.Key(m.key)]; ch != nil {
				close(ch)
				delete(l.acks, buffer.Key(m.key))
			}
			l.mu.Unlock()
			continue
		}
		if err := r.resolve(l, m); err != nil {
			return
		}
	}
}

// resolve answers one RESOLVE. The answer is written while the link's write lock is held from
// before the region's state is looked at, so that a revoke of the region reaches this link
// after the rkey does.
func (r *srvRegions) resolve(l *srvLink, m linkMsg) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	resp := linkMsg{typ: lmResolved, key: m.key, id: m.id}
	var reg *buffer.Region
	var err error
	if m.key != 0 {
		reg, err = r.table.LookupFor(l.peer, buffer.Key(m.key), m.a, m.b)
	} else {
		reg, _, err = r.table.FindFor(l.peer, m.a, m.b)
	}
	var rkey []byte
	switch {
	case errors.Is(err, status.ErrOutOfRange):
		resp.status = lsOutOfRange
	case err != nil:
		resp.status = lsNotFound
	default:
		resp.key, resp.a, resp.b = uint32(reg.Key()), reg.Addr(), reg.Size()
		rkey, resp.status = r.mapFor(l, reg)
		reg.Release()
	}
	b := resp.encode()
	if resp.status == lsOK {
		b = append(b, byte(len(rkey)), byte(len(rkey)>>8), byte(len(rkey)>>16), byte(len(rkey)>>24))
		b = append(b, rkey...)
	}
	_, err = l.c.Write(b)
	return err
}

// mapFor registers reg with UCX if no peer resolved it before, and records that l has its rkey.
func (r *srvRegions) mapFor(l *srvLink, reg *buffer.Region) ([]byte, uint8) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || reg.Deregistered() { // its fence has run or will find nothing: do not hand out an rkey
		return nil, lsNotFound
	}
	sr := r.mapped[reg.Key()]
	if sr == nil && reg.OnDevice() && !hasCUDA() {
		// UCX maps device memory only when built with its CUDA memory domain, which Debian's
		// is not (hmc info says which this one has): same-host peers reach it through shm,
		// others through TCP's staging.
		return nil, lsFailed
	}
	if sr == nil {
		w := r.s.w
		mem := reg.Bytes()
		if mem == nil { // device memory, with a UCX that maps it: a device range only ever handed to UCX
			mem = memory.HostSlice(memory.Ptr(reg.Addr()), reg.Size())
		}
		memh, unregister, err := w.register(mem)
		if err != nil {
			return nil, lsFailed
		}
		rkey, err := w.packRkey(memh)
		if err != nil || len(rkey) == 0 || len(rkey) > maxBlob {
			unregister()
			return nil, lsFailed
		}
		sr = &srvRegion{unregister: unregister, rkey: rkey, resolvers: make(map[*srvLink]struct{})}
		r.mapped[reg.Key()] = sr
	}
	sr.resolvers[l] = struct{}{}
	if l.grants != nil && reg.Bytes() != nil { // device memory is never reached by PUTVs and GETVs
		l.grants.grant(amSpan{key: reg.Key(), addr: reg.Addr(), mem: reg.Bytes()})
	}
	return sr.rkey, lsOK
}

// fence revokes a deregistered region at every peer that has its rkey, waits for their
// acknowledgements (a peer whose link ends counts as one), then undoes UCX's registration.
func (r *srvRegions) fence(ctx context.Context, reg *buffer.Region) error {
	r.mu.Lock()
	sr := r.mapped[reg.Key()]
	delete(r.mapped, reg.Key())
	if sr == nil || r.closed {
		r.mu.Unlock()
		return nil
	}
	r.fences.Add(1)
	r.mu.Unlock()
	defer r.fences.Done()
	var ferr error
	for l := range sr.resolvers {
		if err := l.revoke(ctx, reg.Key()); err != nil && ferr == nil {
			ferr = err
		}
	}
	if ferr != nil {
		// A peer that neither acknowledged nor left may still write: keep the registration
		// (and the memory reachable) rather than undo it under that peer's feet, until close.
		r.keep(sr)
		return ferr
	}
	for l := range sr.resolvers { // no PUTV or GETV reaches it from here on (one copying now holds the worker, as unregister needs it)
		if l.grants != nil {
			l.grants.revoke(reg.Key())
		}
	}
	// A rendezvous PUTV accepted before may still be receiving into it: an honest initiator's
	// are done (it acknowledged the revoke after their ACKs), a peer that left or lies may
	// leave one open. Wait for those, and keep the registration if one outlasts ctx.
	if err := r.s.w.rxWait(ctx, reg.Key(), false); err != nil {
		r.keep(sr)
		return err
	}
	sr.unregister()
	return nil
}

// keep holds sr's registration until close: a fence could not finish.
func (r *srvRegions) keep(sr *srvRegion) {
	r.mu.Lock()
	r.kept = append(r.kept, sr)
	r.mu.Unlock()
}

// revoke tells the peer that region k is gone and waits for its acknowledgement.
func (l *srvLink) revoke(ctx context.Context, k buffer.Key) error {
	ch := make(chan struct{})
	l.mu.Lock()
	l.acks[k] = ch
	l.mu.Unlock()
	l.wmu.Lock()
	_ = l.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err := l.c.Write(linkMsg{typ: lmRevoke, key: uint32(k)}.encode())
	_ = l.c.SetWriteDeadline(time.Time{})
	l.wmu.Unlock()
	if err != nil {
		return nil // the link is broken: the peer has no endpoint to write with any more
	}
	select {
	case <-ch:
		return nil
	case <-l.gone:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("ucx: revoking region %d: a peer did not acknowledge: %w", k, status.FromContext(ctx))
	}
}
