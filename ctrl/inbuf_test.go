package ctrl

import (
	"bytes"
	"errors"
	"io"
	"os"
	"testing"
)

// trickle returns one byte per Read, and a deadline error every other Read.
type trickle struct {
	data []byte
	n    int
}

func (t *trickle) Read(p []byte) (int, error) {
	t.n++
	if t.n%2 == 0 {
		return 0, os.ErrDeadlineExceeded
	}
	if len(t.data) == 0 {
		return 0, io.EOF
	}
	p[0] = t.data[0]
	t.data = t.data[1:]
	return 1, nil
}

type nothing struct{}

func (nothing) Read([]byte) (int, error) { return 0, nil }

// TestInbuf: a peek interrupted by errors keeps every byte read and completes on later calls;
// reads past the buffer's size go straight into the caller's slice after the buffered bytes;
// a reader that returns nothing is io.ErrNoProgress; the end of the stream is io.EOF.
func TestInbuf(t *testing.T) {
	data := make([]byte, 100)
	for i := range data {
		data[i] = byte(i)
	}
	b := newInbuf(&trickle{data: bytes.Clone(data)}, 16)
	var got []byte
	for {
		p, err := b.peek(5)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, p...)
		b.discard(5)
		if len(got) == 10 {
			break
		}
	}
	big := make([]byte, 32) // larger than the buffer
	for len(got) < len(data) {
		k, err := b.read(big[:min(len(big), len(data)-len(got))])
		if errors.Is(err, os.ErrDeadlineExceeded) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, big[:k]...)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("read %v, want %v", got, data)
	}
	for {
		if _, err := b.peek(1); !errors.Is(err, os.ErrDeadlineExceeded) {
			if err != io.EOF {
				t.Fatalf("peek at the end: %v, want io.EOF", err)
			}
			break
		}
	}
	e := newInbuf(nothing{}, 16)
	if _, err := e.peek(1); err != io.ErrNoProgress {
		t.Fatalf("peek from a reader of nothing: %v", err)
	}
}
