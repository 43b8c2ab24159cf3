package comm

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/hmc-go/hmc/internal/netnstest"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/ctrl"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/transporttest"
)

// A peer in another network namespace is another host to AUTO: it takes TCP (its address is
// not one of ours, and its shared-memory socket, abstract, lives in its own namespace), and the
// bytes arrive; with netem delay and loss on the link they still arrive, whole.
func TestAutoAcrossNetworkNamespaces(t *testing.T) {
	ns := netnstest.New(t)
	ch := startChildIn(t, ns.Name, ns.NSIP)
	buf, err := buffer.New(0, parentBufSize, memory.CPU)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { buf.Close() })
	c, err := New(buf, Config{NumChannels: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.ConnectTo(ctx, 0, 1, ns.NSIP, ch.dataPort, CtrlLink{Transport: ctrl.TCP, IP: ns.NSIP, Port: ch.ctrlPort}, transport.AUTO); err != nil {
		t.Fatal(err)
	}
	s := &session{t: t, ct: transport.AUTO, c: c, buf: buf, ch: ch, ctx: ctx}
	p := c.Peer(ns.NSIP, ch.dataPort, transport.AUTO)
	if route, err := p.Route(); err != nil || route != transport.TCP {
		t.Fatalf("AUTO to another namespace took %v (%v), want tcp", route, err)
	}
	put := func(seed uint32, n uint64) {
		t.Helper()
		s.fillLocal(0, n, seed)
		if err := p.Put(ctx, 0, 4096, n); err != nil {
			t.Fatal(err)
		}
		if !s.ask(cmdCheck, request{Off: 4096, Len: n, Seed: seed}) {
			t.Fatalf("put of %d bytes across namespaces: the child's region differs", n)
		}
	}
	put(41, 5<<20+3)
	// Faults on the link: 5 ms delay, 1 % loss, reordering. TCP retransmits; the bytes are whole.
	if out, err := exec.Command("tc", "qdisc", "add", "dev", ns.HostIf, "root", "netem", "delay", "5ms", "loss", "1%", "reorder", "5%").CombinedOutput(); err != nil {
		t.Logf("tc netem unavailable, fault part skipped: %v %s", err, out)
	} else {
		put(42, 3<<20+1)
		_ = exec.Command("tc", "qdisc", "del", "dev", ns.HostIf, "root").Run()
	}
	src := make([]byte, 1<<20)
	transporttest.Fill(src, 43)
	if err := p.PutFrom(ctx, src, 8<<20); err != nil {
		t.Fatal(err)
	}
	if !s.ask(cmdCheck, request{Off: 8 << 20, Len: 1 << 20, Seed: 43}) {
		t.Fatal("put from across namespaces differs")
	}
	if err := c.CtrlSend(ctx, 0, cmdExit); err != nil {
		t.Fatal(err)
	}
}
