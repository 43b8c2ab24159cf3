package collective

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/comm"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/transport"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func port(addr string) int {
	_, p, _ := net.SplitHostPort(addr)
	n, _ := strconv.Atoi(p)
	return n
}

// blockByte is the content of rank src's block for rank dst.
func blockByte(src, dst, i int) byte { return byte(src*31 + dst*7 + i) }

func TestAllToAll(t *testing.T) {
	for _, ct := range []transport.ConnType{transport.TCP, transport.AUTO} {
		for _, w := range []int{1, 2, 3, 4, 5} {
			for _, algo := range []Algo{Direct, Ring} {
				t.Run(fmt.Sprintf("%v/world%d/algo%d", ct, w, algo), func(t *testing.T) { run(t, ct, w, algo) })
			}
		}
	}
}

func run(t *testing.T, ct transport.ConnType, w int, algo Algo) {
	const block = 100_003
	sendOff, recvOff := uint64(0), uint64(w*block)
	scratch := uint64(2 * w * block)
	size := scratch + ScratchSize(w, block) + 1
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	comms := make([]*comm.Communicator, w)
	members := make([]Member, w)
	for r := range w {
		buf, err := buffer.New(0, size, memory.CPU)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { buf.Close() })
		c, err := comm.New(buf, comm.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if err := c.InitServer("127.0.0.1", 0, 0, "", ct); err != nil {
			t.Fatal(err)
		}
		comms[r] = c
		members[r] = Member{Rank: uint32(r), IP: "127.0.0.1", DataPort: port(c.DataAddr(transport.AUTO)), CtrlPort: c.CtrlAddr().Port}
		b := buf.Bytes()
		for dst := range w {
			for i := range block {
				b[int(sendOff)+dst*block+i] = blockByte(r, dst, i)
			}
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, w)
	for r := range w {
		wg.Go(func() {
			g, err := New(ctx, comms[r], members, uint32(r), ct)
			if err != nil {
				errs[r] = err
				return
			}
			for range 2 { // twice: the sequence numbers keep rounds apart
				if err := g.AllToAll(ctx, algo, sendOff, recvOff, scratch, block); err != nil {
					errs[r] = err
					return
				}
			}
		})
	}
	wg.Wait()
	failed := false
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
			failed = true
		}
	}
	if failed {
		t.FailNow()
	}
	for r := range w {
		b := comms[r].Buffer().Bytes()
		for src := range w {
			for i := range block {
				if got := b[int(recvOff)+src*block+i]; got != blockByte(src, r, i) {
					t.Fatalf("rank %d: block from %d byte %d = %d, want %d", r, src, i, got, blockByte(src, r, i))
				}
			}
		}
	}
}

func TestBadGroups(t *testing.T) {
	buf, _ := buffer.New(0, 1<<20, memory.CPU)
	defer buf.Close()
	c, _ := comm.New(buf, comm.Config{})
	defer c.Close()
	ctx := context.Background()
	if _, err := New(ctx, c, []Member{{Rank: 1}}, 0, transport.TCP); err == nil {
		t.Fatal("ranks not starting at 0 accepted")
	}
	if _, err := New(ctx, c, []Member{{Rank: 0}}, 3, transport.TCP); err == nil {
		t.Fatal("rank outside the group accepted")
	}
	g, err := New(ctx, c, []Member{{Rank: 0}}, 0, transport.TCP)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.AllToAll(ctx, Direct, 0, 100, 0, 200); err == nil {
		t.Fatal("overlapping areas accepted")
	}
	if err := g.AllToAll(ctx, Direct, 0, 1<<20, 0, 1); err == nil {
		t.Fatal("receive area outside the buffer accepted")
	}
	if _, err := ParseAlgo("bruck"); err == nil {
		t.Fatal("unknown algorithm accepted")
	}
}
