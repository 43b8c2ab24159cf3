package shm

import (
	"fmt"
	"io"
	"net"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hmc-go/hmc/auth"
	"github.com/hmc-go/hmc/internal/acceptor"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

type server struct {
	t        *Transport
	fd       int        // the region's memfd (host memory), or the emulated GPU's (device), or -1
	dev      *devRecord // the region's IPC handle when it is device memory
	size     uint64
	boot     [bootIDSize]byte
	regions  *regionServer // the process's region table (version-2 links), or nil
	onAccept func(transport.PeerInfo)
	l        *net.UnixListener
	links    *acceptor.Server[*net.UnixConn]
}

// Listen serves cfg.Region on the Unix socket cfg.BindAddr ("@name" for an abstract socket,
// else a path): memfd-backed host memory, shared as its memfd, or device memory, shared as its
// IPC handle (initiators of version 4 and later).
func (t *Transport) Listen(cfg transport.ServerConfig) (transport.Server, error) {
	if cfg.Region == nil {
		return nil, fmt.Errorf("shm: listen without a region: %w", status.ErrInvalidConfig)
	}
	boot, err := BootID()
	if err != nil {
		return nil, err
	}
	fd, dev := cfg.Region.FD(), (*devRecord)(nil)
	if cfg.Region.Bytes() == nil {
		pl, err := memory.LocateRange(cfg.Region.Ptr(), cfg.Region.Size())
		if err != nil {
			return nil, fmt.Errorf("shm: %w", err)
		}
		h, err := memory.ExportIPC(cfg.Region.Ptr(), pl)
		if err != nil {
			return nil, fmt.Errorf("shm: the region is %v memory, shared through its IPC handle, which it has none of: %w", pl, err)
		}
		r := recordOf(h)
		dev = &r
		fd = h.FD // the emulation's memfd (a duplicate this server owns), else -1
	} else if fd < 0 {
		return nil, fmt.Errorf("shm: region is %v memory without a memfd; shared memory needs a memfd-backed host buffer: %w",
			cfg.Region.Type(), status.ErrUnsupported)
	}
	closeDevFD := func() {
		if dev != nil && fd >= 0 {
			_ = unix.Close(fd)
		}
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: cfg.BindAddr, Net: "unix"})
	if err != nil {
		closeDevFD()
		return nil, fmt.Errorf("shm: listen %s: %w: %w", cfg.BindAddr, status.ErrInvalidConfig, err)
	}
	s := &server{t: t, fd: fd, dev: dev, size: cfg.Region.Size(), boot: boot, onAccept: cfg.OnAccept, l: l}
	if cfg.Regions != nil {
		if s.regions, err = newRegionServer(cfg.Regions, t.cfg.Logger); err != nil {
			_ = l.Close()
			closeDevFD()
			return nil, err
		}
	}
	s.links = acceptor.Start(l, l.AcceptUnix, s.serve, t.cfg.Logger, "shm")
	return s, nil
}

func (s *server) Addr() string { return s.l.Addr().String() }

// Close stops accepting and closes every initiator's liveness link, so their endpoints fail
// from then on; their mappings stay valid.
func (s *server) Close() error {
	err := s.links.Close()
	if s.regions != nil {
		s.regions.close()
	}
	if s.dev != nil && s.fd >= 0 {
		_ = unix.Close(s.fd) // the emulated GPU's memfd duplicate, ours
	}
	if err != nil {
		return fmt.Errorf("shm: close: %w: %w", status.ErrFailed, err)
	}
	return nil
}

// serve hands the memfd to one initiator, then holds the link open until either side closes
// (on a goroutine owned by s.links, which closes c when it returns).
func (s *server) serve(c *net.UnixConn) {
	// The abstract socket has no file permissions: admit the peer by its kernel-recorded user
	// before reading or sending anything (the offer carries the region's descriptor).
	if _, err := s.t.cfg.peers().Check(c); err != nil {
		s.t.cfg.Logger.Warn("shm: refused a connection", "addr", s.Addr(), "err", err)
		return
	}
	dl := time.Now().Add(s.t.cfg.HandshakeTimeout)
	if _, err := auth.Server(c, s.t.cfg.Auth.Local(), "shm", dl); err != nil {
		s.t.cfg.Logger.Warn("shm: refused a connection", "addr", s.Addr(), "err", err)
		return
	}
	_ = c.SetDeadline(dl)
	b := make([]byte, helloSize)
	if _, err := io.ReadFull(c, b); err != nil {
		return
	}
	h, err := decodeHello(b)
	if err != nil {
		if aerr := auth.Refuse(c, b); aerr != nil {
			err = aerr // an initiator that authenticates, and this side does not
		}
		s.t.cfg.Logger.Warn("shm: bad hello", "err", err)
		return
	}
	// The peer is recorded before the offer goes out: once the initiator's Dial returns, this
	// side knows it (a control message the initiator sends next may be answered with a put back).
	if s.onAccept != nil {
		ip := h.ip
		if ip == "" {
			ip = "127.0.0.1"
		}
		s.onAccept(transport.PeerInfo{Rank: h.rank, IP: ip, ListenPort: int(h.listenPort)})
	}
	o := offer{version: h.version, size: s.size, bootID: s.boot}
	msg, fds := o.encode(), []int{s.fd}
	if s.dev != nil {
		if h.version < 4 {
			s.t.cfg.Logger.Warn("shm: refused an initiator: the region is device memory, which needs link version 4", "version", h.version)
			return
		}
		o.flags = offerDevice
		msg = append(o.encode(), make([]byte, devRecordSize)...)
		s.dev.encode(msg[offerSize:])
		fds = nil
		if s.dev.emulated {
			fds = []int{s.fd}
		}
	}
	var rights []byte
	if len(fds) > 0 {
		rights = unix.UnixRights(fds...)
	}
	if _, _, err := c.WriteMsgUnix(msg, rights, nil); err != nil {
		return
	}
	_ = c.SetDeadline(time.Time{})
	if h.version >= 2 {
		s.serveRegions(c, h.rank, h.version)
		return
	}
	var one [1]byte
	for { // the initiator never sends more; this returns when it closes or Close closes c
		if _, err := c.Read(one[:]); err != nil {
			return
		}
	}
}

// serveRegions answers an initiator's region requests (version 2 and later) until it or Close
// ends the link. A request that does not decode ends the link: the initiator is out of step.
func (s *server) serveRegions(c *net.UnixConn, peer uint32, ver uint16) {
	var (
		qb          [linkReqSize]byte
		rb          [linkRespSize + devRecordSize]byte
		controlSent bool
	)
	for {
		if _, err := io.ReadFull(c, qb[:]); err != nil {
			return
		}
		q, err := decodeLinkReq(&qb)
		if err != nil {
			s.t.cfg.Logger.Warn("shm: bad region request", "err", err)
			return
		}
		resp, fds, owned := s.regions.answer(peer, q, controlSent, ver)
		resp.encode((*[linkRespSize]byte)(rb[:linkRespSize]))
		msg := rb[:linkRespSize]
		if resp.flags&lflagDevice != 0 {
			resp.dev.encode(rb[linkRespSize:])
			msg = rb[:]
		}
		var oob []byte
		if len(fds) > 0 {
			oob = unix.UnixRights(fds...)
		}
		_, _, err = c.WriteMsgUnix(msg, oob, nil)
		closeFDs(owned)
		if err != nil {
			return
		}
		if resp.flags&lflagControlFD != 0 {
			controlSent = true
		}
	}
}
