// Package status defines HMC's status codes and the sentinel errors that map one-to-one onto
// them.
//
// Every error returned by HMC-Go wraps one of the base sentinels (ErrFailed, ErrUnsupported,
// ErrInvalidConfig, ErrTimeout, ErrNotFound), so errors.Is works through any amount of wrapping,
// and CodeOf recovers the Code that the C and Python edges return. Finer sentinels (ErrOutOfRange,
// ErrClosed, ErrProtocol, ...) match their code's base sentinel too: errors.Is(ErrOutOfRange,
// ErrInvalidConfig) is true.
//
// This is the bottom layer: every other package may import it, it imports only the standard
// library.
package status
