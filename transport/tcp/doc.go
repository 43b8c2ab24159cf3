// Package tcp is HMC-Go's pure-Go TCP transport: one-sided put and get between registered
// regions over several TCP connections ("lanes") per peer.
//
// The target runs one goroutine per lane that reads a PUT's payload straight from the socket
// into the registered region and writes a GET's reply straight from it (header and region slice
// in one writev): no intermediate copy, and no application involvement. Every request is
// bounds-checked on the target before a byte moves. A PUT is acknowledged only after its bytes
// are in the target's region, so a completed Put is visible there.
//
// The initiator cuts transfers of 2 MiB or more into equal parts, one per lane (at least
// 512 KiB, at most the chunk size each), so that all lanes copy at once; each lane has one
// writer goroutine (callers queue on a bounded channel, so posting is non-blocking) and one
// reader goroutine that matches replies to requests by id.
//
// Wire version 2 (negotiated per lane) addresses any region of the target's table by key or by
// address, and carries remote atomics, which the target runs with sync/atomic. The wire format
// is in docs/wire/tcp.md.
package tcp
