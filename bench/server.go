package bench

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/hmc-go/hmc/auth"
	"github.com/hmc-go/hmc/comm"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/stack"
	"github.com/hmc-go/hmc/transport/tcp"
	"github.com/hmc-go/hmc/transport/ucx"
)

// Ranks of the two benchmark processes.
const (
	serverRank = 0
	clientRank = 1
)

// Commands from client to server (u64 tags), each followed by a command struct.
const (
	cmdVerify = 1 // reply crc32 of region[Off, +Len)
	cmdRecv   = 2 // RecvDataFrom the client into Len bytes of Mem memory; reply its crc32
	cmdPing   = 3 // ping-pong Len iterations of 8-byte puts with the client (see pingpong.go; Mem carries the client's route); reply 0
	cmdExit   = 9
)

type command struct {
	// Off is an offset (cmdRecv), or for cmdPing the flags: pingNotify.
	Off, Len uint64
	Port     uint32 // the client's data port (cmdRecv)
	Mem      uint32 // memory.Type of the stream destination (cmdRecv)
}

// ServerConfig configures Serve.
type ServerConfig struct {
	BindIP     string
	DataPort   int // 0: any
	CtrlPort   int // 0: any
	BufferSize uint64
	Transport  transport.ConnType
	BusyPoll   time.Duration // spin on reads before parking (tcp.Config.BusyPoll)
	UCXAlloc   bool          // with Transport UCX, UCX allocates the buffer (see Config.UCXAlloc)
	UCXSpin    int           // UCX busy-poll time in µs (ucx.Config.SpinTime; 0: its default)
	Auth       auth.Config   // authenticate every link (comm.Config.Auth); zero: none
}

// Serve runs a benchmark server until the client says exit, the client goes away, or ctx ends.
// ready is called with the data address and control port once both listen.
func Serve(ctx context.Context, cfg ServerConfig, ready func(dataAddr string, ctrlPort int)) error {
	buf, err := newBuffer(cfg.BufferSize, memory.CPU, cfg.Transport, cfg.UCXAlloc)
	if err != nil {
		return err
	}
	defer buf.Close()
	arr := newArrivals()
	reg, err := stack.New(stack.Config{TCP: tcp.Config{BusyPoll: cfg.BusyPoll}, UCX: ucx.Config{SpinTime: cfg.UCXSpin}, Auth: cfg.Auth})
	if err != nil {
		return err
	}
	c, err := comm.New(buf, comm.Config{Transports: reg, OnRemoteWrite: arr.notify, Auth: cfg.Auth})
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.InitServer(cfg.BindIP, cfg.DataPort, cfg.CtrlPort, "", cfg.Transport); err != nil {
		return err
	}
	ready(c.DataAddr(namedBy(cfg.Transport)), c.CtrlAddr().Port)
	var dest []byte
	var devMem *memory.Memory
	var devBuf *memory.Buffer
	defer func() {
		if devMem != nil {
			_ = devMem.Close() // frees devBuf
		}
	}()
	for {
		tag, err := c.CtrlRecv(ctx, clientRank)
		if err != nil {
			if errors.Is(err, status.ErrPeerClosed) {
				return nil // the client finished without saying so
			}
			return err
		}
		if tag == cmdExit {
			return nil
		}
		var cmd command
		if err := c.Ctrl().RecvStruct(ctx, clientRank, &cmd); err != nil {
			return err
		}
		var crc uint32
		switch tag {
		case cmdVerify:
			b, err := buf.Slice(cmd.Off, cmd.Len)
			if err != nil {
				return err
			}
			crc = crc32.ChecksumIEEE(b)
		case cmdRecv:
			mt := memory.Type(cmd.Mem)
			var d comm.Data
			if mt == memory.CPU {
				if uint64(len(dest)) < cmd.Len {
					dest = make([]byte, cmd.Len)
				}
				d = comm.HostData(dest[:cmd.Len])
			} else {
				if devMem == nil {
					if devMem, err = memory.New(0, mt); err != nil {
						return err
					}
				}
				if devBuf == nil || devBuf.Size() < cmd.Len {
					if devBuf != nil {
						_ = devMem.Free(devBuf)
					}
					if devBuf, err = devMem.Alloc(cmd.Len); err != nil {
						return err
					}
				}
				d = comm.DeviceData(devBuf.Ptr(), cmd.Len, mt, 0)
			}
			ip := "127.0.0.1"
			if a := c.Ctrl().PeerAddr(clientRank); a != nil {
				ip = hostOf(a.String())
			}
			n, err := c.Peer(ip, int(cmd.Port), cfg.Transport).RecvDataFrom(ctx, d)
			if err != nil {
				return fmt.Errorf("bench server: %w", err)
			}
			if mt == memory.CPU {
				crc = crc32.ChecksumIEEE(dest[:n])
			} else {
				host := make([]byte, n)
				if err := devMem.CopyDeviceToHost(host, devBuf.Ptr()); err != nil {
					return err
				}
				crc = crc32.ChecksumIEEE(host)
			}
		case cmdPing:
			ip := "127.0.0.1"
			if a := c.Ctrl().PeerAddr(clientRank); a != nil {
				ip = hostOf(a.String())
			}
			if err := pong(ctx, c, arr, ip, int(cmd.Port), cmd.Len, cfg.Transport, cmd.Off&pingNotify != 0 && notifies(transport.ConnType(cmd.Mem))); err != nil {
				return fmt.Errorf("bench server: ping-pong: %w", err)
			}
		default:
			return fmt.Errorf("bench server: unknown command %d: %w", tag, status.ErrProtocol)
		}
		if err := c.CtrlSend(ctx, clientRank, uint64(crc)); err != nil {
			return err
		}
	}
}
