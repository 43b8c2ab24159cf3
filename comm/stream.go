package comm

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"sync"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/ctrl"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// StreamConfig places the ring that SendDataTo and RecvDataFrom stage through inside the
// ConnBuffer. A stream overwrites that part of the buffer on both sides, as upstream's UHM
// stream overwrites the whole buffer.
type StreamConfig struct {
	// Offset and Size delimit the ring; Size 0 means from Offset to the end of the buffer.
	Offset, Size uint64
	// SlotSize is the size of one ring slot (one chunk in flight); 0 means min(4 MiB, Size/2).
	// The ring has Size/SlotSize slots (at most 16).
	SlotSize uint64
}

const maxStreamSlots = 16

type ring struct{ off, slot, slots uint64 }

func (s StreamConfig) ring(bufSize uint64) (ring, error) {
	size := s.Size
	if size == 0 && s.Offset <= bufSize {
		size = bufSize - s.Offset
	}
	if err := buffer.CheckRange(bufSize, s.Offset, size); err != nil || size == 0 {
		return ring{}, fmt.Errorf("comm: stream ring [%d, +%d) in a %d-byte buffer: %w", s.Offset, size, bufSize, status.ErrInvalidConfig)
	}
	slot := s.SlotSize
	if slot == 0 {
		slot = min(4<<20, max(size/2, 1))
	}
	if slot > size {
		return ring{}, fmt.Errorf("comm: stream slot %d larger than the ring %d: %w", slot, size, status.ErrInvalidConfig)
	}
	return ring{off: s.Offset, slot: slot, slots: min(size/slot, maxStreamSlots)}, nil
}

func (s StreamConfig) validate(bufSize uint64) error {
	_, err := s.ring(bufSize)
	return err
}

// Data names the memory a stream reads from or writes into: host bytes, or Len bytes at Ptr in
// memory of Type on Device (a raw host pointer has Type memory.CPU).
type Data struct {
	Host   []byte
	Ptr    memory.Ptr
	Len    uint64
	Type   memory.Type
	Device int
}

// HostData describes host bytes.
func HostData(b []byte) Data { return Data{Host: b, Len: uint64(len(b)), Type: memory.CPU} }

// DeviceData describes n bytes at p in memory of type t on device dev.
func DeviceData(p memory.Ptr, n uint64, t memory.Type, dev int) Data {
	return Data{Ptr: p, Len: n, Type: t, Device: dev}
}

// streamer runs a Communicator's SendDataTo / RecvDataFrom streams over its control plane and
// its ConnBuffer's stream ring, and keeps the devices the streams stage through (each with the
// ring page-locked for it) until close.
type streamer struct {
	buf  *buffer.ConnBuffer
	cfg  StreamConfig
	ctrl *ctrl.Manager
	log  *slog.Logger
	send sync.Mutex // one SendDataTo at a time keeps stream messages apart

	devMu  sync.Mutex
	devs   map[devKey]*devStage // guarded by devMu
	closed bool                 // guarded by devMu
}

func newStreamer(buf *buffer.ConnBuffer, cfg StreamConfig, m *ctrl.Manager, log *slog.Logger) *streamer {
	return &streamer{buf: buf, cfg: cfg, ctrl: m, log: log, devs: make(map[devKey]*devStage)}
}

// stager copies between a Data and the ConnBuffer.
type stager struct {
	d   Data
	buf *buffer.ConnBuffer
	mem *memory.Memory // d's device memory, when the buffer is host memory (owned by the Communicator)
}

func (s *streamer) newStager(d Data) (*stager, error) {
	buf := s.buf
	st := &stager{d: d, buf: buf}
	switch {
	case d.Host != nil || d.Len == 0:
	case d.Ptr == 0:
		return nil, fmt.Errorf("comm: stream data of %d bytes at a null address: %w", d.Len, status.ErrInvalidConfig)
	case d.Type == memory.CPU:
	case d.Type == buf.Type() && d.Device == buf.DeviceID():
	case buf.Type() == memory.CPU:
		m, err := s.deviceStaging(d.Type, d.Device)
		if err != nil {
			return nil, fmt.Errorf("comm: stream data in %v memory: %w", d.Type, err)
		}
		st.mem = m
	default:
		return nil, fmt.Errorf("comm: stream between %v data and a %v buffer: %w", d.Type, buf.Type(), status.ErrUnsupported)
	}
	return st, nil
}

// devStage is a device's Memory kept for streams between its memory and the host ConnBuffer,
// with the stream ring page-locked for it.
type devStage struct {
	mem   *memory.Memory
	unpin func() error // nil when the ring could not be locked (the copies still work)
}

type devKey struct {
	t   memory.Type
	dev int
}

// deviceStaging returns the Memory of device (t, dev), opened on first use and kept until Close.
// On first use it also page-locks the stream ring of the (host) ConnBuffer for that device: the
// stream's device copies then run at the page-locked rate instead of the driver's pageable path
// (H100: 54 vs 12 GB/s device-to-host at 4 MiB), as upstream registers its staging buffer.
func (s *streamer) deviceStaging(t memory.Type, dev int) (*memory.Memory, error) {
	s.devMu.Lock()
	defer s.devMu.Unlock()
	if s.closed { // close releases the devices under devMu: one opened here is refused or released
		return nil, fmt.Errorf("comm: stream: %w", status.ErrClosed)
	}
	if d, ok := s.devs[devKey{t, dev}]; ok {
		return d.mem, nil
	}
	m, err := memory.New(dev, t)
	if err != nil {
		return nil, err
	}
	d := &devStage{mem: m}
	if r, err := s.cfg.ring(s.buf.Size()); err == nil {
		if b, err := s.buf.Slice(r.off, r.slot*r.slots); err == nil {
			if unpin, err := m.PinHost(b); err == nil {
				d.unpin = unpin
			} else {
				s.log.Debug("stream ring not page-locked", "memory", t, "device", dev, "err", err)
			}
		}
	}
	s.devs[devKey{t, dev}] = d
	return m, nil
}

// close unlocks the stream ring and releases the devices opened by streams; later streams
// that need a device fail with ErrClosed.
func (s *streamer) close() error {
	s.devMu.Lock()
	defer s.devMu.Unlock()
	s.closed = true
	var first error
	for k, d := range s.devs {
		if d.unpin != nil {
			if err := d.unpin(); err != nil && first == nil {
				first = err
			}
		}
		if err := d.mem.Close(); err != nil && first == nil {
			first = err
		}
		delete(s.devs, k)
	}
	return first
}

// in copies data[a, +n) into the buffer at off.
func (s *stager) in(a, n, off uint64) error {
	switch {
	case s.d.Host != nil:
		return s.buf.WriteFromCPU(s.d.Host[a:a+n], off)
	case s.d.Type == memory.CPU:
		return s.buf.WriteFromCPU(memory.HostSlice(s.d.Ptr+memory.Ptr(a), n), off)
	case s.mem != nil:
		dst, err := s.buf.Slice(off, n)
		if err != nil {
			return err
		}
		return s.mem.CopyDeviceToHost(dst, s.d.Ptr+memory.Ptr(a))
	}
	return s.buf.WriteFromGPU(s.d.Ptr+memory.Ptr(a), n, off)
}

// out copies the buffer at off into data[a, +n).
func (s *stager) out(a, n, off uint64) error {
	switch {
	case s.d.Host != nil:
		return s.buf.ReadToCPU(s.d.Host[a:a+n], off)
	case s.d.Type == memory.CPU:
		return s.buf.ReadToCPU(memory.HostSlice(s.d.Ptr+memory.Ptr(a), n), off)
	case s.mem != nil:
		src, err := s.buf.Slice(off, n)
		if err != nil {
			return err
		}
		return s.mem.CopyHostToDevice(s.d.Ptr+memory.Ptr(a), src)
	}
	return s.buf.ReadToGPU(s.d.Ptr+memory.Ptr(a), n, off)
}

// Stream control messages (internal ctrl types; docs/wire/stream.md).
const (
	msgReady  = ctrl.FirstInternalType + 1 // receiver → sender: ring offset, slot size, slots, capacity
	msgData   = ctrl.FirstInternalType + 2 // sender → receiver: seq, len, total, abort code
	msgCredit = ctrl.FirstInternalType + 3 // receiver → sender: seq drained, slot free
)

func words(v ...uint64) []byte {
	b := make([]byte, 0, 8*len(v))
	for _, x := range v {
		b = binary.LittleEndian.AppendUint64(b, x)
	}
	return b
}

func unwords(m ctrl.Message, n int) ([]uint64, error) {
	if len(m.Payload) != 8*n {
		return nil, fmt.Errorf("comm: stream message %#x of %d bytes, want %d: %w", m.Type, len(m.Payload), 8*n, status.ErrProtocol)
	}
	v := make([]uint64, n)
	for i := range v {
		v[i] = binary.LittleEndian.Uint64(m.Payload[8*i:])
	}
	return v, nil
}

// sendDataTo streams src, of any size and memory type, to the peer at (ip, port), which must
// be in RecvDataFrom. Chunks are staged into this side's ring and put into the receiver's ring,
// staging chunk k+1 while chunk k is on the wire; the receiver drains each slot before handing it
// back. It returns when the receiver has every byte. One stream runs at a time per
// Communicator.
func (c *Communicator) sendDataTo(ctx context.Context, ip string, port int, src Data, ct transport.ConnType) error {
	ep, err := c.endpoint(ctx, ip, port, ct)
	if err != nil {
		return err
	}
	rank, err := c.peerRank(ip, port, ct)
	if err != nil {
		return err
	}
	return c.streams.sendTo(ctx, ep, rank, src)
}

// sendTo streams src to rank over ep.
func (s *streamer) sendTo(ctx context.Context, ep transport.Endpoint, rank uint32, src Data) error {
	st, err := s.newStager(src)
	if err != nil {
		return err
	}
	s.send.Lock()
	defer s.send.Unlock()
	err = s.sendStream(ctx, ep, rank, st, src.Len)
	if err != nil {
		// Tell the receiver, so it fails instead of waiting; best effort.
		_ = s.ctrl.Send(ctx, rank, msgData, 0, words(0, 0, 0, uint64(max(status.CodeOf(err), status.Error))))
		return fmt.Errorf("comm: send data to rank %d: %w", rank, err)
	}
	return nil
}

func (s *streamer) sendStream(ctx context.Context, ep transport.Endpoint, rank uint32, st *stager, total uint64) error {
	local, err := s.cfg.ring(s.buf.Size())
	if err != nil {
		return err
	}
	m, err := s.ctrl.RecvType(ctx, rank, msgReady)
	if err != nil {
		return err
	}
	v, err := unwords(m, 4)
	if err != nil {
		return err
	}
	remote := ring{off: v[0], slot: v[1], slots: v[2]}
	capacity := v[3]
	if remote.slot == 0 || remote.slots == 0 || remote.slots > maxStreamSlots || remote.slot > ep.RemoteSize() ||
		buffer.CheckRange(ep.RemoteSize(), remote.off, remote.slot*remote.slots) != nil {
		return fmt.Errorf("comm: receiver's ring %+v does not fit its %d-byte buffer: %w", remote, ep.RemoteSize(), status.ErrProtocol)
	}
	if total > capacity {
		return fmt.Errorf("comm: payload of %d bytes exceeds the receiver's destination of %d: %w", total, capacity, status.ErrInvalidConfig)
	}
	if total == 0 {
		if err := s.ctrl.Send(ctx, rank, msgData, 0, words(0, 0, 0, 0)); err != nil {
			return err
		}
		_, err := s.ctrl.RecvType(ctx, rank, msgCredit)
		return err
	}
	chunk := min(local.slot, remote.slot)
	type flight struct {
		seq, n uint64
		op     *transport.Op
	}
	var (
		fifo     []flight
		credits  = remote.slots
		seq      uint64
		off      uint64
		chunks   = (total + chunk - 1) / chunk
		credited uint64
	)
	takeCredit := func() error {
		m, err := s.ctrl.RecvType(ctx, rank, msgCredit)
		if err != nil {
			return err
		}
		if _, err := unwords(m, 1); err != nil {
			return err
		}
		credits++
		credited++
		return nil
	}
	for off < total || len(fifo) > 0 {
		// Post the next chunk while a local slot and a receiver slot are free. With no receiver
		// slot free, first announce the chunks in flight (the receiver credits only what it
		// was told about); wait for a credit only when nothing is left to announce.
		if off < total && uint64(len(fifo)) < local.slots && (credits > 0 || len(fifo) == 0) {
			if credits == 0 {
				if err := takeCredit(); err != nil {
					return err
				}
			}
			n := min(chunk, total-off)
			lo := local.off + (seq%local.slots)*local.slot
			ro := remote.off + (seq%remote.slots)*remote.slot
			if err := st.in(off, n, lo); err != nil { // overlaps the puts already in flight
				return err
			}
			op, err := ep.PutAsync(ctx, lo, ro, n)
			if err != nil {
				return err
			}
			fifo = append(fifo, flight{seq: seq, n: n, op: op})
			credits--
			seq++
			off += n
			continue
		}
		f := fifo[0]
		fifo = fifo[1:]
		if err := f.op.Wait(ctx); err != nil {
			return err
		}
		// The bytes are visible in the receiver's slot: tell it.
		if err := s.ctrl.Send(ctx, rank, msgData, 0, words(f.seq, f.n, total, 0)); err != nil {
			return err
		}
	}
	for credited < chunks { // the last credits say the receiver has drained everything
		if err := takeCredit(); err != nil {
			return err
		}
	}
	return nil
}

// recvDataFrom receives a SendDataTo stream from the peer at (ip, port) into dst and returns
// the number of bytes received. The peer may be one that connected to us (port is then its data
// listen port, or 0 if it is the only peer from ip). dst.Len is the capacity: a larger payload
// fails on both sides.
func (c *Communicator) recvDataFrom(ctx context.Context, ip string, port int, dst Data, ct transport.ConnType) (uint64, error) {
	rank, err := c.peerRank(ip, port, ct)
	if err != nil {
		return 0, err
	}
	return c.streams.recvFrom(ctx, rank, dst)
}

// recvFrom receives rank's stream into dst.
func (s *streamer) recvFrom(ctx context.Context, rank uint32, dst Data) (uint64, error) {
	st, err := s.newStager(dst)
	if err != nil {
		return 0, err
	}
	n, err := s.recvStream(ctx, rank, st, dst.Len)
	if err != nil {
		return n, fmt.Errorf("comm: recv data from rank %d: %w", rank, err)
	}
	return n, nil
}

func (s *streamer) recvStream(ctx context.Context, rank uint32, st *stager, capacity uint64) (uint64, error) {
	r, err := s.cfg.ring(s.buf.Size())
	if err != nil {
		return 0, err
	}
	if err := s.ctrl.Send(ctx, rank, msgReady, 0, words(r.off, r.slot, r.slots, capacity)); err != nil {
		return 0, err
	}
	var received, total, expect uint64
	for first := true; first || received < total; first = false {
		m, err := s.ctrl.RecvType(ctx, rank, msgData)
		if err != nil {
			return received, err
		}
		v, err := unwords(m, 4)
		if err != nil {
			return received, err
		}
		seq, n, tot, abort := v[0], v[1], v[2], v[3]
		if abort != 0 {
			return received, fmt.Errorf("comm: sender aborted the stream (%v): %w", status.Code(abort), status.Code(abort).Err())
		}
		if first {
			total = tot
			if total > capacity {
				return 0, fmt.Errorf("comm: payload of %d bytes exceeds the destination of %d: %w", total, capacity, status.ErrInvalidConfig)
			}
		}
		if tot != total || seq != expect || n > r.slot || n > total-received || (n == 0 && total != 0) {
			return received, fmt.Errorf("comm: stream chunk seq %d len %d total %d after %d of %d bytes: %w",
				seq, n, tot, received, total, status.ErrProtocol)
		}
		if n > 0 {
			if err := st.out(received, n, r.off+(seq%r.slots)*r.slot); err != nil { // drain before handing the slot back
				return received, err
			}
		}
		if err := s.ctrl.Send(ctx, rank, msgCredit, 0, words(seq)); err != nil {
			return received, err
		}
		received += n
		expect++
	}
	return received, nil
}
