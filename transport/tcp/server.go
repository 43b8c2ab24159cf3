package tcp

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"time"

	"github.com/hmc-go/hmc/auth"
	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/internal/acceptor"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

type server struct {
	t        *Transport
	buf      *buffer.ConnBuffer // the region served
	region   []byte             // its bytes, served zero-copy; nil for device memory (a staging ring per lane)
	regions  *buffer.Table      // every other region served (version 2), or nil
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
	s := &server{t: t, buf: cfg.Region, region: cfg.Region.Bytes(), regions: cfg.Regions, rank: cfg.Rank, onAccept: cfg.OnAccept, onWrite: cfg.OnWrite, l: l}
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
	conn, err := auth.Server(spinning(c, s.t.cfg), s.t.cfg.Auth, "tcp", time.Now().Add(s.t.cfg.HandshakeTimeout))
	if err != nil {
		s.t.cfg.Logger.Warn("tcp: refused a connection", "remote", c.RemoteAddr(), "err", err)
		return
	}
	h, err := s.handshake(conn)
	if err != nil {
		s.t.cfg.Logger.Warn("tcp: handshake failed", "remote", c.RemoteAddr(), "err", err)
		return
	}
	if err := s.serveRequests(conn, h.version, h.rank); !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
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
		if aerr := auth.Refuse(c, b[:]); aerr != nil {
			return hello{}, aerr // an initiator that authenticates, and this side does not
		}
		return hello{}, err
	}
	// Record the initiator before welcoming it: once its Dial returns, it may address us
	// through the control plane and expect us to know it.
	if h.lane == 0 && s.onAccept != nil {
		ip, _, _ := net.SplitHostPort(c.RemoteAddr().String())
		s.onAccept(transport.PeerInfo{Rank: h.rank, IP: ip, ListenPort: int(h.listenPort)})
	}
	var w [welcomeSize]byte
	welcome{version: h.version, rank: s.rank, regionSize: s.buf.Size()}.encode(&w)
	if _, err := c.Write(w[:]); err != nil {
		return hello{}, err
	}
	_ = c.SetDeadline(time.Time{})
	return h, nil
}

// serveRequests is the target's whole data path for one lane: PUT payloads go from the socket
// straight into the region; GET replies leave as one writev of header and region slice.
func (s *server) serveRequests(c net.Conn, ver uint16, peer uint32) error {
	// A buffered reader lets the lane see whether the next request has arrived already, and
	// while one has, PUT acks wait and leave together (one write per burst, not per request);
	// payloads larger than the buffer are still read straight into the region.
	br := bufio.NewReaderSize(newReader(c, s.t.cfg.BusyPoll), readBuffer)
	rd := br
	bulk := newBulkReader(c, s.t.cfg)
	ack := &acker{c: c, br: br}
	var (
		rb   [reqSize]byte
		wb   [respSize]byte
		arr  [2][]byte
		size = s.buf.Size()
		stg  *transport.Stager
		vec  vectorState
	)
	// A device region's lanes stage through pinned host rings, made on a lane's first
	// transfer: lanes that carry none (an initiator's spare lanes) pin nothing.
	staged := func() (*transport.Stager, error) {
		if stg == nil {
			var err error
			if stg, err = transport.NewStager(s.buf, 0, 0); err != nil {
				return nil, fmt.Errorf("tcp: %w", err)
			}
		}
		return stg, nil
	}
	// Device regions of the table stage through rings of their device's pinned memory, one
	// per device a lane has carried.
	rings := map[memory.Place]*transport.Stager{}
	ring := func(pl memory.Place) (*transport.Stager, error) { return devRing(&rings, pl) }
	defer func() {
		if stg != nil {
			_ = stg.Close()
		}
		for _, st := range rings {
			_ = st.Close()
		}
	}()
	for {
		if _, err := io.ReadFull(rd, rb[:]); err != nil {
			return err
		}
		r, err := decodeRequest(&rb, ver)
		if err != nil {
			return err
		}
		if r.op == opPutV || r.op == opGetV {
			if err := s.serveVector(c, rd, bulk, ack, ring, peer, r, &wb, &vec); err != nil {
				return err
			}
			continue
		}
		if r.mode != modeDefault || r.op == opAtomic {
			if err := s.serveRegion(c, rd, bulk, ack, ring, peer, r, &wb, &arr); err != nil {
				return err
			}
			continue
		}
		inRange := buffer.CheckRange(size, r.offset, r.length) == nil
		resp := response{id: r.id, status: stOK}
		switch r.op {
		case opPut:
			resp.op = opPutAck
			switch {
			case inRange && s.region == nil:
				st, err := staged()
				if err != nil {
					return err // the payload is on the wire and cannot land: the lane ends
				}
				if err := st.Receive(bulk.chunks(rd), r.offset, r.length); err != nil {
					return err // a device that fails mid-transfer ends the lane: the stream is out of step
				}
			case inRange:
				if err := bulk.readFull(rd, s.region[r.offset:r.offset+r.length]); err != nil {
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
			if err := ack.put(&wb); err != nil {
				return err
			}
		case opGet:
			resp.op = opGetData
			if !inRange {
				resp.status = stOutOfRange
			}
			resp.encode(&wb)
			if err := ack.flush(); err != nil {
				return err
			}
			if !inRange || r.length == 0 {
				if _, err := c.Write(wb[:]); err != nil {
					return err
				}
				continue
			}
			if s.region == nil {
				st, err := staged()
				if err != nil {
					return err
				}
				if _, err := c.Write(wb[:]); err != nil {
					return err
				}
				if err := st.Send(c, r.offset, r.length); err != nil {
					return err // the reply is short: the initiator sees the lane end
				}
				continue
			}
			arr[0], arr[1] = wb[:], s.region[r.offset:r.offset+r.length]
			if err := writeSliced(c, net.Buffers(arr[:])); err != nil {
				return err
			}
		}
	}
}

// serveRegion serves one version-2 request addressed to a registered region (by key or by
// address), or an ATOMIC: the region is looked up and acquired, so a deregistration waits for
// it, and the range checked, before a byte moves. A refused PUT's payload is read and dropped,
// keeping the lane in step. A device region's bytes go through a staging ring of the lane's.
func (s *server) serveRegion(c net.Conn, rd *bufio.Reader, bulk *bulkReader, ack *acker, ring func(memory.Place) (*transport.Stager, error),
	peer uint32, r request, wb *[respSize]byte, arr *[2][]byte) error {
	var payload [atomicPayload]byte
	if r.op == opAtomic {
		if _, err := io.ReadFull(rd, payload[:]); err != nil {
			return err
		}
	}
	mem, reg, st := s.lookup(peer, r)
	if reg != nil {
		defer reg.Release()
	}
	var dev *transport.Stager // the ring of a device region, nil for host memory
	if reg != nil && reg.OnDevice() {
		if r.op == opAtomic {
			st = stMisaligned // no device word is reachable from the host: refused as unaligned
		} else {
			var err error
			if dev, err = ring(reg.Place()); err != nil {
				return err // the payload (if any) cannot land: the lane ends
			}
		}
	}
	off := r.offset
	if reg != nil && r.mode == modeAddr {
		off = r.offset - reg.Addr()
	}
	resp := response{id: r.id, status: st}
	switch r.op {
	case opPut:
		resp.op = opPutAck
		if st == stOK && dev != nil {
			if err := dev.ReceiveInto(bulk.chunks(rd), reg, off, r.length); err != nil {
				return err // a device that fails mid-transfer ends the lane: the stream is out of step
			}
		} else if st == stOK {
			if err := bulk.readFull(rd, mem); err != nil {
				return err
			}
		} else if _, err := io.CopyN(io.Discard, rd, int64(r.length)); err != nil {
			return err
		}
		resp.encode(wb)
		return ack.put(wb)
	case opGet:
		if err := ack.flush(); err != nil {
			return err
		}
		resp.op = opGetData
		resp.encode(wb)
		if st == stOK && dev != nil && r.length > 0 {
			if _, err := c.Write(wb[:]); err != nil {
				return err
			}
			return dev.SendFrom(c, reg, off, r.length) // a short reply on a device error: the initiator sees the lane end
		}
		if st != stOK || len(mem) == 0 {
			_, err := c.Write(wb[:])
			return err
		}
		arr[0], arr[1] = wb[:], mem
		return writeSliced(c, net.Buffers(arr[:]))
	default: // opAtomic
		if err := ack.flush(); err != nil {
			return err
		}
		resp.op = opAtomicAck
		var old uint64
		if st == stOK {
			var err error
			old, err = buffer.Atomic(mem, 0, buffer.AtomicOp(r.aop), binary.LittleEndian.Uint64(payload[0:]), binary.LittleEndian.Uint64(payload[8:]))
			if err != nil {
				resp.status = stMisaligned // the only error left once range and op were checked
			}
		}
		resp.encode(wb)
		if resp.status != stOK {
			_, err := c.Write(wb[:])
			return err
		}
		var out [respSize + 8]byte
		copy(out[:], wb[:])
		binary.LittleEndian.PutUint64(out[respSize:], old)
		_, err := c.Write(out[:])
		return err
	}
}

// lookup finds the memory a version-2 request of the peer of rank peer names: the bytes
// [off, off+length) of the default region or of a registered one published to the peer
// (acquired: the caller releases reg), or a refusal.
func (s *server) lookup(peer uint32, r request) (mem []byte, reg *buffer.Region, st uint8) {
	switch r.mode {
	case modeDefault:
		if s.region == nil || buffer.CheckRange(uint64(len(s.region)), r.offset, r.length) != nil {
			return nil, nil, stOutOfRange // a device region takes no version-2 requests
		}
		return s.region[r.offset : r.offset+r.length], nil, stOK
	case modeKey:
		if s.regions == nil {
			return nil, nil, stNotFound
		}
		reg, err := s.regions.LookupFor(peer, buffer.Key(r.key), r.offset, r.length)
		if err != nil {
			return nil, nil, refusal(err)
		}
		if reg.OnDevice() {
			return nil, reg, stOK
		}
		return reg.Bytes()[r.offset : r.offset+r.length], reg, stOK
	default: // modeAddr
		if s.regions == nil {
			return nil, nil, stNotFound
		}
		reg, off, err := s.regions.FindFor(peer, r.offset, r.length)
		if err != nil {
			return nil, nil, refusal(err)
		}
		if reg.OnDevice() {
			return nil, reg, stOK
		}
		return reg.Bytes()[off : off+r.length], reg, stOK
	}
}

// refusal is the response status for a failed region lookup.
func refusal(err error) uint8 {
	if errors.Is(err, status.ErrOutOfRange) {
		return stOutOfRange
	}
	return stNotFound
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

// readBuffer is a lane's read buffer on the target: a request header and the start of its
// payload arrive together; larger payloads bypass it.
const readBuffer = 32 << 10

// acker holds a lane's PUT acks while the next request is already buffered, and writes them
// together once none is: a burst of small PUTs costs one write, not one each.
type acker struct {
	c   net.Conn
	br  *bufio.Reader
	buf []byte
}

// put queues one ack and writes the queue unless another request is waiting to be served.
func (a *acker) put(wb *[respSize]byte) error {
	a.buf = append(a.buf, wb[:]...)
	if a.br.Buffered() >= reqSize && len(a.buf) < maxAcks*respSize {
		return nil
	}
	return a.flush()
}

// flush writes the queued acks.
func (a *acker) flush() error {
	if len(a.buf) == 0 {
		return nil
	}
	_, err := a.c.Write(a.buf)
	a.buf = a.buf[:0]
	return err
}

// maxAcks bounds the acks held back.
const maxAcks = 64

// vectorState is a lane's scratch for vector requests, reused from one to the next.
type vectorState struct {
	table  []byte
	pieces []piece
	mems   [][]byte         // each piece's host memory (nil: a device region's)
	regs   []*buffer.Region // each piece's region (nil: the default region), acquired
	offs   []uint64         // each piece's offset in its region
	bufs   net.Buffers
}

// serveVector serves a PUTV or GETV (version 3): the table is read, every piece looked up and
// acquired before a byte moves, then the bytes go straight between the socket and each piece's
// memory (device pieces through the lane's staging ring), and one response answers them all.
// A table with a piece that is refused is refused whole (a PUTV's bytes are read and dropped).
func (s *server) serveVector(c net.Conn, rd *bufio.Reader, bulk *bulkReader, ack *acker, ring func(memory.Place) (*transport.Stager, error),
	peer uint32, r request, wb *[respSize]byte, v *vectorState) error {
	k := int(r.offset)
	if cap(v.table) < k*pieceSize {
		v.table = make([]byte, k*pieceSize)
	}
	v.table = v.table[:k*pieceSize]
	if _, err := io.ReadFull(rd, v.table); err != nil {
		return err
	}
	v.pieces, v.mems, v.regs, v.offs = v.pieces[:0], v.mems[:0], v.regs[:0], v.offs[:0]
	var total uint64
	for i := range k {
		p, err := decodePiece(v.table[i*pieceSize:])
		if err != nil {
			return err
		}
		total += p.length
		v.pieces = append(v.pieces, p)
	}
	if total != r.length {
		return fmt.Errorf("tcp: vector of %d bytes whose pieces add up to %d: %w", r.length, total, status.ErrProtocol)
	}
	st := uint8(stOK)
	defer func() {
		for _, reg := range v.regs {
			if reg != nil {
				reg.Release()
			}
		}
		v.regs = v.regs[:0]
		clear(v.mems)
	}()
	for _, p := range v.pieces {
		var (
			mem []byte
			reg *buffer.Region
			off uint64
			err error
		)
		switch {
		case p.key == uint32(transport.DefaultRegion):
			if s.region == nil || buffer.CheckRange(uint64(len(s.region)), p.addr, p.length) != nil {
				st = stOutOfRange // a device default region takes no vector requests
			} else {
				mem = s.region[p.addr : p.addr+p.length]
			}
		case s.regions == nil:
			st = stNotFound
		case p.key == 0:
			reg, off, err = s.regions.FindFor(peer, p.addr, p.length)
		default:
			off = p.addr
			reg, err = s.regions.LookupFor(peer, buffer.Key(p.key), p.addr, p.length)
		}
		if err != nil {
			st = refusal(err)
		}
		if st != stOK {
			break
		}
		if reg != nil && !reg.OnDevice() {
			mem = reg.Bytes()[off : off+p.length]
		}
		v.mems, v.regs, v.offs = append(v.mems, mem), append(v.regs, reg), append(v.offs, off)
	}
	resp := response{id: r.id, status: st}
	if r.op == opPutV {
		resp.op = opPutAck
		if st != stOK {
			if _, err := io.CopyN(io.Discard, rd, int64(r.length)); err != nil {
				return err
			}
		} else {
			// Runs of host pieces are read with readv straight into their memory; device
			// pieces through the lane's staging ring.
			run := 0 // the first piece of the run of host pieces not yet read
			for i := 0; i <= len(v.pieces); i++ {
				dev := i < len(v.pieces) && v.regs[i] != nil && v.regs[i].OnDevice()
				if i < len(v.pieces) && !dev {
					continue
				}
				if run < i {
					if err := bulk.readv(rd, rd, v.mems[run:i]); err != nil {
						return err
					}
				}
				run = i + 1
				if dev {
					reg := v.regs[i]
					st, err := ring(reg.Place())
					if err != nil {
						return err
					}
					if err := st.ReceiveInto(bulk.chunks(rd), reg, v.offs[i], v.pieces[i].length); err != nil {
						return err
					}
				}
			}
		}
		resp.encode(wb)
		return ack.put(wb)
	}
	if err := ack.flush(); err != nil {
		return err
	}
	resp.op = opGetData
	resp.encode(wb)
	if st != stOK {
		_, err := c.Write(wb[:])
		return err
	}
	v.bufs = append(v.bufs[:0], wb[:])
	for i, p := range v.pieces {
		reg := v.regs[i]
		if reg == nil || !reg.OnDevice() {
			v.bufs = append(v.bufs, v.mems[i])
			continue
		}
		if err := writeSliced(c, v.bufs); err != nil { // what precedes the device piece
			return err
		}
		v.bufs = v.bufs[:0]
		st, err := ring(reg.Place())
		if err != nil {
			return err
		}
		if err := st.SendFrom(c, reg, v.offs[i], p.length); err != nil {
			return err // a short reply: the initiator sees the lane end
		}
	}
	if len(v.bufs) > 0 {
		return writeSliced(c, v.bufs)
	}
	return nil
}
