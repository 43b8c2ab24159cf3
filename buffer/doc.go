// Package buffer provides ConnBuffer, a registered region of memory addressed by offset: the
// staging area every HMC transfer reads from and writes to.
//
// A ConnBuffer owns one allocation of a memory.Memory (host or device). Every method takes
// byte offsets and checks offset+size against the buffer without overflow: a range that does
// not fit returns an error wrapping status.ErrOutOfRange (an INVALID_CONFIG) and touches
// nothing.
package buffer
