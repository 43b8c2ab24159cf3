//go:build cgo

package hmcapi

/*
#include <stdint.h>
*/
import "C"

import (
	"context"
	"unsafe"

	"github.com/hmc-go/hmc/capi/internal/cabi"
)

// The C-typed forms of cabi's helpers, so that this package's exports read as plain calls.

func call(f func() error) C.int { return C.int(cabi.Call(f)) }

func setError(msg string) { cabi.SetError(msg) }

func deadline(ms C.int) (context.Context, context.CancelFunc) { return cabi.Deadline(int(ms)) }

func hostBytes(p unsafe.Pointer, n C.uint64_t) ([]byte, error) { return cabi.HostBytes(p, uint64(n)) }

func goString(s *C.char) string { return cabi.GoString(unsafe.Pointer(s)) }
