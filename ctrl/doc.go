// Package ctrl carries rank-addressed control messages over TCP and Unix sockets: HMC's
// CtrlSocketManager, without the process-wide singleton.
//
// A Manager listens on a TCP port and/or a Unix socket path and dials peers by TCP or UDS.
// Every connection starts with a HELLO frame carrying the dialer's rank, which binds it to that
// rank on the accepting side; afterwards either side sends framed messages to the other by
// rank. The frame is wire-compatible with upstream HMC's CtrlMsgHeader (docs/wire/ctrl.md):
// 8 bytes, little-endian type u16, flags u16, length u32, then the payload.
//
// Unlike upstream: each frame leaves in one write (TCP_NODELAY is on, so a round trip costs tens
// of microseconds, not a delayed ACK); concurrent senders never interleave frames; lengths are
// capped before anything is allocated; every blocking call takes a context; Recv waits for a peer
// that has not connected yet; a live Unix socket is never unlinked by a second server; and two
// Managers in one process share nothing.
package ctrl
