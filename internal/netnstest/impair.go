package netnstest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Impairment is what `tc netem` would do to a link, done instead by a packet queue in the test
// process (iptables NFQUEUE): many kernels, this project's CI machines' among them, are built
// without sch_netem.
type Impairment struct {
	Delay   time.Duration // added to each packet, each way
	Jitter  time.Duration // the delay varies uniformly by up to ± Jitter (packets then overtake each other)
	Loss    float64       // fraction of packets dropped, 0..1
	Reorder float64       // fraction of packets passed at once, overtaking the delayed ones, 0..1
}

func (imp Impairment) String() string {
	return fmt.Sprintf("delay %v±%v loss %.1f%% reorder %.1f%%", imp.Delay, imp.Jitter, imp.Loss*100, imp.Reorder*100)
}

var queueNums atomic.Uint32

// Impair applies imp to every packet the namespace sends or receives on its end of the pair,
// until heal is called (t.Cleanup calls it too). Packets held when it heals are passed on.
// Without iptables the test is skipped (fails with HMC_REQUIRE_NETNS=1).
func (n *NS) Impair(t testing.TB, imp Impairment) (heal func()) {
	t.Helper()
	if _, err := exec.LookPath("iptables"); err != nil {
		if os.Getenv("HMC_REQUIRE_NETNS") == "1" {
			t.Fatal("HMC_REQUIRE_NETNS=1 but iptables (for the packet queue) is not installed")
		}
		t.Skip("iptables (for the packet queue) is not installed")
	}
	num := uint16(queueNums.Add(1))
	q, err := openQueue(n.Name, num)
	if err != nil {
		t.Fatalf("packet queue in %s: %v", n.Name, err)
	}
	q.imp = imp
	go q.run()
	rules := [][]string{
		{"OUTPUT", "-o", n.NSIf},
		{"INPUT", "-i", n.NSIf},
	}
	var added [][]string
	iptables := func(op string, rule []string) error {
		args := append([]string{"netns", "exec", n.Name, "iptables", op}, rule...)
		args = append(args, "-j", "NFQUEUE", "--queue-num", strconv.Itoa(int(num)), "--queue-bypass")
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("iptables %s %s: %v: %s", op, strings.Join(rule, " "), err, out)
		}
		return nil
	}
	var once sync.Once
	heal = func() {
		once.Do(func() {
			for _, r := range added {
				if err := iptables("-D", r); err != nil {
					t.Error(err)
				}
			}
			q.close()
		})
	}
	t.Cleanup(heal)
	for _, r := range rules {
		if err := iptables("-I", r); err != nil {
			heal()
			t.Fatal(err)
		}
		added = append(added, r)
	}
	return heal
}

// The nfnetlink queue protocol (linux/netfilter/nfnetlink_queue.h).
const (
	subsysQueue      = 3
	msgPacket        = subsysQueue << 8
	msgVerdict       = subsysQueue<<8 | 1
	msgConfig        = subsysQueue<<8 | 2
	attrPacketHdr    = 1 // NFQA_PACKET_HDR: be32 id, be16 proto, u8 hook
	attrVerdictHdr   = 2 // NFQA_VERDICT_HDR: be32 verdict, be32 id
	attrCfgCmd       = 1 // NFQA_CFG_CMD: u8 cmd, u8 pad, be16 pf
	attrCfgParams    = 2 // NFQA_CFG_PARAMS: be32 copy range, u8 copy mode
	attrCfgQueueMax  = 3 // NFQA_CFG_QUEUE_MAXLEN: be32
	cfgCmdBind       = 1
	cfgCmdUnbind     = 2
	copyMeta         = 1
	verdictDrop      = 0
	verdictAccept    = 1
	queueMaxLen      = 1 << 14
	solNetlink       = 270
	netlinkNoENOBUFS = 5
)

// queue is one bound nfnetlink queue: it reads packets' ids and gives their verdicts.
type queue struct {
	fd   int
	num  uint16
	imp  Impairment
	stop atomic.Bool
	done chan struct{}
	held sync.WaitGroup // packets waiting out their delay
}

// openQueue opens a netfilter netlink socket inside namespace ns and binds queue num.
func openQueue(ns string, num uint16) (*queue, error) {
	var fd int
	if err := inNamespace(ns, func() (err error) {
		fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
		return err
	}); err != nil {
		return nil, err
	}
	q := &queue{fd: fd, num: num, done: make(chan struct{})}
	_ = unix.SetsockoptInt(q.fd, solNetlink, netlinkNoENOBUFS, 1)
	_ = unix.SetsockoptInt(q.fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 8<<20)
	tv := unix.NsecToTimeval(int64(50 * time.Millisecond)) // the reader looks at stop this often
	if err := unix.SetsockoptTimeval(q.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(q.fd)
		return nil, err
	}
	if err := unix.Bind(q.fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(q.fd)
		return nil, err
	}
	cmd := []byte{cfgCmdBind, 0, 0, unix.AF_INET}
	params := binary.BigEndian.AppendUint32(nil, 0xffff)
	params = append(params, copyMeta)
	if err := q.request(msgConfig, attr(attrCfgCmd, cmd), attr(attrCfgParams, params),
		attr(attrCfgQueueMax, binary.BigEndian.AppendUint32(nil, queueMaxLen))); err != nil {
		unix.Close(q.fd)
		return nil, fmt.Errorf("bind queue %d: %w", num, err)
	}
	return q, nil
}

// inNamespace runs fn on a thread of its own that has entered network namespace ns: sockets
// fn makes belong to ns for their life. The thread is discarded unless it gets back to ours.
func inNamespace(ns string, fn func() error) error {
	ch := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		ch <- func() error {
			self, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(self)
			target, err := unix.Open("/var/run/netns/"+ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(target)
			if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
				return fmt.Errorf("setns %s: %w", ns, err)
			}
			err = fn()
			if unix.Setns(self, unix.CLONE_NEWNET) == nil {
				runtime.UnlockOSThread()
			}
			return err
		}()
	}()
	return <-ch
}

// Listen listens on a TCP address inside the namespace (addr "" is NSIP on any port), for
// tests that want a peer there without a process.
func (n *NS) Listen(addr string) (net.Listener, error) {
	if addr == "" {
		addr = net.JoinHostPort(n.NSIP, "0")
	}
	var l net.Listener
	err := inNamespace(n.Name, func() (err error) {
		l, err = net.Listen("tcp", addr)
		return err
	})
	return l, err
}

// attr encodes one netlink attribute, padded to 4 bytes.
func attr(typ uint16, payload []byte) []byte {
	b := binary.NativeEndian.AppendUint16(nil, uint16(4+len(payload)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, payload...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// message encodes a netlink message of type typ for this queue with attributes attrs.
func (q *queue) message(typ uint16, flags uint16, attrs ...[]byte) []byte {
	b := make([]byte, 16, 64)
	binary.NativeEndian.PutUint16(b[4:], typ)
	binary.NativeEndian.PutUint16(b[6:], flags|unix.NLM_F_REQUEST)
	b = append(b, unix.AF_UNSPEC, 0) // nfgenmsg: family, version
	b = binary.BigEndian.AppendUint16(b, q.num)
	for _, a := range attrs {
		b = append(b, a...)
	}
	binary.NativeEndian.PutUint32(b[0:], uint32(len(b)))
	return b
}

// request sends a message asking for an acknowledgement and reads it.
func (q *queue) request(typ uint16, attrs ...[]byte) error {
	if err := unix.Sendto(q.fd, q.message(typ, unix.NLM_F_ACK, attrs...), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 4096)
	for {
		n, _, err := unix.Recvfrom(q.fd, buf, 0)
		if err != nil {
			return err
		}
		for b := buf[:n]; len(b) >= 16; {
			l := int(binary.NativeEndian.Uint32(b))
			if l < 16 || l > len(b) {
				return errors.New("short netlink message")
			}
			if binary.NativeEndian.Uint16(b[4:]) == unix.NLMSG_ERROR && l >= 20 {
				if e := int32(binary.NativeEndian.Uint32(b[16:])); e != 0 {
					return unix.Errno(-e)
				}
				return nil
			}
			b = b[(l+3)&^3:]
		}
	}
}

// setVerdict passes (accept) or drops packet id.
func (q *queue) setVerdict(id uint32, v uint32) {
	hdr := binary.BigEndian.AppendUint32(nil, v)
	hdr = binary.BigEndian.AppendUint32(hdr, id)
	_ = unix.Sendto(q.fd, q.message(msgVerdict, 0, attr(attrVerdictHdr, hdr)), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
}

// run reads packets and gives each its fate until close, and the queue is empty (the rules
// that fill it are removed before close).
func (q *queue) run() {
	defer close(q.done)
	buf := make([]byte, 1<<16)
	for {
		n, _, err := unix.Recvfrom(q.fd, buf, 0)
		if err != nil {
			if q.stop.Load() && (err == unix.EAGAIN || err == unix.EWOULDBLOCK) {
				return
			}
			continue // the timeout that lets us look at stop, ENOBUFS, EINTR
		}
		for b := buf[:n]; len(b) >= 16; {
			l := int(binary.NativeEndian.Uint32(b))
			if l < 16 || l > len(b) {
				break
			}
			if binary.NativeEndian.Uint16(b[4:]) == msgPacket {
				if id, ok := packetID(b[20:l]); ok {
					q.judge(id)
				}
			}
			b = b[min((l+3)&^3, len(b)):]
		}
	}
}

// packetID finds the packet header attribute among attrs.
func packetID(attrs []byte) (uint32, bool) {
	for len(attrs) >= 4 {
		l := int(binary.NativeEndian.Uint16(attrs))
		typ := binary.NativeEndian.Uint16(attrs[2:]) & 0x3fff
		if l < 4 || l > len(attrs) {
			return 0, false
		}
		if typ == attrPacketHdr && l >= 8 {
			return binary.BigEndian.Uint32(attrs[4:]), true
		}
		attrs = attrs[min((l+3)&^3, len(attrs)):]
	}
	return 0, false
}

func (q *queue) judge(id uint32) {
	imp := q.imp
	switch {
	case imp.Loss > 0 && rand.Float64() < imp.Loss:
		q.setVerdict(id, verdictDrop)
		return
	case imp.Reorder > 0 && rand.Float64() < imp.Reorder:
		q.setVerdict(id, verdictAccept)
		return
	}
	d := imp.Delay
	if imp.Jitter > 0 {
		d += time.Duration(rand.Int64N(int64(2*imp.Jitter))) - imp.Jitter
	}
	if d <= 0 {
		q.setVerdict(id, verdictAccept)
		return
	}
	q.held.Add(1)
	time.AfterFunc(d, func() {
		defer q.held.Done()
		q.setVerdict(id, verdictAccept)
	})
}

// close stops reading, passes the held packets on, unbinds and closes the socket.
func (q *queue) close() {
	q.stop.Store(true)
	<-q.done
	q.held.Wait()
	_ = q.request(msgConfig, attr(attrCfgCmd, []byte{cfgCmdUnbind, 0, 0, unix.AF_INET}))
	unix.Close(q.fd)
}
