package buffer

import (
	"fmt"
	"sync"

	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
)

// ConnBuffer is a registered buffer addressed by offset. Its methods are safe for concurrent
// use, but concurrent writers to overlapping ranges race on the bytes, as with any memory.
type ConnBuffer struct {
	mem  *memory.Memory
	buf  *memory.Buffer
	size uint64

	closeOnce sync.Once
	closeErr  error
}

// New allocates a ConnBuffer of size bytes of memory type t on device deviceID (Default
// resolves as in memory.New). Host buffers are page-aligned, zeroed and memfd-backed.
func New(deviceID int, size uint64, t memory.Type) (*ConnBuffer, error) {
	if size == 0 {
		return nil, fmt.Errorf("conn buffer: size 0: %w", status.ErrInvalidConfig)
	}
	mem, err := memory.New(deviceID, t)
	if err != nil {
		return nil, fmt.Errorf("conn buffer: %w", err)
	}
	buf, err := mem.Alloc(size)
	if err != nil {
		_ = mem.Close() // nothing was allocated; the Alloc error is the one to report
		return nil, fmt.Errorf("conn buffer: %w", err)
	}
	return &ConnBuffer{mem: mem, buf: buf, size: size}, nil
}

// Adopt makes host memory that another library allocated a ConnBuffer (see memory.Adopt):
// ucx.NewHostBuffer uses it for memory UCX allocated, which its shared-memory transports can
// write into directly. The buffer has no memfd (FD -1), so the SHM transport cannot serve it
// (AUTO falls back to TCP). Close calls release once; b must stay valid until then.
func Adopt(b []byte, release func() error) (*ConnBuffer, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("conn buffer: size 0: %w", status.ErrInvalidConfig)
	}
	mem, err := memory.New(0, memory.CPU)
	if err != nil {
		return nil, fmt.Errorf("conn buffer: %w", err)
	}
	buf, err := mem.Adopt(b, release)
	if err != nil {
		_ = mem.Close() // nothing was adopted; the Adopt error is the one to report
		return nil, fmt.Errorf("conn buffer: %w", err)
	}
	return &ConnBuffer{mem: mem, buf: buf, size: uint64(len(b))}, nil
}

// Size returns the buffer's size in bytes.
func (c *ConnBuffer) Size() uint64 { return c.size }

// Type returns the resolved memory type (never Default).
func (c *ConnBuffer) Type() memory.Type { return c.mem.Type() }

// DeviceID returns the device the buffer lives on.
func (c *ConnBuffer) DeviceID() int { return c.mem.DeviceID() }

// Ptr returns the buffer's base address (host or device).
func (c *ConnBuffer) Ptr() memory.Ptr { return c.buf.Ptr() }

// Memory returns the Memory that owns the buffer, for copies to and from other buffers of the
// same device.
func (c *ConnBuffer) Memory() *memory.Memory { return c.mem }

// FD returns the memfd behind a host buffer, or -1 (see memory.Buffer.FD).
func (c *ConnBuffer) FD() int { return c.buf.FD() }

// Bytes returns the whole buffer as a slice if it is host memory, else nil. The slice is valid
// until Close.
func (c *ConnBuffer) Bytes() []byte { return c.buf.Bytes() }

// Check returns nil if [off, off+n) lies within the buffer, else an error wrapping
// status.ErrOutOfRange. It never overflows.
func (c *ConnBuffer) Check(off, n uint64) error { return CheckRange(c.size, off, n) }

// CheckRange returns nil if [off, off+n) lies within a region of size bytes, else an error
// wrapping status.ErrOutOfRange. It is the one range check every transport uses, on either side.
func CheckRange(size, off, n uint64) error {
	if off > size || n > size-off {
		return fmt.Errorf("offset %d + size %d exceeds buffer of %d bytes: %w", off, n, size, status.ErrOutOfRange)
	}
	return nil
}

// Slice returns the host bytes [off, off+n) of a host buffer. It fails with ErrOutOfRange for a
// bad range and ErrUnsupported for device memory.
func (c *ConnBuffer) Slice(off, n uint64) ([]byte, error) {
	if err := c.Check(off, n); err != nil {
		return nil, err
	}
	b := c.buf.Bytes()
	if b == nil {
		return nil, fmt.Errorf("conn buffer: %v memory is not host-addressable: %w", c.Type(), status.ErrUnsupported)
	}
	return b[off : off+n : off+n], nil
}

// WriteFromCPU copies host bytes src into the buffer at off.
func (c *ConnBuffer) WriteFromCPU(src []byte, off uint64) error {
	if err := c.Check(off, uint64(len(src))); err != nil {
		return fmt.Errorf("write from cpu: %w", err)
	}
	return c.mem.CopyHostToDevice(c.buf.Ptr()+memory.Ptr(off), src)
}

// ReadToCPU copies len(dst) bytes at off out of the buffer into host memory dst.
func (c *ConnBuffer) ReadToCPU(dst []byte, off uint64) error {
	if err := c.Check(off, uint64(len(dst))); err != nil {
		return fmt.Errorf("read to cpu: %w", err)
	}
	return c.mem.CopyDeviceToHost(dst, c.buf.Ptr()+memory.Ptr(off))
}

// WriteFromCPUAsync starts copying src into the buffer at off and returns the wait for its end
// (Memory.CopyHostToDeviceAsync): a staging ring queues several chunks' copies.
func (c *ConnBuffer) WriteFromCPUAsync(src []byte, off uint64) (wait func() error, err error) {
	if err := c.Check(off, uint64(len(src))); err != nil {
		return nil, fmt.Errorf("write from cpu: %w", err)
	}
	return c.mem.CopyHostToDeviceAsync(c.buf.Ptr()+memory.Ptr(off), src)
}

// ReadToCPUAsync starts copying len(dst) bytes at off into host memory dst, as
// WriteFromCPUAsync.
func (c *ConnBuffer) ReadToCPUAsync(dst []byte, off uint64) (wait func() error, err error) {
	if err := c.Check(off, uint64(len(dst))); err != nil {
		return nil, fmt.Errorf("read to cpu: %w", err)
	}
	return c.mem.CopyDeviceToHostAsync(dst, c.buf.Ptr()+memory.Ptr(off))
}

// WriteFromGPU copies n bytes from device address src (on this buffer's device) into the
// buffer at off. As upstream, it fails on a CPU buffer: copy device memory to a host buffer with
// the device's own Memory.CopyDeviceToHost into Bytes().
func (c *ConnBuffer) WriteFromGPU(src memory.Ptr, n, off uint64) error {
	if err := c.deviceOnly("write from gpu"); err != nil {
		return err
	}
	if err := c.Check(off, n); err != nil {
		return fmt.Errorf("write from gpu: %w", err)
	}
	return c.mem.CopyDeviceToDevice(c.buf.Ptr()+memory.Ptr(off), src, n)
}

// ReadToGPU copies n bytes at off out of the buffer to device address dst (on this buffer's
// device). It fails on a CPU buffer, as WriteFromGPU.
func (c *ConnBuffer) ReadToGPU(dst memory.Ptr, n, off uint64) error {
	if err := c.deviceOnly("read to gpu"); err != nil {
		return err
	}
	if err := c.Check(off, n); err != nil {
		return fmt.Errorf("read to gpu: %w", err)
	}
	return c.mem.CopyDeviceToDevice(dst, c.buf.Ptr()+memory.Ptr(off), n)
}

func (c *ConnBuffer) deviceOnly(op string) error {
	if c.Type() == memory.CPU {
		return fmt.Errorf("%s: buffer is CPU memory; use the device's Memory.CopyDeviceToHost into Bytes(): %w",
			op, status.ErrInvalidConfig)
	}
	return nil
}

// CopyWithin copies n bytes from srcOff to dstOff inside the buffer. Overlapping ranges are
// safe on CPU buffers (memmove); on devices they follow the driver's memcpy.
func (c *ConnBuffer) CopyWithin(dstOff, srcOff, n uint64) error {
	if err := c.Check(dstOff, n); err != nil {
		return fmt.Errorf("copy within (dst): %w", err)
	}
	if err := c.Check(srcOff, n); err != nil {
		return fmt.Errorf("copy within (src): %w", err)
	}
	if n == 0 || dstOff == srcOff {
		return nil
	}
	return c.mem.CopyDeviceToDevice(c.buf.Ptr()+memory.Ptr(dstOff), c.buf.Ptr()+memory.Ptr(srcOff), n)
}

// Close frees the buffer and its Memory. It is idempotent; the buffer must not be in use by a
// transport (close the Communicator first).
func (c *ConnBuffer) Close() error {
	c.closeOnce.Do(func() { c.closeErr = c.mem.Close() })
	return c.closeErr
}
