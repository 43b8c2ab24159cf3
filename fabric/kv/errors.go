package kv

import (
	"errors"
	"fmt"

	"github.com/hmc-go/hmc/status"
)

// Code is a Mooncake Store error code (mooncake-store/include/types.h, ErrorCode): the value
// the Python face returns where Mooncake's does.
type Code int32

// The codes this pool returns.
const (
	OK                  Code = 0
	InternalError       Code = -1
	BufferOverflow      Code = -10
	SegmentNotFound     Code = -101
	SegmentExists       Code = -102
	ClientNotFound      Code = -103
	NoAvailableHandle   Code = -200 // no space for the object, even after eviction
	InvalidKey          Code = -400
	InvalidParams       Code = -600
	IllegalClient       Code = -601
	InvalidWrite        Code = -700
	InvalidRead         Code = -701
	ReplicaIsNotReady   Code = -703
	ObjectNotFound      Code = -704
	ObjectAlreadyExists Code = -705
	ObjectHasLease      Code = -706
	LeaseExpired        Code = -707
	ObjectReplicaBusy   Code = -714 // an upsert of an object readers hold
	TransferFail        Code = -800
	RPCFail             Code = -900
)

var codeNames = map[Code]string{
	OK: "OK", InternalError: "INTERNAL_ERROR", BufferOverflow: "BUFFER_OVERFLOW", SegmentNotFound: "SEGMENT_NOT_FOUND",
	SegmentExists: "SEGMENT_ALREADY_EXISTS", ClientNotFound: "CLIENT_NOT_FOUND", NoAvailableHandle: "NO_AVAILABLE_HANDLE",
	InvalidKey: "INVALID_KEY", InvalidParams: "INVALID_PARAMS", IllegalClient: "ILLEGAL_CLIENT", InvalidWrite: "INVALID_WRITE",
	InvalidRead: "INVALID_READ", ReplicaIsNotReady: "REPLICA_IS_NOT_READY", ObjectNotFound: "OBJECT_NOT_FOUND",
	ObjectAlreadyExists: "OBJECT_ALREADY_EXISTS", ObjectHasLease: "OBJECT_HAS_LEASE", LeaseExpired: "LEASE_EXPIRED",
	ObjectReplicaBusy: "OBJECT_REPLICA_BUSY",
	TransferFail:      "TRANSFER_FAIL", RPCFail: "RPC_FAIL",
}

// String is Mooncake's name of the code.
func (c Code) String() string {
	if n, ok := codeNames[c]; ok {
		return n
	}
	return fmt.Sprintf("Code(%d)", int32(c))
}

// statusOf is the status error a code wraps, so that callers match with errors.Is as for every
// other HMC-Go error.
func (c Code) statusOf() error {
	switch c {
	case ObjectNotFound, SegmentNotFound, ClientNotFound:
		return status.ErrNotFound
	case NoAvailableHandle, BufferOverflow:
		return status.ErrOutOfRange
	case InvalidKey, InvalidParams, InvalidWrite, InvalidRead, ObjectAlreadyExists, SegmentExists, IllegalClient:
		return status.ErrInvalidConfig
	case LeaseExpired:
		return status.ErrTimeout
	}
	return status.ErrFailed
}

// Error is a pool operation's failure: Mooncake's code and what was wrong.
type Error struct {
	Code Code
	Msg  string
}

func (e *Error) Error() string { return fmt.Sprintf("kv: %s (%v)", e.Msg, e.Code) }

// Unwrap gives the status error the code stands for.
func (e *Error) Unwrap() error { return e.Code.statusOf() }

func fail(c Code, format string, args ...any) error {
	return &Error{Code: c, Msg: fmt.Sprintf(format, args...)}
}

// CodeOf is err's Mooncake code: OK for nil, the Error's code, InternalError otherwise.
func CodeOf(err error) Code {
	if err == nil {
		return OK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return InternalError
}
