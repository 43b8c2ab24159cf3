// Package acceptor runs a listener's accept loop and owns the goroutines that serve its
// connections: Close stops accepting, closes every live connection and waits for all of them.
// The TCP and shared-memory data servers share it.
package acceptor
