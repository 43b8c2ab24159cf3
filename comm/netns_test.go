package comm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/ctrl"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/transporttest"
)

// netns is a network namespace joined to this one by a veth pair: "another host" as far as
// the network stack goes. Everything is removed by t.Cleanup; traffic stays on the pair.
type netns struct {
	name         string
	hostIP, nsIP string // this side's and the namespace's addresses on the pair
	hostIf, nsIf string
}

// newNetns makes one, or skips the test with the reason (root and iproute2 are needed; with
// HMC_REQUIRE_NETNS=1 the lack is a failure).
func newNetns(t *testing.T) *netns {
	t.Helper()
	skip := func(why string) {
		if os.Getenv("HMC_REQUIRE_NETNS") == "1" {
			t.Fatalf("HMC_REQUIRE_NETNS=1 but %s", why)
		}
		t.Skip(why)
	}
	if os.Geteuid() != 0 {
		skip("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		skip("ip (iproute2) not found")
	}
	var r [3]byte
	_, _ = rand.Read(r[:])
	id := hex.EncodeToString(r[:])
	n := &netns{name: "hmc-" + id, hostIf: "vh" + id, nsIf: "vn" + id,
		hostIP: "10.77." + strconv.Itoa(int(r[0])) + ".1", nsIP: "10.77." + strconv.Itoa(int(r[0])) + ".2"}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			skip("ip " + strings.Join(args, " ") + ": " + err.Error() + ": " + string(out))
		}
	}
	run("netns", "add", n.name)
	t.Cleanup(func() {
		_ = exec.Command("ip", "netns", "del", n.name).Run() // removes the pair too
		_ = exec.Command("ip", "link", "del", n.hostIf).Run()
	})
	run("link", "add", n.hostIf, "type", "veth", "peer", "name", n.nsIf)
	run("link", "set", n.nsIf, "netns", n.name)
	run("addr", "add", n.hostIP+"/24", "dev", n.hostIf)
	run("link", "set", n.hostIf, "up")
	run("netns", "exec", n.name, "ip", "addr", "add", n.nsIP+"/24", "dev", n.nsIf)
	run("netns", "exec", n.name, "ip", "link", "set", n.nsIf, "up")
	run("netns", "exec", n.name, "ip", "link", "set", "lo", "up")
	return n
}

// A peer in another network namespace is another host to AUTO: it takes TCP (its address is
// not one of ours, and its shared-memory socket, abstract, lives in its own namespace), and the
// bytes arrive; with netem delay and loss on the link they still arrive, whole.
func TestAutoAcrossNetworkNamespaces(t *testing.T) {
	ns := newNetns(t)
	ch := startChildIn(t, ns.name, ns.nsIP)
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
	if err := c.ConnectTo(ctx, 0, 1, ns.nsIP, ch.dataPort, CtrlLink{Transport: ctrl.TCP, IP: ns.nsIP, Port: ch.ctrlPort}, transport.AUTO); err != nil {
		t.Fatal(err)
	}
	s := &session{t: t, ct: transport.AUTO, c: c, buf: buf, ch: ch, ctx: ctx}
	p := c.Peer(ns.nsIP, ch.dataPort, transport.AUTO)
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
	if out, err := exec.Command("tc", "qdisc", "add", "dev", ns.hostIf, "root", "netem", "delay", "5ms", "loss", "1%", "reorder", "5%").CombinedOutput(); err != nil {
		t.Logf("tc netem unavailable, fault part skipped: %v %s", err, out)
	} else {
		put(42, 3<<20+1)
		_ = exec.Command("tc", "qdisc", "del", "dev", ns.hostIf, "root").Run()
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
