package ctrl

import (
	"io"

	"github.com/hmc-go/hmc/internal/fdconn"
)

// inbuf is a connection's read buffer: the part of bufio.Reader the frame reader uses (peek,
// discard, read), calling the socket's Read without an interface when it is an fdconn.Conn.
// It runs once per message on the round trip's path, where every function and cache line
// touched counts once the caches went cold between messages (docs/performance.md, "Control
// plane"). Guarded by the connection's read token.
type inbuf struct {
	r      io.Reader
	fc     *fdconn.Conn // r, when it is one
	buf    []byte
	lo, hi int // buf[lo:hi] was read and is not consumed yet
}

func newInbuf(r io.Reader, size int) inbuf {
	b := inbuf{r: r, buf: make([]byte, size)}
	b.fc, _ = r.(*fdconn.Conn)
	return b
}

// peek returns the next n bytes (n <= len(buf)) without consuming them, reading until they
// are there. A read's error (a deadline) leaves what was read in the buffer.
func (b *inbuf) peek(n int) ([]byte, error) {
	for b.hi-b.lo < n {
		if err := b.fill(); err != nil {
			return nil, err
		}
	}
	return b.buf[b.lo : b.lo+n], nil
}

// discard consumes n bytes that peek returned.
func (b *inbuf) discard(n int) { b.lo += n }

// read consumes up to len(p) bytes into p: those buffered, or, with none buffered, one read
// from the socket (straight into p when p is at least as large as the buffer).
func (b *inbuf) read(p []byte) (int, error) {
	if b.lo == b.hi {
		if len(p) >= len(b.buf) {
			return b.readSome(p)
		}
		if err := b.fill(); err != nil {
			return 0, err
		}
	}
	k := copy(p, b.buf[b.lo:b.hi])
	b.lo += k
	return k, nil
}

// fill reads once into the free end of buf, first moving what is unread to its start.
func (b *inbuf) fill() error {
	if b.lo > 0 {
		b.hi = copy(b.buf, b.buf[b.lo:b.hi])
		b.lo = 0
	}
	k, err := b.readSome(b.buf[b.hi:])
	b.hi += k
	return err
}

// maxEmptyReads is how many reads that return nothing and no error readSome makes before it
// gives up with io.ErrNoProgress (bufio's bound).
const maxEmptyReads = 100

// readSome reads at least one byte into p, or fails. Bytes read with an error are returned
// without it: a socket's error repeats on the next read.
func (b *inbuf) readSome(p []byte) (int, error) {
	for range maxEmptyReads {
		var k int
		var err error
		if b.fc != nil {
			k, err = b.fc.Read(p)
		} else {
			k, err = b.r.Read(p)
		}
		if k > 0 {
			return k, nil
		}
		if err != nil {
			return 0, err
		}
	}
	return 0, io.ErrNoProgress
}
