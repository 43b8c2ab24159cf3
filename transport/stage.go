package transport

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"

	"github.com/hmc-go/hmc/buffer"
)

// Stager moves bytes between a stream and a region that is not host memory (a GPU
// ConnBuffer, HMC's g2h2g), through a bounded ring of host chunks — page-locked where the
// device supports it — overlapping the stream with the device copies: while one chunk is on the
// wire the next is being copied. Host memory use is depth × chunk whatever the transfer size.
// A Stager serves one transfer at a time.
type Stager struct {
	region DeviceIO // the region Receive and Send address; nil for a ring made by NewRing
	free   chan []byte
	frees  []func() error
	chunk  int // the size of every chunk
}

// DeviceIO is memory the host reaches only by copies: a device ConnBuffer, a device region of a
// Table.
type DeviceIO interface {
	Check(off, n uint64) error
	WriteFromCPU(src []byte, off uint64) error
	ReadToCPU(dst []byte, off uint64) error
}

var (
	_ DeviceIO = (*buffer.ConnBuffer)(nil)
	_ DeviceIO = (*buffer.Region)(nil)
)

// Staging defaults: 4 chunks of 1 MiB, unless HMC_STAGE_CHUNK (bytes) and HMC_STAGE_DEPTH
// (chunks) name others for this process (they override StageSizes' too).
const (
	DefaultStageChunk = 1 << 20
	DefaultStageDepth = 4
)

// StageSizes returns chunk and depth, or what HMC_STAGE_CHUNK and HMC_STAGE_DEPTH name instead:
// the size of a ring whose maker chose its own.
func StageSizes(chunk, depth int) (int, int) {
	if os.Getenv("HMC_STAGE_CHUNK") != "" || os.Getenv("HMC_STAGE_DEPTH") != "" {
		return stageDefaults()
	}
	return chunk, depth
}

// stageDefaults returns the chunk size and depth a ring takes when its caller names none.
var stageDefaults = sync.OnceValues(func() (chunk, depth int) {
	chunk, depth = DefaultStageChunk, DefaultStageDepth
	if v, err := strconv.Atoi(os.Getenv("HMC_STAGE_CHUNK")); err == nil && v >= 4096 && v <= 1<<30 {
		chunk = v
	}
	if v, err := strconv.Atoi(os.Getenv("HMC_STAGE_DEPTH")); err == nil && v >= 2 && v <= 1024 {
		depth = v
	}
	return chunk, depth
})

// NewStager allocates the ring for region (chunk and depth ≤ 0 take the defaults).
func NewStager(region *buffer.ConnBuffer, chunk, depth int) (*Stager, error) {
	s, err := NewRing(region.Memory().AllocStaging, chunk, depth)
	if err != nil {
		return nil, err
	}
	s.region = region
	return s, nil
}

// NewRing allocates a ring of depth chunks with alloc (memory.AllocStagingFor for a device,
// say), for ReceiveInto and SendFrom of any region.
func NewRing(alloc func(uint64) ([]byte, func() error, error), chunk, depth int) (*Stager, error) {
	dc, dd := stageDefaults()
	if chunk <= 0 {
		chunk = dc
	}
	if depth <= 0 {
		depth = dd
	}
	if depth < 2 {
		depth = 2 // one chunk on the wire, one being copied
	}
	s := &Stager{free: make(chan []byte, depth), chunk: chunk}
	for range depth {
		b, free, err := alloc(uint64(chunk))
		if err != nil {
			_ = s.Close()
			return nil, fmt.Errorf("staging ring: %w", err)
		}
		s.frees = append(s.frees, free)
		s.free <- b
	}
	return s, nil
}

// Close frees the ring. The Stager must be idle.
func (s *Stager) Close() error {
	var first error
	for _, f := range s.frees {
		if err := f(); err != nil && first == nil {
			first = err
		}
	}
	s.frees = nil
	return first
}

type piece struct {
	b    []byte
	off  uint64
	err  error
	wait func() error // an issued device copy into b: waited for before b is used or reused
}

// asyncWriter is a DeviceIO whose copies from host memory can be queued (DeviceRange, a
// Region, a ConnBuffer).
type asyncWriter interface {
	WriteFromCPUAsync(src []byte, off uint64) (wait func() error, err error)
}

// asyncReader is a DeviceIO whose copies to host memory can be queued, as asyncWriter.
type asyncReader interface {
	ReadToCPUAsync(dst []byte, off uint64) (wait func() error, err error)
}

// Receive reads n bytes from r into the region at off: chunk i+1 is read while chunk i is
// copied to the device. It returns the first error (the stream's or the device's); after a
// stream error the stream's position is undefined.
func (s *Stager) Receive(r io.Reader, off, n uint64) error { return s.ReceiveInto(r, s.region, off, n) }

// ReceiveInto is Receive into region.
func (s *Stager) ReceiveInto(r io.Reader, region DeviceIO, off, n uint64) error {
	if err := region.Check(off, n); err != nil {
		return fmt.Errorf("staging: %w", err)
	}
	if n <= uint64(s.chunk) { // one chunk: nothing to overlap, no goroutine
		b := <-s.free
		defer func() { s.free <- b }()
		if _, err := io.ReadFull(r, b[:n]); err != nil {
			return err
		}
		if err := region.WriteFromCPU(b[:n], off); err != nil {
			return fmt.Errorf("staging: to device: %w", err)
		}
		return nil
	}
	filled := make(chan piece, cap(s.free))
	copied := make(chan error, 1)
	aw, async := region.(asyncWriter)
	go func() { // owned by Receive: it closes filled and waits for copied
		var err error
		// A region with WriteFromCPUAsync has up to half the ring's copies queued at once (the
		// fixed cost of one overlaps the copy before it); the oldest is waited for, and its
		// chunk given back, before more are queued. Every queued copy is waited for.
		var queued []piece
		oldest := func() {
			p := queued[0]
			queued = queued[1:]
			if e := p.wait(); err == nil {
				err = e
			}
			s.free <- p.b[:cap(p.b)]
		}
		for p := range filled {
			if err == nil && async {
				var e error
				if p.wait, e = aw.WriteFromCPUAsync(p.b, p.off); e == nil {
					queued = append(queued, p)
					for len(queued) > max(1, cap(s.free)/2) || (len(queued) > 0 && len(filled) == 0 && len(s.free) == 0) {
						oldest()
					}
					continue
				}
				err = e
			} else if err == nil {
				err = region.WriteFromCPU(p.b, p.off)
			}
			s.free <- p.b[:cap(p.b)]
		}
		for len(queued) > 0 {
			oldest()
		}
		copied <- err
	}()
	var rerr error
	for done := uint64(0); done < n; {
		b := <-s.free
		k := min(uint64(len(b)), n-done)
		if _, err := io.ReadFull(r, b[:k]); err != nil {
			s.free <- b
			rerr = err
			break
		}
		filled <- piece{b: b[:k], off: off + done}
		done += k
	}
	close(filled)
	cerr := <-copied
	if rerr != nil {
		return rerr
	}
	if cerr != nil {
		return fmt.Errorf("staging: to device: %w", cerr)
	}
	return nil
}

// Send writes n bytes of the region at off to w: chunk i+1 is copied from the device while
// chunk i is written (a region with ReadToCPUAsync has the copies of every free chunk queued,
// each waited for before its chunk is written). A device error ends the transfer before its
// bytes are written: the stream is then short, and the caller must end it.
func (s *Stager) Send(w io.Writer, off, n uint64) error { return s.SendFrom(w, s.region, off, n) }

// SendFrom is Send from region.
func (s *Stager) SendFrom(w io.Writer, region DeviceIO, off, n uint64) error {
	if err := region.Check(off, n); err != nil {
		return fmt.Errorf("staging: %w", err)
	}
	if n <= uint64(s.chunk) { // one chunk: nothing to overlap, no goroutine
		b := <-s.free
		defer func() { s.free <- b }()
		if err := region.ReadToCPU(b[:n], off); err != nil {
			return fmt.Errorf("staging: from device: %w", err)
		}
		_, err := w.Write(b[:n])
		return err
	}
	ready := make(chan piece, cap(s.free))
	stop := make(chan struct{})
	var once sync.Once
	halt := func() { once.Do(func() { close(stop) }) }
	defer halt()
	ar, async := region.(asyncReader)
	go func() { // owned by Send: it drains ready, which this closes
		defer close(ready)
		for done := uint64(0); done < n; {
			var b []byte
			select {
			case b = <-s.free:
			case <-stop:
				return
			}
			k := min(uint64(len(b)), n-done)
			var p piece
			if async {
				p.wait, p.err = ar.ReadToCPUAsync(b[:k], off+done)
			} else {
				p.err = region.ReadToCPU(b[:k], off+done)
			}
			p.b = b[:k]
			ready <- p
			if p.err != nil {
				return
			}
			done += k
		}
	}()
	var err error
	for p := range ready {
		if p.wait != nil { // always: the copy must have ended before the chunk is reused
			if werr := p.wait(); p.err == nil {
				p.err = werr
			}
		}
		if err == nil {
			if p.err != nil {
				err = fmt.Errorf("staging: from device: %w", p.err)
			} else if _, werr := w.Write(p.b); werr != nil {
				err = werr
			}
			if err != nil {
				halt()
			}
		}
		s.free <- p.b[:cap(p.b)]
	}
	return err
}
