package tcp

import (
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"time"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/internal/acceptor"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

type server struct {
	t        *Transport
	buf      *buffer.ConnBuffer // the region served
	region   []byte             // its bytes, served zero-copy; nil for device memory (a staging ring per lane)
	rank     uint32
	onAccept func(transport.PeerInfo)
	onWrite  func(off, n uint64)
	l        net.Listener
	lanes    *acceptor.Server[net.Conn]
}

// Listen serves cfg.Region on cfg.BindAddr. Host memory is served zero-copy; device memory
// (a GPU ConnBuffer) through a bounded staging ring per lane (transport.Stager).
func (t *Transport) Listen(cfg transport.ServerConfig) (transport.Server, error) {
	if cfg.Region == nil {
		return nil, fmt.Errorf("tcp: listen without a region: %w", status.ErrInvalidConfig)
	}
	l, err := net.Listen("tcp", cfg.BindAddr)
	if err != nil {
		return nil, fmt.Errorf("tcp: listen %s: %w: %w", cfg.BindAddr, status.ErrInvalidConfig, err)
	}
	s := &server{t: t, buf: cfg.Region, region: cfg.Region.Bytes(), rank: cfg.Rank, onAccept: cfg.OnAccept, onWrite: cfg.OnWrite, l: l}
	s.lanes = acceptor.Start(l, l.Accept, s.serve, t.cfg.Logger, "tcp")
	return s, nil
}

// Addr returns the listen address.
func (s *server) Addr() string { return s.l.Addr().String() }

// Close stops accepting, closes every lane and waits for their goroutines.
func (s *server) Close() error {
	if err := s.lanes.Close(); err != nil {
		return fmt.Errorf("tcp: close: %w: %w", status.ErrFailed, err)
	}
	return nil
}

// serve is one lane, on a goroutine owned by s.lanes (which closes c when it returns).
func (s *server) serve(c net.Conn) {
	tuneConn(c, s.t.cfg)
	h, err := s.handshake(c)
	if err != nil {
		s.t.cfg.Logger.Warn("tcp: handshake failed", "remote", c.RemoteAddr(), "err", err)
		return
	}
	if err := s.serveRequests(c); !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		s.t.cfg.Logger.Warn("tcp: lane closed", "remote", c.RemoteAddr(), "rank", h.rank, "err", err)
	}
}

func (s *server) handshake(c net.Conn) (hello, error) {
	_ = c.SetDeadline(time.Now().Add(s.t.cfg.HandshakeTimeout))
	var b [helloSize]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return hello{}, err
	}
	h, err := decodeHello(b[:])
	if err != nil {
		return hello{}, err
	}
	// Record the initiator before welcoming it: once its Dial returns, it may address us
	// through the control plane and expect us to know it.
	if h.lane == 0 && s.onAccept != nil {
		ip, _, _ := net.SplitHostPort(c.RemoteAddr().String())
		s.onAccept(transport.PeerInfo{Rank: h.rank, IP: ip, ListenPort: int(h.listenPort)})
	}
	var w [welcomeSize]byte
	welcome{rank: s.rank, regionSize: s.buf.Size()}.encode(&w)
	if _, err := c.Write(w[:]); err != nil {
		return hello{}, err
	}
	_ = c.SetDeadline(time.Time{})
	return h, nil
}

// serveRequests is the target's whole data path for one lane: PUT payloads go from the socket
// straight into the region; GET replies leave as one writev of header and region slice.
func (s *server) serveRequests(c net.Conn) error {
	rd := newReader(c, s.t.cfg.BusyPoll)
	var (
		rb   [reqSize]byte
		wb   [respSize]byte
		arr  [2][]byte
		size = s.buf.Size()
		stg  *transport.Stager
	)
	if s.region == nil {
		var err error
		if stg, err = transport.NewStager(s.buf, 0, 0); err != nil {
			return fmt.Errorf("tcp: %w", err)
		}
		defer stg.Close()
	}
	for {
		if _, err := io.ReadFull(rd, rb[:]); err != nil {
			return err
		}
		r, err := decodeRequest(&rb)
		if err != nil {
			return err
		}
		inRange := buffer.CheckRange(size, r.offset, r.length) == nil
		resp := response{id: r.id, status: stOK}
		switch r.op {
		case opPut:
			resp.op = opPutAck
			switch {
			case inRange && stg != nil:
				if err := stg.Receive(rd, r.offset, r.length); err != nil {
					return err // a device that fails mid-transfer ends the lane: the stream is out of step
				}
			case inRange:
				if _, err := io.ReadFull(rd, s.region[r.offset:r.offset+r.length]); err != nil {
					return err
				}
				if s.onWrite != nil {
					s.onWrite(r.offset, r.length)
					// Let a goroutine the notification woke run before the ack's write: it
					// is the one waiting for these bytes.
					runtime.Gosched()
				}
			case r.length <= size:
				// Refused, but the payload is on the wire: skip it to stay in step.
				resp.status = stOutOfRange
				if _, err := io.CopyN(io.Discard, rd, int64(r.length)); err != nil {
					return err
				}
			default:
				// No honest initiator sends more than the region it was told about.
				return fmt.Errorf("tcp: PUT of %d bytes into a %d-byte region: %w", r.length, size, status.ErrProtocol)
			}
			resp.encode(&wb)
			if _, err := c.Write(wb[:]); err != nil {
				return err
			}
		case opGet:
			resp.op = opGetData
			if !inRange {
				resp.status = stOutOfRange
			}
			resp.encode(&wb)
			if !inRange || r.length == 0 {
				if _, err := c.Write(wb[:]); err != nil {
					return err
				}
				continue
			}
			if stg != nil {
				if _, err := c.Write(wb[:]); err != nil {
					return err
				}
				if err := stg.Send(c, r.offset, r.length); err != nil {
					return err // the reply is short: the initiator sees the lane end
				}
				continue
			}
			arr[0], arr[1] = wb[:], s.region[r.offset:r.offset+r.length]
			bufs := net.Buffers(arr[:])
			if _, err := bufs.WriteTo(c); err != nil {
				return err
			}
		}
	}
}

func tuneConn(c net.Conn, cfg Config) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return
	}
	_ = tc.SetNoDelay(true) // small requests and acks must not wait for Nagle
	_ = tc.SetKeepAlive(true)
	_ = tc.SetKeepAlivePeriod(cfg.KeepAlive)
	if cfg.SocketBuffer > 0 {
		_ = tc.SetReadBuffer(cfg.SocketBuffer)
		_ = tc.SetWriteBuffer(cfg.SocketBuffer)
	}
}
