// Package netnstest makes network namespaces for tests: "another host" as far as the network
// stack goes, joined to the test's own namespace by a veth pair. Creating them needs root and
// iproute2; without them a test is skipped with the reason, or fails when HMC_REQUIRE_NETNS=1
// (as CI sets). Everything is removed by t.Cleanup, and traffic stays on the pair.
package netnstest

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// NS is a network namespace joined to the test's by a veth pair.
type NS struct {
	Name         string // for `ip netns exec Name ...`
	HostIP, NSIP string // this side's and the namespace's addresses on the pair
	HostIf, NSIf string // the pair's ends
}

// New makes a namespace, or skips (fails with HMC_REQUIRE_NETNS=1) when it cannot.
func New(t testing.TB) *NS {
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
	for try := 0; ; try++ {
		_, _ = rand.Read(r[:])
		if !subnetInUse(r[0]) {
			break
		}
		if try == 50 {
			skip("no free 10.77.x.0/24 subnet for a veth pair")
		}
	}
	id := hex.EncodeToString(r[:])
	n := &NS{Name: "hmc-" + id, HostIf: "vh" + id, NSIf: "vn" + id,
		HostIP: "10.77." + strconv.Itoa(int(r[0])) + ".1", NSIP: "10.77." + strconv.Itoa(int(r[0])) + ".2"}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			skip("ip " + strings.Join(args, " ") + ": " + err.Error() + ": " + string(out))
		}
	}
	run("netns", "add", n.Name)
	t.Cleanup(func() {
		_ = exec.Command("ip", "netns", "del", n.Name).Run() // removes the pair too
		_ = exec.Command("ip", "link", "del", n.HostIf).Run()
	})
	run("link", "add", n.HostIf, "type", "veth", "peer", "name", n.NSIf)
	run("link", "set", n.NSIf, "netns", n.Name)
	run("addr", "add", n.HostIP+"/24", "dev", n.HostIf)
	run("link", "set", n.HostIf, "up")
	run("netns", "exec", n.Name, "ip", "addr", "add", n.NSIP+"/24", "dev", n.NSIf)
	run("netns", "exec", n.Name, "ip", "link", "set", n.NSIf, "up")
	run("netns", "exec", n.Name, "ip", "link", "set", "lo", "up")
	return n
}

// subnetInUse says whether an interface of this namespace has an address in 10.77.x.0/24: a
// pair there already (another test's running beside this one, or a namespace a killed test
// left behind) would take this pair's traffic. A wider network holding the /24 (a 10.0.0.0/8
// host) is no obstacle: the pair's /24 route is the more specific.
func subnetInUse(x byte) bool {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	_, sub, _ := net.ParseCIDR("10.77." + strconv.Itoa(int(x)) + ".0/24")
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && sub.Contains(ipn.IP) {
			return true
		}
	}
	return false
}

// Command returns cmd to run inside the namespace.
func (n *NS) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
}

// Partition takes the pair down (this side's end: both directions stop, as a cut cable) until
// heal is called; t.Cleanup heals it too.
func (n *NS) Partition(t testing.TB) (heal func()) {
	t.Helper()
	n.link(t, "down")
	var once sync.Once
	heal = func() { once.Do(func() { n.link(t, "up") }) }
	t.Cleanup(heal)
	return heal
}

func (n *NS) link(t testing.TB, state string) {
	t.Helper()
	if out, err := exec.Command("ip", "link", "set", n.HostIf, state).CombinedOutput(); err != nil {
		t.Fatalf("ip link set %s %s: %v: %s", n.HostIf, state, err, out)
	}
}
