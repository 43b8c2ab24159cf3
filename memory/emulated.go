package memory

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/hmc-go/hmc/status"
)

// EmulateGPUEnv is the environment variable (HMC_EMULATE_GPU=1) with which cmd/hmc, the C
// library and test processes turn SetEmulateGPU on; this package does not read it.
const EmulateGPUEnv = "HMC_EMULATE_GPU"

var emulate atomic.Bool

// SetEmulateGPU turns on (or off) the emulation of NVIDIA_GPU memory in host memory where no
// CUDA device is present: buffers hide their bytes (Bytes returns nil) and every access goes
// through the device copy functions, as with a real GPU. It exists so that the device paths
// (staging rings, g2h2g, --mem cuda) are exercised on machines without a GPU; it is never
// chosen unless asked for. It returns the previous setting.
func SetEmulateGPU(on bool) (was bool) { return emulate.Swap(on) }

func emulating() bool { return emulate.Load() }

// emulatedBackend is "device" memory that is really anonymous host memory, copied by the CPU.
type emulatedBackend struct{ cpuCopies }

func (emulatedBackend) alloc(size uint64) (*Buffer, error) {
	b, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("memory: emulated device alloc of %d bytes: %w: %w", size, status.ErrFailed, err)
	}
	p := Ptr(unsafe.Pointer(unsafe.SliceData(b)))
	emulated.add(p, size)
	return &Buffer{ptr: p, size: size, fd: -1}, nil
}

func (emulatedBackend) free(b *Buffer) error {
	emulated.remove(b.ptr)
	return unix.Munmap(HostSlice(b.ptr, b.size))
}

// pinHost has nothing to lock: the emulated device copies with the CPU. It succeeds, so that the
// callers' pinned paths (and their unpinning) run in tests.
func (emulatedBackend) pinHost([]byte) (func() error, error) { return func() error { return nil }, nil }

func (emulatedBackend) close() error { return nil }
