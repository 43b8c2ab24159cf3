package status

import (
	"context"
	"errors"
	"fmt"
)

// Code is an HMC status code. The values equal upstream HMC's status_t, so they cross the C and
// Python edges unchanged.
type Code int

// The status codes, with upstream's integer values.
const (
	Success       Code = 0 // SUCCESS
	Error         Code = 1 // ERROR: a general failure (peer closed, protocol violation, I/O)
	Unsupported   Code = 2 // UNSUPPORT: the operation, memory type or transport is not available
	InvalidConfig Code = 3 // INVALID_CONFIG: a bad argument (range, size, address, option)
	Timeout       Code = 4 // TIMEOUT: a deadline expired
	NotFound      Code = 5 // NOT_FOUND: unknown peer, endpoint or operation id
)

var codeNames = [...]string{
	Success:       "SUCCESS",
	Error:         "ERROR",
	Unsupported:   "UNSUPPORT",
	InvalidConfig: "INVALID_CONFIG",
	Timeout:       "TIMEOUT",
	NotFound:      "NOT_FOUND",
}

// String returns upstream's enum name (SUCCESS, ERROR, ...).
func (c Code) String() string {
	if c >= 0 && int(c) < len(codeNames) {
		return codeNames[c]
	}
	return fmt.Sprintf("Code(%d)", int(c))
}

// Err returns the base sentinel of c, or nil for Success. An unknown code maps to ErrFailed.
func (c Code) Err() error {
	switch c {
	case Success:
		return nil
	case Unsupported:
		return ErrUnsupported
	case InvalidConfig:
		return ErrInvalidConfig
	case Timeout:
		return ErrTimeout
	case NotFound:
		return ErrNotFound
	default:
		return ErrFailed
	}
}

// statusError is the type of every sentinel. A base sentinel stands for its whole code; a finer
// one is itself and also matches its code's base sentinel under errors.Is.
type statusError struct {
	code Code
	msg  string
	base bool
}

// Error returns the sentinel's message.
func (e *statusError) Error() string { return e.msg }

// Is reports whether target is the base sentinel of e's code.
func (e *statusError) Is(target error) bool {
	t, ok := target.(*statusError)
	return ok && t.base && t.code == e.code
}

// Timeout reports whether the error is a deadline (as net.Error does).
func (e *statusError) Timeout() bool { return e.code == Timeout }

func base(c Code, msg string) error  { return &statusError{code: c, msg: msg, base: true} }
func finer(c Code, msg string) error { return &statusError{code: c, msg: msg} }

// Base sentinels, one per non-success code.
var (
	// ErrFailed is the ERROR code: returned when a peer closes, a connection breaks, a peer
	// violates a protocol, or the OS refuses an operation for a reason not covered below.
	ErrFailed = base(Error, "hmc: operation failed")
	// ErrUnsupported is the UNSUPPORT code: returned by memory.New, transports and the
	// Communicator when a memory type, device library or transport is not available here; the
	// wrapping error says what was looked for.
	ErrUnsupported = base(Unsupported, "hmc: unsupported")
	// ErrInvalidConfig is the INVALID_CONFIG code: returned for bad arguments, such as an
	// offset+size beyond a buffer, a zero size where one is needed, a bad address or option.
	ErrInvalidConfig = base(InvalidConfig, "hmc: invalid config")
	// ErrTimeout is the TIMEOUT code: returned when a context deadline or a configured timeout
	// expires. Errors from an expired context wrap both ErrTimeout and context.DeadlineExceeded.
	ErrTimeout = base(Timeout, "hmc: timeout")
	// ErrNotFound is the NOT_FOUND code: returned for an unknown peer, endpoint or operation id.
	ErrNotFound = base(NotFound, "hmc: not found")
)

// Finer sentinels. Each matches its code's base sentinel under errors.Is.
var (
	// ErrOutOfRange (INVALID_CONFIG): an offset/size pair outside a buffer or a peer's region.
	ErrOutOfRange = finer(InvalidConfig, "hmc: range out of bounds")
	// ErrClosed (ERROR): the object, connection or server was closed.
	ErrClosed = finer(Error, "hmc: closed")
	// ErrPeerClosed (ERROR): the peer closed the connection or died.
	ErrPeerClosed = finer(Error, "hmc: peer closed")
	// ErrProtocol (ERROR): a peer sent a malformed, oversized or unexpected frame.
	ErrProtocol = finer(Error, "hmc: protocol error")
	// ErrPermission (ERROR): a peer was refused: its credentials (the user of a local process)
	// are not admitted by the listener's or dialer's policy.
	ErrPermission = finer(Error, "hmc: permission denied")
	// ErrCanceled (ERROR): the caller's context was cancelled. Errors from a cancelled context
	// wrap both ErrCanceled and context.Canceled.
	ErrCanceled = finer(Error, "hmc: canceled")
)

// FromContext turns a context's error into a status error that wraps both the sentinel
// (ErrTimeout for a deadline, ErrCanceled otherwise) and the context's own error. It returns nil
// when the context is not done.
func FromContext(ctx context.Context) error {
	err := ctx.Err()
	if err == nil {
		return nil
	}
	return ContextError(err)
}

// ContextError wraps a context error (context.DeadlineExceeded or context.Canceled) with the
// matching sentinel. Any other error is returned unchanged.
func ContextError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.DeadlineExceeded):
		if errors.Is(err, ErrTimeout) {
			return err
		}
		return fmt.Errorf("%w: %w", ErrTimeout, err)
	case errors.Is(err, context.Canceled):
		if errors.Is(err, ErrCanceled) {
			return err
		}
		return fmt.Errorf("%w: %w", ErrCanceled, err)
	}
	return err
}

// CodeOf returns the status code of err: Success for nil, the code of the first status sentinel
// in err's chain, Timeout for a bare context.DeadlineExceeded or an error whose Timeout method
// reports true, and Error for anything else.
func CodeOf(err error) Code {
	if err == nil {
		return Success
	}
	var se *statusError
	if errors.As(err, &se) {
		return se.code
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return Timeout
	}
	var te interface{ Timeout() bool }
	if errors.As(err, &te) && te.Timeout() {
		return Timeout
	}
	return Error
}
