package main

import (
	"context"
	"os/exec"
	"syscall"
)

// childCommand is exec.CommandContext for the helper processes the CLI starts (a bench's
// target, Big Memory's and SHMEM's ranks): each is killed when the process that started it
// dies, even by a signal the parent cannot catch, so that a bench stopped by timeout(1) or
// SIGKILL leaves no server behind holding its ports and its caller's output pipe.
func childCommand(ctx context.Context, exe string, args ...string) *exec.Cmd {
	c := exec.CommandContext(ctx, exe, args...)
	c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return c
}
