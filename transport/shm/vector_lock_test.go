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
