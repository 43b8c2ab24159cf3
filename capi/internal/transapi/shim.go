//go:build cgo

package transapi

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

func deadline(ms C.int) (context.Context, context.CancelFunc) { return cabi.Deadline(int(ms)) }

func goString(s *C.char) string { return cabi.GoString(unsafe.Pointer(s)) }
