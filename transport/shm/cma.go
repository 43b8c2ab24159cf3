package shm

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/hmc-go/hmc/status"
)

// AllowPeerAccess lets process pid — a peer this process admitted (same user, or one its
// policy allows, as the kernel checks too) — read and write this process's memory with
// cross-memory attach where the Yama LSM restricts ptrace to descendants
// (prctl(PR_SET_PTRACER, pid)); it is harmless where Yama is absent. Yama keeps one such
// exception per process: the last pid given replaces the one before. Nothing here ever opens
// this process to every process of the user (PR_SET_PTRACER_ANY).
func AllowPeerAccess(pid int) error {
	if pid <= 0 {
		return fmt.Errorf("shm: allow peer access: pid %d: %w", pid, status.ErrInvalidConfig)
	}
	if err := unix.Prctl(unix.PR_SET_PTRACER, uintptr(pid), 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("shm: prctl(PR_SET_PTRACER, %d): %w: %w", pid, status.ErrUnsupported, err)
	}
	return nil
}

// Process is a same-host peer whose memory, registered or not, is read and written with
// process_vm_readv/writev (CMA): one copy, done by the initiator's kernel call, no mapping.
// It is for the transfer engine's arbitrary user buffers; registered ConnBuffers go through the
// mapped memfd, which is faster for small transfers.
type Process struct {
	pid int
}

// OpenProcess returns a handle on process pid. Permission is checked by the kernel on each
// transfer; a refusal is ErrUnsupported with the reason.
func OpenProcess(pid int) (*Process, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("shm: pid %d: %w", pid, status.ErrInvalidConfig)
	}
	if err := unix.Kill(pid, 0); err != nil && !errors.Is(err, unix.EPERM) {
		return nil, fmt.Errorf("shm: process %d: %w: %w", pid, status.ErrNotFound, err)
	}
	return &Process{pid: pid}, nil
}

// Write copies src to address remote in the process.
func (p *Process) Write(remote uintptr, src []byte) error {
	return p.transfer(remote, src, true)
}

// Read copies len(dst) bytes at address remote in the process into dst.
func (p *Process) Read(dst []byte, remote uintptr) error {
	return p.transfer(remote, dst, false)
}

func (p *Process) transfer(remote uintptr, b []byte, write bool) error {
	for done := 0; done < len(b); {
		rest := b[done:]
		local := []unix.Iovec{{Base: unsafe.SliceData(rest)}}
		local[0].SetLen(len(rest))
		rem := []unix.RemoteIovec{{Base: remote + uintptr(done), Len: len(rest)}}
		var n int
		var err error
		if write {
			n, err = unix.ProcessVMWritev(p.pid, local, rem, 0)
		} else {
			n, err = unix.ProcessVMReadv(p.pid, local, rem, 0)
		}
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EPERM), errors.Is(err, unix.ENOSYS):
			return fmt.Errorf("shm: cross-memory access to process %d refused (ptrace policy: Yama ptrace_scope, a container's seccomp or a different user; the target may call AllowPeerAccess): %w: %w",
				p.pid, status.ErrUnsupported, err)
		case errors.Is(err, unix.ESRCH):
			return fmt.Errorf("shm: process %d: %w: %w", p.pid, status.ErrPeerClosed, err)
		case errors.Is(err, unix.EFAULT):
			return fmt.Errorf("shm: process %d address %#x+%d: %w: %w", p.pid, remote+uintptr(done), len(rest), status.ErrOutOfRange, err)
		case err != nil:
			return fmt.Errorf("shm: process %d: %w: %w", p.pid, status.ErrFailed, err)
		case n == 0:
			return fmt.Errorf("shm: process %d address %#x: no progress: %w", p.pid, remote+uintptr(done), status.ErrOutOfRange)
		}
		done += n
	}
	return nil
}
