//go:build ucx && cgo

package ucx

import (
	"fmt"
	"os"
	"syscall"
)

// ExecWithoutErrorSignals re-executes the running program with UCX_ERROR_SIGNALS set empty,
// unless the environment sets that variable already (to anything, empty included), so that
// UCX installs no handler for SIGSEGV, SIGBUS, SIGILL and SIGFPE and Go reports a fault inside
// UCX with the Go stacks (see the package doc). It returns nil without doing anything when
// there is nothing to do; when it re-executes, it does not return. Call it first thing in
// main (or TestMain), before any other goroutine or state exists.
func ExecWithoutErrorSignals() error {
	if _, set := os.LookupEnv("UCX_ERROR_SIGNALS"); set {
		return nil
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("ucx: re-exec without UCX's signal handlers: %w", err)
	}
	err = syscall.Exec(exe, os.Args, append(os.Environ(), "UCX_ERROR_SIGNALS="))
	return fmt.Errorf("ucx: re-exec %s without UCX's signal handlers: %w", exe, err)
}
