//go:build cgo

package hmcapi

import (
	"fmt"
	"sync"

	"github.com/hmc-go/hmc/ctrl"
	"github.com/hmc-go/hmc/status"
)

// allocs maps device addresses handed to C back to their buffers, for hmc_memory_free.
var allocs sync.Map

// ctrlType maps a C message type to a control-plane type: 0 means CTRL_STRUCT; HMC-Go's
// internal types (0x0100 and up) are not the caller's to send.
func ctrlType(t uint16) (ctrl.MsgType, error) {
	switch {
	case t == 0:
		return ctrl.TypeStruct, nil
	case ctrl.MsgType(t) >= ctrl.FirstInternalType:
		return 0, fmt.Errorf("hmc: message type %#x is reserved: %w", t, status.ErrInvalidConfig)
	}
	return ctrl.MsgType(t), nil
}
