package shm

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/transporttest"
)

// TestVectorEntersARegionOnce: a vector whose pieces lie in a region moved piece by piece
// (plain memory, reached by cross-memory attach) never holds that region's lock twice. A
// writer (a deregistration's unmap) queued on the lock just after the first entry would
// otherwise wait for the vector's first read lock while its second waits behind the writer.
func TestVectorEntersARegionOnce(t *testing.T) {
	p := transporttest.Options{New: newSHM, Addr: abstractName}.NewRMAPair(t)
	v, ok := p.RMA.(transport.VectorRMA)
	if !ok {
		t.Fatal("shm endpoints implement VectorRMA")
	}
	mem := make([]byte, 1<<16) // plain memory: no memfd, reached by cross-memory attach
	reg, err := p.Table.Register(mem)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	writerDone := make(chan struct{})
	enteredHook = func(r *peerRegion) {
		once.Do(func() {
			go func() { // owned by the test: ends when it has had the lock
				r.local.Lock()
				close(writerDone) // the writer had the lock
				r.local.Unlock()
			}()
			time.Sleep(20 * time.Millisecond) // the writer is queued on r.local by now
		})
	}
	t.Cleanup(func() { enteredHook = nil })
	a, b := bytes.Repeat([]byte{1}, 4096), bytes.Repeat([]byte{2}, 4096)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { // owned by the test: the vector either completes or the test fails on the timeout
		op, err := v.WriteVAsync(ctx, [][]byte{a, b}, []transport.Remote{{Key: reg.Key()}, {Key: reg.Key(), Addr: 8192}})
		if err == nil {
			err = op.Wait(ctx)
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		// Not t.Fatal nor a panic: the cleanups run either way, and the endpoint's Close would
		// wait for the hung vector. The stacks show the two locks.
		buf := make([]byte, 1<<20)
		fmt.Fprintf(os.Stderr, "--- FAIL: %s: the vector hung: a region's lock read-locked twice with a writer queued between\n%s\n",
			t.Name(), buf[:runtime.Stack(buf, true)])
		os.Exit(1)
	}
	<-writerDone
	if !bytes.Equal(mem[:4096], a) || !bytes.Equal(mem[8192:8192+4096], b) {
		t.Fatal("the pieces did not land")
	}
}

// TestVectorMixesWays: one vector whose pieces go three ways, interleaved (the server's
// default region and a plain-memory region, each piece on its own; a memfd region, copied
// as one vector copy shared with the helpers), with empty pieces among them, lands byte for
// byte, and reads back into the right places: the vector copy skips the pieces moved alone.
func TestVectorMixesWays(t *testing.T) {
	p := transporttest.Options{New: newSHM, Addr: abstractName}.NewRMAPair(t)
	v := p.RMA.(transport.VectorRMA)
	const piece, n = 12 << 10, 300 // 3.5 MiB in all: a parallel copy's worth
	shared := transporttest.HostBuf(t, 2*n*piece)
	sreg, err := p.Table.RegisterBuffer(shared)
	if err != nil {
		t.Fatal(err)
	}
	plain := make([]byte, 2*n*piece)
	preg, err := p.Table.Register(plain)
	if err != nil {
		t.Fatal(err)
	}
	src := make([]byte, n*piece)
	transporttest.Fill(src, 7)
	srcs, rems := make([][]byte, 0, n), make([]transport.Remote, 0, n)
	for i := range n {
		b := src[i*piece : (i+1)*piece]
		at := uint64(2 * i * piece)
		rem := transport.Remote{Key: sreg.Key(), Addr: at}
		switch i % 10 {
		case 3:
			b = b[:0] // empty: nothing moves
		case 5:
			b = b[:1000]
			rem = transport.Remote{Key: transport.DefaultRegion, Addr: uint64(i) * 1000}
		case 7:
			rem = transport.Remote{Addr: preg.Addr() + at}
		}
		srcs, rems = append(srcs, b), append(rems, rem)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	op, err := v.WriteVAsync(ctx, srcs, rems)
	if err == nil {
		err = op.Wait(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	dsts := make([][]byte, len(srcs))
	for i, s := range srcs {
		var at []byte
		switch r := rems[i]; {
		case r.Key == transport.DefaultRegion:
			at = p.Default.Bytes()[r.Addr:]
		case r.Key == 0:
			at = plain[r.Addr-preg.Addr():]
		default:
			at = shared.Bytes()[r.Addr:]
		}
		if !bytes.Equal(at[:len(s)], s) {
			t.Fatalf("piece %d (%d bytes, %+v) did not land", i, len(s), rems[i])
		}
		dsts[i] = make([]byte, len(s))
	}
	op, err = v.ReadVAsync(ctx, dsts, rems)
	if err == nil {
		err = op.Wait(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range srcs {
		if !bytes.Equal(dsts[i], s) {
			t.Fatalf("piece %d (%d bytes, %+v) read back differs", i, len(s), rems[i])
		}
	}
}
