package acceptor

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
)

// Conn is what a Server tracks: a connection that can be closed and used as a map key.
type Conn interface {
	comparable
	io.Closer
}

// Server accepts connections of type C and serves each on its own goroutine.
type Server[C Conn] struct {
	l     io.Closer
	serve func(C)
	log   *slog.Logger
	name  string
	wg    sync.WaitGroup

	mu     sync.Mutex
	conns  map[C]struct{} // live connections; guarded by mu
	closed bool           // guarded by mu
}

// Start runs accept in a loop until it fails (net.ErrClosed after Close is silent; anything
// else is logged as name's accept stopping). Each connection is served by serve on a goroutine
// owned by the Server; when serve returns the connection is closed. l is what Close closes to
// stop the loop.
func Start[C Conn](l io.Closer, accept func() (C, error), serve func(C), log *slog.Logger, name string) *Server[C] {
	s := &Server[C]{l: l, serve: serve, log: log, name: name, conns: make(map[C]struct{})}
	s.wg.Add(1)
	go s.loop(accept) // owned by s: Close closes l and waits
	return s
}

func (s *Server[C]) loop(accept func() (C, error)) {
	defer s.wg.Done()
	for {
		c, err := accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.log.Warn(s.name+": accept stopped", "err", err)
			}
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			_ = c.Close() // raced with Close
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.run(c) // owned by s: Close closes c and waits
	}
}

func (s *Server[C]) run(c C) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		_ = c.Close() // served: the connection is over, whatever ended it
	}()
	s.serve(c)
}

// Close stops accepting, closes every live connection (their serve calls see the error and
// return) and waits for every goroutine. It is idempotent and returns the listener's close
// error, if any, other than net.ErrClosed.
func (s *Server[C]) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.wg.Wait()
		return nil
	}
	s.closed = true
	err := s.l.Close()
	for c := range s.conns {
		_ = c.Close() // stopping; serve sees the error and returns
	}
	s.mu.Unlock()
	s.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
