package comm

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/ctrl"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/transporttest"
	"github.com/hmc-go/hmc/transport/ucx"
)

// The test binary re-executes itself as the peer process when HMC_COMM_CHILD is set.
func TestMain(m *testing.M) {
	if err := ucx.ExecWithoutErrorSignals(); err != nil { // a fault in UCX shows the Go stacks
		panic(err)
	}
	if os.Getenv("HMC_COMM_CHILD") == "server" {
		// A parent that emulates a GPU (transporttest.EmulateGPU) has this one emulate it too: it
		// opens the parent's emulated device buffer through its IPC handle.
		memory.SetEmulateGPU(os.Getenv(memory.EmulateGPUEnv) == "1")
		if err := childServer(); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// Commands the parent sends to the child as u64 tags, followed by a request struct.
const (
	cmdCheck    = 1 // verify region[off, +len) == Fill(seed); reply 1 or 0
	cmdFill     = 2 // fill region[off, +len) with Fill(seed); reply 1
	cmdRecvData = 3 // RecvDataFrom the parent into len bytes and verify Fill(seed); reply 1 or 0
	cmdSendData = 4 // SendDataTo the parent len bytes of Fill(seed)
	cmdPutBack  = 5 // fill region[off,+len) with seed and Put it to the parent's region at the same offset; reply 1
	cmdRegister = 6 // register region[off, +len) in the Communicator's table; reply its key
	cmdDereg    = 7 // deregister the region whose key is off; reply 1 or 0
	cmdExit     = 9
)

type request struct {
	Off, Len uint64
	Seed     uint32
	Port     uint32 // the parent's data port (cmdPutBack, cmdRecvData)
}

const childBufSize = 64 << 20

func childServer() error {
	buf, err := buffer.New(0, childBufSize, memory.CPU)
	if err != nil {
		return err
	}
	defer buf.Close()
	c, err := New(buf, Config{Stream: StreamConfig{Offset: 32 << 20, SlotSize: 1 << 20}})
	if err != nil {
		return err
	}
	defer c.Close()
	uds := os.Getenv("HMC_COMM_UDS")
	bind := os.Getenv("HMC_COMM_BIND") // another network namespace's address (netns tests)
	if bind == "" {
		bind = "127.0.0.1"
	}
	if err := c.InitServer(bind, 0, 0, uds, transport.AUTO); err != nil {
		return err
	}
	ucxPort := 0
	if ucx.Built {
		if err := c.InitServer("127.0.0.1", 0, -1, "", transport.UCX); err != nil {
			return err
		}
		ucxPort = transporttestPort(c.DataAddr(transport.UCX))
	}
	fmt.Printf("READY %s %d %d\n", c.DataAddr(transport.TCP), c.CtrlAddr().Port, ucxPort)
	ctx := context.Background()
	const parent = 1
	registered := map[uint64]*buffer.Region{}
	for {
		tag, err := c.CtrlRecv(ctx, parent)
		if err != nil {
			return err
		}
		if tag == cmdExit {
			return nil
		}
		var r request
		if err := c.Ctrl().RecvStruct(ctx, parent, &r); err != nil {
			return err
		}
		reply := uint64(1)
		switch tag {
		case cmdCheck:
			want := make([]byte, r.Len)
			transporttest.Fill(want, r.Seed)
			got, err := buf.Slice(r.Off, r.Len)
			if err != nil || !bytes.Equal(got, want) {
				reply = 0
			}
		case cmdFill:
			s, err := buf.Slice(r.Off, r.Len)
			if err != nil {
				return err
			}
			transporttest.Fill(s, r.Seed)
		case cmdRecvData:
			dst := make([]byte, r.Len+7) // capacity larger than the payload
			n, err := c.Peer("127.0.0.1", int(r.Port), transport.AUTO).RecvDataFrom(ctx, HostData(dst))
			want := make([]byte, r.Len)
			transporttest.Fill(want, r.Seed)
			if err != nil || n != r.Len || !bytes.Equal(dst[:n], want) {
				fmt.Fprintln(os.Stderr, "child: recv data:", n, err)
				reply = 0
			}
		case cmdSendData:
			src := make([]byte, r.Len)
			transporttest.Fill(src, r.Seed)
			if err := c.Peer("127.0.0.1", int(r.Port), transport.AUTO).SendDataTo(ctx, HostData(src)); err != nil {
				fmt.Fprintln(os.Stderr, "child: send data:", err)
				reply = 0
			}
		case cmdRegister:
			s, err := buf.Slice(r.Off, r.Len)
			if err != nil {
				return err
			}
			reg, err := c.Regions().Register(s)
			if err != nil {
				return err
			}
			registered[uint64(reg.Key())] = reg
			reply = uint64(reg.Key())
		case cmdDereg:
			reg := registered[r.Off]
			delete(registered, r.Off)
			if reg == nil || c.Regions().Deregister(ctx, reg) != nil {
				reply = 0
			}
		case cmdPutBack:
			s, err := buf.Slice(r.Off, r.Len)
			if err != nil {
				return err
			}
			transporttest.Fill(s, r.Seed)
			if err := c.Peer("127.0.0.1", int(r.Port), transport.AUTO).Put(ctx, r.Off, r.Off, r.Len); err != nil {
				fmt.Fprintln(os.Stderr, "child: put back:", err)
				reply = 0
			}
		}
		if err := c.CtrlSend(ctx, parent, reply); err != nil {
			return err
		}
	}
}

// child is a running peer process.
type child struct {
	cmd      *exec.Cmd
	dataPort int
	ctrlPort int
	ucxPort  int
	uds      string
	done     chan error
}

func startChild(t *testing.T) *child { return startChildIn(t, "", "") }

// startChildIn starts the child in network namespace ns (none: this one), its servers bound to
// bind (none: 127.0.0.1).
func startChildIn(t *testing.T, ns, bind string) *child {
	t.Helper()
	uds := ctrl.UDSPathFor(t.TempDir(), 0)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	if ns != "" {
		cmd = exec.Command("ip", "netns", "exec", ns, os.Args[0], "-test.run=^$")
	}
	cmd.Env = append(os.Environ(), "HMC_COMM_CHILD=server", "HMC_COMM_UDS="+uds, "HMC_COMM_BIND="+bind)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ch := &child{cmd: cmd, uds: uds, done: make(chan error, 1)}
	line := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			if strings.HasPrefix(s.Text(), "READY ") {
				line <- s.Text()
			}
		}
		ch.done <- cmd.Wait()
	}()
	select {
	case l := <-line:
		var addr string
		if _, err := fmt.Sscanf(l, "READY %s %d %d", &addr, &ch.ctrlPort, &ch.ucxPort); err != nil {
			t.Fatal(err)
		}
		ch.dataPort = transporttestPort(addr)
	case err := <-ch.done:
		t.Fatalf("child exited before READY: %v", err)
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatal("child did not start")
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		select {
		case <-ch.done:
		case <-time.After(10 * time.Second):
			t.Error("child did not exit")
		}
	})
	return ch
}

func transporttestPort(addr string) int {
	i := strings.LastIndexByte(addr, ':')
	var p int
	fmt.Sscanf(addr[i+1:], "%d", &p)
	return p
}
