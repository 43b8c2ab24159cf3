package peercred

import (
	"fmt"
	"os"
	"slices"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/hmc-go/hmc/status"
)

// Cred is a peer process's identity as the kernel recorded it when the socket connected.
type Cred struct {
	PID int
	UID uint32
	GID uint32
}

// Policy says which users' processes may talk to us over a Unix socket. The zero value admits
// only processes of this process's effective user.
type Policy struct {
	// UIDs admitted besides this process's effective user. Root is not admitted unless listed
	// (it can reach any memory by other means, but nothing here invites it).
	UIDs []uint32
}

// Admits reports whether a peer of user uid is admitted.
func (p Policy) Admits(uid uint32) bool {
	return uid == uint32(os.Geteuid()) || slices.Contains(p.UIDs, uid)
}

// Of returns the credentials of the process at the other end of c, a connected Unix socket.
func Of(c syscall.Conn) (Cred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return Cred{}, fmt.Errorf("peer credentials: %w: %w", status.ErrFailed, err)
	}
	var uc *unix.Ucred
	var serr error
	if err := rc.Control(func(fd uintptr) {
		uc, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return Cred{}, fmt.Errorf("peer credentials: %w: %w", status.ErrFailed, err)
	}
	if serr != nil {
		return Cred{}, fmt.Errorf("peer credentials (SO_PEERCRED): %w: %w", status.ErrFailed, serr)
	}
	return Cred{PID: int(uc.Pid), UID: uc.Uid, GID: uc.Gid}, nil
}

// Check returns the credentials of c's peer if p admits it, else an error wrapping
// status.ErrPermission that names the peer's pid and uid.
func (p Policy) Check(c syscall.Conn) (Cred, error) {
	cred, err := Of(c)
	if err != nil {
		return cred, err
	}
	if !p.Admits(cred.UID) {
		return cred, fmt.Errorf("peer pid %d uid %d is not admitted (this process runs as uid %d; allow other users explicitly): %w",
			cred.PID, cred.UID, os.Geteuid(), status.ErrPermission)
	}
	return cred, nil
}
