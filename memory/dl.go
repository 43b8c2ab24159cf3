package memory

import (
	"errors"
	"fmt"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/hmc-go/hmc/status"
)

// dlopenFirst opens the first library of names that loads, or returns an ErrUnsupported error
// that lists every name tried and the loader's last complaint.
func dlopenFirst(what string, names ...string) (uintptr, error) {
	var last error
	for _, n := range names {
		h, err := purego.Dlopen(n, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err == nil {
			return h, nil
		}
		last = err
	}
	return 0, fmt.Errorf("%s: %w: none of %s could be loaded (last: %v)", what, status.ErrUnsupported,
		strings.Join(names, ", "), last)
}

// rtldNoLoad is glibc's RTLD_NOLOAD: dlopen only finds a library the process has loaded already.
const rtldNoLoad = 0x4

// loadedAlready says whether the process has loaded one of the libraries names (found by the
// dynamic loader without loading anything).
func loadedAlready(names ...string) bool {
	for _, n := range names {
		if h, err := purego.Dlopen(n, purego.RTLD_LAZY|rtldNoLoad); err == nil && h != 0 {
			_ = purego.Dlclose(h) // drops the reference this lookup took
			return true
		}
	}
	return false
}

// symbol binds the C function name in library h to fptr, a pointer to a Go func variable.
// Unlike purego.RegisterLibFunc it returns an error, not a panic, when the symbol is missing.
type symbol struct {
	name string
	fptr any
}

func bindAll(what string, h uintptr, syms []symbol) (err error) {
	for _, s := range syms {
		addr, derr := purego.Dlsym(h, s.name)
		if derr != nil || addr == 0 {
			return fmt.Errorf("%s: %w: symbol %s missing: %v", what, status.ErrUnsupported, s.name, derr)
		}
		purego.RegisterFunc(s.fptr, addr)
	}
	return nil
}

// bindOptional binds each symbol of syms that h has and leaves the others' func variables nil.
func bindOptional(h uintptr, syms []symbol) {
	for _, s := range syms {
		if addr, err := purego.Dlsym(h, s.name); err == nil && addr != 0 {
			purego.RegisterFunc(s.fptr, addr)
		}
	}
}

// goString copies a NUL-terminated C string (at most 1 KiB of it).
func goString(p uintptr) string {
	if p == 0 {
		return ""
	}
	b := HostSlice(Ptr(p), 1024)
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// hostPtr returns the address of a host slice for passing to a C copy function.
func hostPtr(b []byte) unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(b)) }

var errNoDevice = errors.New("no device")
