package tcp

import (
	"bytes"
	"context"
	"errors"
	"os"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/internal/netnstest"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// listenIn starts a server of tr on ns's address, its sockets made inside ns (by a thread that
// joins it and then ends with its goroutine).
func listenIn(t *testing.T, ns *netnstest.NS, tr transport.Transport, region *buffer.ConnBuffer) transport.Server {
	t.Helper()
	type res struct {
		srv transport.Server
		err error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread, now in ns, ends with this goroutine
		f, err := os.Open("/var/run/netns/" + ns.Name)
		if err == nil {
			err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
			f.Close()
		}
		if err != nil {
			ch <- res{err: err}
			return
		}
		srv, err := tr.Listen(transport.ServerConfig{BindAddr: ns.NSIP + ":0", Region: region})
		ch <- res{srv, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Skipf("a server inside the namespace: %v", r.err)
	}
	t.Cleanup(func() { _ = r.srv.Close() })
	return r.srv
}

// A put that fails with its endpoint never lands later. Across a partition a put times out and
// its endpoint is closed while the bytes wait in the socket's send queue; after the heal a new
// endpoint writes other bytes to the same place. A graceful close would still send the old
// bytes once the link is back, over the old connection, after the new ones (fabric/bm's
// partition test once read them back); the lane resets instead.
func TestClosedEndpointsPutNeverLandsLater(t *testing.T) {
	ns := netnstest.New(t)
	tr, err := New(Config{Lanes: 1})
	if err != nil {
		t.Fatal(err)
	}
	region, err := buffer.New(0, 1<<20, memory.CPU)
	if err != nil {
		t.Fatal(err)
	}
	defer region.Close()
	srv := listenIn(t, ns, tr, region)
	local, err := buffer.New(0, 1<<20, memory.CPU)
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	old := dialTo(ctx, t, tr, srv.Addr(), local)
	const n = 256 << 10
	fillWith := func(b byte) {
		lb := local.Bytes()[:n]
		for i := range lb {
			lb[i] = b
		}
	}
	fillWith(1)
	if err := transport.Put(ctx, old, 0, 0, n); err != nil {
		t.Fatal(err)
	}
	heal := ns.Partition(t)
	fillWith(2) // the stale bytes
	pctx, pcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = transport.Put(pctx, old, 0, 0, n)
	pcancel()
	if !errors.Is(err, status.ErrTimeout) {
		t.Fatalf("a put across the partition: %v, want ErrTimeout", err)
	}
	_ = old.Close()
	time.Sleep(500 * time.Millisecond)
	heal()
	fresh := dialTo(ctx, t, tr, srv.Addr(), local)
	defer fresh.Close()
	fillWith(3)
	if err := transport.Put(ctx, fresh, 0, 0, n); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // past the old connection's retransmission timer after the heal
	if got := region.Bytes()[:n]; !bytes.Equal(got, bytes.Repeat([]byte{3}, n)) {
		t.Fatalf("the region holds byte %d after the new put: the closed endpoint's put landed later", got[0])
	}
}
