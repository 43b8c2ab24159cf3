package tcp

import (
	"bufio"
	"io"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// bulkReader reads large payloads (a PUT's at the target, a GET's reply at the initiator)
// straight from a plain TCP socket with SO_RCVLOWAT raised to what is still to come, at most
// bulkLowat. Go reads sockets non-blocking and parks on the network poller; with the default
// low-water mark of one byte the kernel wakes the reader for every burst of segments, and a
// 2 MiB payload costs dozens of wake-ups, reads and parkings. With the mark raised it costs two
// or three, and a lane streams 20-25 % more (measured in the commit that raised it). The mark never exceeds the
// bytes still owed, so a read never waits for data that is not coming; the kernel caps it at
// half the receive buffer, so a small buffer cannot deadlock it either. Busy-polling lanes and
// lanes inside TLS read as before.
type bulkReader struct {
	rc   syscall.RawConn
	c    net.Conn
	mark int              // the SO_RCVLOWAT set now; 1 is the kernel's default
	ctl  func(fd uintptr) // rc.Control's callback, setting mark (made once: a closure per call would allocate)
}

const (
	// bulkMin is the smallest payload read this way: below it the two setsockopt calls cost
	// more than the wake-ups they save.
	bulkMin = 256 << 10
	// bulkLowat is the highest mark: the reader wakes about once per this many bytes.
	bulkLowat = 1 << 20
)

// newBulkReader returns a bulkReader for c, or nil when c is not a plain TCP socket read
// without busy polling (where the mark would not help).
func newBulkReader(c net.Conn, cfg Config) *bulkReader {
	tc, ok := c.(*net.TCPConn)
	if !ok || cfg.BusyPoll > 0 {
		return nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	b := &bulkReader{rc: rc, c: tc, mark: 1}
	b.ctl = b.setMark
	return b
}

// readFull fills dst from br (whose buffered bytes come first) and the socket under it. A nil
// bulkReader, or a short dst, reads through br as io.ReadFull does.
func (b *bulkReader) readFull(br *bufio.Reader, dst []byte) error {
	if b == nil || len(dst) < bulkMin {
		_, err := io.ReadFull(br, dst)
		return err
	}
	n := 0
	if k := br.Buffered(); k > 0 {
		n, _ = br.Read(dst[:min(k, len(dst))]) // only buffered bytes: no read from the socket
	}
	return b.fill(dst, n)
}

// chunks returns a reader whose every Read fills its whole buffer through b (one wake-up for a
// chunk, not one per segment that arrives), reading through br: the staging rings read a
// chunk at a time.
func (b *bulkReader) chunks(br *bufio.Reader) io.Reader { return chunkReader{b, br, nil} }

// connChunks is chunks for reads from the socket alone (r: the socket or a busy-polling
// reader over it; nothing is buffered above it).
func (b *bulkReader) connChunks(r io.Reader) io.Reader { return chunkReader{b, nil, r} }

type chunkReader struct {
	b  *bulkReader
	br *bufio.Reader // reads through it, or else through r with readConn
	r  io.Reader
}

func (c chunkReader) Read(p []byte) (int, error) {
	var err error
	if c.br != nil {
		err = c.b.readFull(c.br, p)
	} else {
		err = c.b.readConn(c.r, p)
	}
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

// readConn fills dst from the socket alone (nothing of it is buffered above).
func (b *bulkReader) readConn(r io.Reader, dst []byte) error {
	if b == nil || len(dst) < bulkMin {
		_, err := io.ReadFull(r, dst)
		return err
	}
	return b.fill(dst, 0)
}

// fill reads dst[n:] from the socket, the mark at what is still owed (at most bulkLowat), and
// puts the mark back to one byte before it returns.
func (b *bulkReader) fill(dst []byte, n int) error {
	defer b.set(1)
	for n < len(dst) {
		b.set(min(len(dst)-n, bulkLowat))
		k, err := b.c.Read(dst[n:])
		n += k
		if err != nil {
			if err == io.EOF && n < len(dst) {
				return io.ErrUnexpectedEOF
			}
			if n == len(dst) {
				return nil
			}
			return err
		}
	}
	return nil
}

// readv fills every slice of dsts in order: first from br's buffered bytes (br may be nil), then
// straight from the socket with readv(2), many slices to a call and the low-water mark at what
// is still owed, as fill does for one slice. A vector request's scattered pieces then cost a
// few system calls and no copy through a buffer. A nil bulkReader reads each slice from r (br
// when set) as io.ReadFull does.
func (b *bulkReader) readv(r io.Reader, br *bufio.Reader, dsts [][]byte) error {
	i, off := 0, 0 // the next byte to fill: dsts[i][off]
	advance := func(n int) {
		for n > 0 && i < len(dsts) {
			k := min(n, len(dsts[i])-off)
			n -= k
			if off += k; off == len(dsts[i]) {
				i, off = i+1, 0
			}
		}
		for i < len(dsts) && len(dsts[i]) == 0 {
			i++
		}
	}
	advance(0)
	if br != nil {
		for i < len(dsts) && br.Buffered() > 0 {
			k, _ := br.Read(dsts[i][off:min(len(dsts[i]), off+br.Buffered())]) // buffered bytes only
			advance(k)
		}
		r = br
	}
	if b == nil {
		for ; i < len(dsts); i, off = i+1, 0 {
			if _, err := io.ReadFull(r, dsts[i][off:]); err != nil {
				return err
			}
		}
		return nil
	}
	owed := -off
	for _, d := range dsts[i:] {
		owed += len(d)
	}
	if owed == 0 {
		return nil
	}
	defer b.set(1)
	var (
		iov  [][]byte
		n    int
		rerr error
	)
	read := func(fd uintptr) bool {
		n, rerr = unix.Readv(int(fd), iov)
		return rerr != unix.EAGAIN
	}
	for owed > 0 {
		b.set(min(owed, bulkLowat))
		iov = iov[:0]
		iov = append(iov, dsts[i][off:])
		for _, d := range dsts[i+1:] {
			if len(iov) == maxIOV {
				break
			}
			if len(d) > 0 {
				iov = append(iov, d)
			}
		}
		if err := b.rc.Read(read); err != nil {
			return err
		}
		if rerr != nil {
			return rerr
		}
		if n == 0 {
			return io.ErrUnexpectedEOF
		}
		owed -= n
		advance(n)
	}
	return nil
}

// maxIOV bounds the slices of one readv (the kernel's UIO_MAXIOV is 1024).
const maxIOV = 1024

// set makes the socket's low-water mark v (best effort: a refusal leaves reads as they were).
func (b *bulkReader) set(v int) {
	if v == b.mark {
		return
	}
	b.mark = v
	_ = b.rc.Control(b.ctl)
}

// setMark is set's callback: the socket's SO_RCVLOWAT becomes mark.
func (b *bulkReader) setMark(fd uintptr) {
	_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVLOWAT, b.mark)
}

// writeSlice is about what one write system call carries. A single writev of a multi-MiB
// payload holds the socket lock while the kernel copies until the send buffer is full, and
// the acknowledgements that free it wait in the backlog meanwhile; slices of 1 MiB stream
// 10-15 % faster on loopback (measured in the commit that chose them).
const writeSlice = 1 << 20

// writeSliced writes bufs to w in slices (eachSlice), one write call each. bufs is consumed.
func writeSliced(w io.Writer, bufs net.Buffers) error {
	var nb net.Buffers // one for every slice: WriteTo's receiver escapes
	return eachSlice(bufs, func(b net.Buffers) error {
		nb = b
		_, err := nb.WriteTo(w)
		return err
	})
}

// eachSlice calls write with bufs cut into equal slices of writeSlice to twice that (no small
// tail: a header and 1 MiB is one slice), or once with all of bufs when shorter. bufs is
// consumed; write must consume what it is given.
func eachSlice(bufs net.Buffers, write func(net.Buffers) error) error {
	total := 0
	for _, b := range bufs {
		total += len(b)
	}
	slices := total / writeSlice
	if slices <= 1 {
		return write(bufs)
	}
	slice := (total + slices - 1) / slices
	batch := make(net.Buffers, 0, len(bufs))
	for len(bufs) > 0 {
		batch = batch[:0]
		n := 0
		for len(bufs) > 0 && n < slice {
			b := bufs[0]
			if k := slice - n; len(b) > k {
				batch = append(batch, b[:k])
				bufs[0] = b[k:]
				n += k
				break
			}
			batch = append(batch, b)
			n += len(b)
			bufs = bufs[1:]
		}
		if err := write(batch); err != nil {
			return err
		}
	}
	return nil
}
