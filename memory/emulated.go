package memory

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/hmc-go/hmc/status"
)

// EmulateGPUEnv, set to 1, makes NVIDIA_GPU memory an emulation in host memory when no CUDA
// device is present: buffers hide their bytes (Bytes returns nil) and every access goes through
// the device copy functions, as with a real GPU. It exists so that the device paths (staging
// rings, g2h2g, --mem cuda) are exercised by tests on machines without a GPU; it is never
// chosen unless asked for.
const EmulateGPUEnv = "HMC_EMULATE_GPU"

func emulating() bool { return os.Getenv(EmulateGPUEnv) == "1" }

// emulatedBackend is "device" memory that is really anonymous host memory, copied by the CPU.
type emulatedBackend struct{ cpuCopies }

func (emulatedBackend) alloc(size uint64) (*Buffer, error) {
	b, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("memory: emulated device alloc of %d bytes: %w: %w", size, status.ErrFailed, err)
	}
	return &Buffer{ptr: Ptr(unsafe.Pointer(unsafe.SliceData(b))), size: size, fd: -1}, nil
}

func (emulatedBackend) free(b *Buffer) error {
	return unix.Munmap(HostSlice(b.ptr, b.size))
}

// pinHost has nothing to lock: the emulated device copies with the CPU. It succeeds, so that the
// callers' pinned paths (and their unpinning) run in tests.
func (emulatedBackend) pinHost([]byte) (func() error, error) { return func() error { return nil }, nil }

func (emulatedBackend) close() error { return nil }
