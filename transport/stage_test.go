package transport_test

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/transporttest"
)

// slowRegion is a DeviceIO whose queued copies run on goroutines of their own and end only
// after delay, as a device's do: a Stager that reused a chunk before waiting for its copy would
// corrupt the bytes.
type slowRegion struct {
	mu    sync.Mutex
	mem   []byte
	delay time.Duration
}

func (r *slowRegion) Check(off, n uint64) error {
	if off > uint64(len(r.mem)) || n > uint64(len(r.mem))-off {
		return fmt.Errorf("[%d, +%d): %w", off, n, status.ErrOutOfRange)
	}
	return nil
}

func (r *slowRegion) WriteFromCPU(src []byte, off uint64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	copy(r.mem[off:], src)
	return nil
}

func (r *slowRegion) ReadToCPU(dst []byte, off uint64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	copy(dst, r.mem[off:])
	return nil
}

// async starts f after the delay and returns the wait for it.
func (r *slowRegion) async(f func()) func() error {
	done := make(chan struct{})
	go func() {
		time.Sleep(r.delay)
		f()
		close(done)
	}()
	return func() error { <-done; return nil }
}

func (r *slowRegion) WriteFromCPUAsync(src []byte, off uint64) (func() error, error) {
	if err := r.Check(off, uint64(len(src))); err != nil {
		return nil, err
	}
	return r.async(func() { _ = r.WriteFromCPU(src, off) }), nil
}

func (r *slowRegion) ReadToCPUAsync(dst []byte, off uint64) (func() error, error) {
	if err := r.Check(off, uint64(len(dst))); err != nil {
		return nil, err
	}
	return r.async(func() { _ = r.ReadToCPU(dst, off) }), nil
}

// TestStagerQueuedCopies: a region whose copies are queued and end late moves every byte both
// ways, in one chunk and in many (more than the ring holds), and a range outside it is refused.
func TestStagerQueuedCopies(t *testing.T) {
	const chunk, depth = 4096, 4
	st, err := transport.NewRing(func(n uint64) ([]byte, func() error, error) { return make([]byte, n), func() error { return nil }, nil }, chunk, depth)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, n := range []uint64{1, chunk, chunk + 1, 13*chunk + 7} {
		src := make([]byte, n)
		transporttest.Fill(src, uint32(n))
		reg := &slowRegion{mem: make([]byte, n+3), delay: time.Millisecond}
		if err := st.ReceiveInto(bytes.NewReader(src), reg, 3, n); err != nil {
			t.Fatalf("receive %d bytes: %v", n, err)
		}
		if !bytes.Equal(reg.mem[3:], src) {
			t.Fatalf("receive %d bytes: the region's bytes differ", n)
		}
		var out bytes.Buffer
		if err := st.SendFrom(&out, reg, 3, n); err != nil {
			t.Fatalf("send %d bytes: %v", n, err)
		}
		if !bytes.Equal(out.Bytes(), src) {
			t.Fatalf("send %d bytes: the bytes sent differ", n)
		}
	}
	reg := &slowRegion{mem: make([]byte, chunk)}
	if err := st.SendFrom(&bytes.Buffer{}, reg, 1, chunk); err == nil {
		t.Fatal("a range past the region's end was sent")
	}
}
