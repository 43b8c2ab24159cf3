package store

import (
	"errors"
	"fmt"

	"github.com/hmc-go/hmc/status"
)

// Code is a config-store status code, with memfabric's values (they travel in frame headers).
type Code int16

// The store status codes.
const (
	CodeSuccess        Code = 0
	CodeError          Code = -1
	CodeInvalidMessage Code = -400
	CodeInvalidKey     Code = -401
	CodeNotExist       Code = -404
	CodeRestore        Code = -405
	CodeTimeout        Code = -601
	CodeIOError        Code = -602
)

func (c Code) String() string {
	switch c {
	case CodeSuccess:
		return "SUCCESS"
	case CodeError:
		return "ERROR"
	case CodeInvalidMessage:
		return "INVALID_MESSAGE"
	case CodeInvalidKey:
		return "INVALID_KEY"
	case CodeNotExist:
		return "NOT_EXIST"
	case CodeRestore:
		return "RESTORE"
	case CodeTimeout:
		return "TIMEOUT"
	case CodeIOError:
		return "IO_ERROR"
	}
	return fmt.Sprintf("Code(%d)", int(c))
}

// codeError is a sentinel of this package: it matches by store code (errors.Is) and unwraps to
// the HMC status sentinel of the same meaning, so status.CodeOf and errors.Is(err,
// status.ErrNotFound) work on store errors.
type codeError struct {
	code Code
	msg  string
	hmc  error
}

func (e *codeError) Error() string { return e.msg }
func (e *codeError) Unwrap() error { return e.hmc }
func (e *codeError) Is(target error) bool {
	t, ok := target.(*codeError)
	return ok && t.code == e.code
}

// The store's errors. Every error a Client returns wraps one of them (or a context error turned
// into status.ErrTimeout / status.ErrCanceled).
var (
	// ErrFailed (ERROR): the operation could not be done: a non-integer value under Add, a world
	// that is full, a rank that is taken, an authentication failure.
	ErrFailed = &codeError{CodeError, "store: failed", status.ErrFailed}
	// ErrInvalidMessage (INVALID_MESSAGE): a malformed, truncated or oversized frame or body.
	ErrInvalidMessage = &codeError{CodeInvalidMessage, "store: invalid message", status.ErrProtocol}
	// ErrInvalidKey (INVALID_KEY): an empty key or one longer than MaxKeyLen, or a bad argument.
	ErrInvalidKey = &codeError{CodeInvalidKey, "store: invalid key", status.ErrInvalidConfig}
	// ErrNotExist (NOT_EXIST): Get without waiting, or Remove, of an absent key.
	ErrNotExist = &codeError{CodeNotExist, "store: key does not exist", status.ErrNotFound}
	// ErrRestore (RESTORE): a recycled slot is offered (memfabric's transfer-engine restore path).
	ErrRestore = &codeError{CodeRestore, "store: restore", status.ErrFailed}
	// ErrTimeout (TIMEOUT): a Get's wait, or the caller's deadline, expired.
	ErrTimeout = &codeError{CodeTimeout, "store: timeout", status.ErrTimeout}
	// ErrIO (IO_ERROR): the link to the store is lost or closed; pending calls fail with it.
	ErrIO = &codeError{CodeIOError, "store: link lost", status.ErrPeerClosed}
)

// ErrRankHeld is a refusal of a rank that a live client holds (an ErrFailed): the holder may be
// closing (its departure not yet seen by the store), so a client taking back its own slot tries
// again for a while.
var ErrRankHeld = fmt.Errorf("%w: rank taken", ErrFailed)

// rankHeldReason is the refusal's reason text that the server sends (and clients recognise).
const rankHeldReason = "is held by a live client"

// ErrAuth is returned when the shared secret or the TLS handshake does not check out (it is an
// ErrFailed).
var ErrAuth = fmt.Errorf("%w: authentication failed", ErrFailed)

// errFor returns the sentinel for a store code (nil for success).
func errFor(c Code) error {
	switch c {
	case CodeSuccess:
		return nil
	case CodeInvalidMessage:
		return ErrInvalidMessage
	case CodeInvalidKey:
		return ErrInvalidKey
	case CodeNotExist:
		return ErrNotExist
	case CodeRestore:
		return ErrRestore
	case CodeTimeout:
		return ErrTimeout
	case CodeIOError:
		return ErrIO
	}
	return ErrFailed
}

// CodeOf returns the store code an error carries: the sentinel's code, CodeTimeout for
// deadlines, CodeSuccess for nil, else CodeError.
func CodeOf(err error) Code {
	if err == nil {
		return CodeSuccess
	}
	var ce *codeError
	if errors.As(err, &ce) {
		return ce.code
	}
	if status.CodeOf(err) == status.Timeout {
		return CodeTimeout
	}
	return CodeError
}

// ctxErr turns a context's end into an error that is both a store and an HMC error.
func ctxErr(err error) error {
	err = status.ContextError(err)
	if errors.Is(err, status.ErrTimeout) {
		return fmt.Errorf("%w: %w", ErrTimeout, err)
	}
	return err
}
