// Package sockpair connects two sockets of this process over loopback TCP or a Unix socket,
// for tests of code that reads and writes real sockets (the authentication handshake, the
// polling and blocking readers).
package sockpair
