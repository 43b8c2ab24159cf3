package hmc

import (
	"github.com/hmc-go/hmc/comm"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// Status is an HMC status code (upstream status_t).
type Status = status.Code

// Status codes.
const (
	Success       = status.Success
	Error         = status.Error
	Unsupported   = status.Unsupported
	InvalidConfig = status.InvalidConfig
	Timeout       = status.Timeout
	NotFound      = status.NotFound
)

// Sentinel errors; see package status.
var (
	ErrFailed        = status.ErrFailed
	ErrUnsupported   = status.ErrUnsupported
	ErrInvalidConfig = status.ErrInvalidConfig
	ErrTimeout       = status.ErrTimeout
	ErrNotFound      = status.ErrNotFound
	ErrOutOfRange    = status.ErrOutOfRange
	ErrClosed        = status.ErrClosed
	ErrPeerClosed    = status.ErrPeerClosed
	ErrProtocol      = status.ErrProtocol
	ErrCanceled      = status.ErrCanceled
	ErrPermission    = status.ErrPermission
)

// CodeOf returns the Status of an error (Success for nil).
func CodeOf(err error) Status { return status.CodeOf(err) }

// MemoryType is a kind of memory (upstream MemoryType).
type MemoryType = memory.Type

// Memory types.
const (
	Default         = memory.Default
	CPU             = memory.CPU
	NvidiaGPU       = memory.NvidiaGPU
	AMDGPU          = memory.AMDGPU
	CambriconMLU    = memory.CambriconMLU
	MooreGPU        = memory.MooreGPU
	HuaweiAscendNPU = memory.HuaweiAscendNPU
)

// Peer is a connected process's handle: the operations on its buffer and the control messages
// to it (Session.Connect hands it out).
type Peer = comm.Peer

// ConnType names a transport (upstream ConnType plus TCP, SHM and AUTO).
type ConnType = transport.ConnType

// Connection types.
const (
	RDMA = transport.RDMA
	UCX  = transport.UCX
	TCP  = transport.TCP
	SHM  = transport.SHM
	AUTO = transport.AUTO
)
