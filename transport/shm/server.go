package shm

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

type server struct {
	t        *Transport
	fd       int
	offer    []byte
	onAccept func(transport.PeerInfo)
	l        *net.UnixListener
	wg       sync.WaitGroup

	mu     sync.Mutex
	conns  map[*net.UnixConn]struct{} // guarded by mu
	closed bool                       // guarded by mu
}

// Listen serves cfg.Region, which must be memfd-backed host memory, on the Unix socket
// cfg.BindAddr ("@name" for an abstract socket, else a path).
func (t *Transport) Listen(cfg transport.ServerConfig) (transport.Server, error) {
	if cfg.Region == nil {
		return nil, fmt.Errorf("shm: listen without a region: %w", status.ErrInvalidConfig)
	}
	if cfg.Region.FD() < 0 || cfg.Region.Bytes() == nil {
		return nil, fmt.Errorf("shm: region is %v memory without a memfd; shared memory needs a host buffer: %w",
			cfg.Region.Type(), status.ErrUnsupported)
	}
	boot, err := BootID()
	if err != nil {
		return nil, err
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: cfg.BindAddr, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("shm: listen %s: %w: %w", cfg.BindAddr, status.ErrInvalidConfig, err)
	}
	s := &server{t: t, fd: cfg.Region.FD(), offer: offer{size: cfg.Region.Size(), bootID: boot}.encode(),
		onAccept: cfg.OnAccept, l: l, conns: make(map[*net.UnixConn]struct{})}
	s.wg.Add(1)
	go s.acceptLoop() // owned by s: Close closes l and waits
	return s, nil
}

func (s *server) Addr() string { return s.l.Addr().String() }

// Close stops accepting and closes every initiator's liveness link, so their endpoints fail
// from then on; their mappings stay valid.
func (s *server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.wg.Wait()
		return nil
	}
	s.closed = true
	_ = s.l.Close() // accept loop sees net.ErrClosed
	for c := range s.conns {
		_ = c.Close() // initiators see EOF on their liveness link
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

func (s *server) acceptLoop() {
	defer s.wg.Done()
	for {
		c, err := s.l.AcceptUnix()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.t.cfg.Logger.Warn("shm: accept stopped", "err", err)
			}
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			_ = c.Close() // raced with Close
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serve(c) // owned by s: Close closes c and waits
	}
}

// serve hands the memfd to one initiator, then holds the link open until either side closes.
func (s *server) serve(c *net.UnixConn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		_ = c.Close() // the link is over
	}()
	_ = c.SetDeadline(time.Now().Add(s.t.cfg.HandshakeTimeout))
	b := make([]byte, helloSize)
	if _, err := io.ReadFull(c, b); err != nil {
		return
	}
	h, err := decodeHello(b)
	if err != nil {
		s.t.cfg.Logger.Warn("shm: bad hello", "err", err)
		return
	}
	if _, _, err := c.WriteMsgUnix(s.offer, unix.UnixRights(s.fd), nil); err != nil {
		return
	}
	_ = c.SetDeadline(time.Time{})
	if s.onAccept != nil {
		ip := h.ip
		if ip == "" {
			ip = "127.0.0.1"
		}
		s.onAccept(transport.PeerInfo{Rank: h.rank, IP: ip, ListenPort: int(h.listenPort)})
	}
	var one [1]byte
	for { // the initiator never sends more; this returns when it closes or Close closes c
		if _, err := c.Read(one[:]); err != nil {
			return
		}
	}
}
