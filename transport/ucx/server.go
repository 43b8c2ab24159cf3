//go:build ucx && cgo

package ucx

/*
#include "hmc_ucx.h"
*/
import "C"

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"
	"unsafe"

	"github.com/hmc-go/hmc/auth"
	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/internal/acceptor"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

type server struct {
	t          *Transport
	w          *worker
	memh       C.ucp_mem_h
	unregister func() // undoes the registration of region
	region     []byte
	onDevice   bool // region is device memory (never written or read by PUTVs and GETVs)
	rkey       []byte
	rank       uint32
	accept     func(transport.PeerInfo)
	l          net.Listener
	acc        *acceptor.Server[net.Conn]
	once       sync.Once
	regions    *srvRegions // the process's region table, served on version-2 links
}

// Listen maps the region and serves the bootstrap socket on cfg.BindAddr (TCP host:port).
func (t *Transport) Listen(cfg transport.ServerConfig) (transport.Server, error) {
	if cfg.Region == nil {
		return nil, fmt.Errorf("ucx: listen without a region: %w", status.ErrInvalidConfig)
	}
	region := cfg.Region.Bytes()
	if region == nil {
		if !hasCUDA() {
			return nil, fmt.Errorf("ucx: region is %v memory: a one-sided target in device memory needs UCX built with CUDA support (cuda_copy/cuda_ipc/gdr_copy), and this UCX has none (serve it over tcp, which stages it): %w",
				cfg.Region.Type(), status.ErrUnsupported)
		}
		region = memory.HostSlice(cfg.Region.Ptr(), cfg.Region.Size()) // a device range, only ever handed to UCX
	}
	onDevice := cfg.Region.Bytes() == nil
	l, err := net.Listen("tcp", cfg.BindAddr)
	if err != nil {
		return nil, fmt.Errorf("ucx: listen %s: %w: %w", cfg.BindAddr, status.ErrInvalidConfig, err)
	}
	w, err := t.acquire()
	if err != nil {
		_ = l.Close()
		return nil, err
	}
	s := &server{t: t, w: w, region: region, onDevice: onDevice, rank: cfg.Rank, accept: cfg.OnAccept, l: l}
	if s.memh, s.unregister, err = w.register(region); err != nil {
		_ = l.Close()
		t.release()
		return nil, err
	}
	if s.rkey, err = w.packRkey(s.memh); err != nil {
		s.unregister()
		_ = l.Close()
		t.release()
		return nil, err
	}
	table := cfg.Regions
	if table == nil {
		table = buffer.NewTable() // nothing registered: every region request is answered "not found"
	}
	s.regions = newSrvRegions(s, table)
	s.acc = acceptor.Start[net.Conn](l, l.Accept, s.serve, slog.New(slog.DiscardHandler), "ucx")
	return s, nil
}

func (s *server) Addr() string { return s.l.Addr().String() }

// serve answers one initiator's hello and holds the link open as its liveness signal.
func (s *server) serve(c net.Conn) {
	dl := time.Now().Add(10 * time.Second)
	c, err := auth.Server(c, s.t.cfg.Auth, "ucx", dl)
	if err != nil {
		return // refused: the peer learns why; the worker address and rkeys stay here
	}
	_ = c.SetDeadline(dl)
	var first [8]byte
	if _, err := io.ReadFull(c, first[:]); err != nil {
		return
	}
	if auth.Refuse(c, first[:]) != nil {
		return // an initiator that authenticates, and this side does not
	}
	h, err := readHello(io.MultiReader(bytes.NewReader(first[:]), c))
	if err != nil {
		return
	}
	if s.accept != nil {
		ip, _, _ := net.SplitHostPort(c.RemoteAddr().String())
		s.accept(transport.PeerInfo{Rank: h.rank, IP: ip, ListenPort: int(h.listenPort)})
	}
	base := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(s.region))))
	wel := welcome{version: h.version, rank: s.rank, regionAddr: base, regionSize: uint64(len(s.region)), rkey: s.rkey, workerAddr: s.w.addr}
	l := &srvLink{c: c, peer: h.rank, acks: make(map[buffer.Key]chan struct{}), gone: make(chan struct{})}
	if h.version >= 3 {
		// PUTVs and GETVs of this link may reach the server's region and the regions it
		// resolves (am.go), from the welcome until the link ends.
		l.grants = &amGrants{}
		if !s.onDevice {
			l.grants.grant(amSpan{addr: base, mem: s.region})
		}
		wel.token = newToken()
		s.w.amLinks.Store(wel.token, l.grants)
		defer s.w.amLinks.Delete(wel.token)
	}
	if _, err := c.Write(wel.encode()); err != nil {
		return
	}
	_ = c.SetDeadline(time.Time{})
	if h.version >= 2 {
		s.regions.serveLink(l)
		return
	}
	_, _ = io.Copy(io.Discard, c) // until the initiator or Close ends the link
}

// Close stops serving: bootstrap links close (initiators fail from then on), the region is
// unmapped, and the worker is released.
func (s *server) Close() error {
	var err error
	s.once.Do(func() {
		err = s.acc.Close()
		// Rendezvous PUTVs accepted before may still be receiving into the regions: let them
		// end (or fail with their endpoints) before the registrations go.
		ctx, cancel := context.WithTimeout(context.Background(), s.t.closeTimeout())
		_ = s.w.rxWait(ctx, 0, true)
		cancel()
		s.regions.close()
		s.unregister()
		s.t.release()
	})
	return err
}
