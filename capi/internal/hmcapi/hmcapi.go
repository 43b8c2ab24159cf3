//go:build cgo

package hmcapi

/*
#include <stdint.h>
#include <stdlib.h>
*/
import "C"

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	hmc "github.com/hmc-go/hmc"
	"github.com/hmc-go/hmc/auth"
	"github.com/hmc-go/hmc/capi/internal/cabi"
	"github.com/hmc-go/hmc/collective"
	"github.com/hmc-go/hmc/comm"
	"github.com/hmc-go/hmc/ctrl"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport/stack"
	"github.com/hmc-go/hmc/transport/ucx"
)

// ---- Memory ----

//export hmc_memory_probe
func hmc_memory_probe(memType C.int) C.int {
	return call(func() error { return memory.Probe(memory.Type(memType)) })
}

//export hmc_memory_open
func hmc_memory_open(deviceID, memType C.int, out *C.uint64_t) C.int {
	return call(func() error {
		if out == nil {
			return fmt.Errorf("hmc: null out handle: %w", status.ErrInvalidConfig)
		}
		m, err := memory.New(int(deviceID), memory.Type(memType))
		if err != nil {
			return err
		}
		*out = C.uint64_t(cabi.Add(m))
		return nil
	})
}

//export hmc_memory_type
func hmc_memory_type(h C.uint64_t) C.int {
	m, err := cabi.Get[*memory.Memory](uint64(h))
	if err != nil {
		setError(err.Error())
		return -1
	}
	return C.int(m.Type())
}

//export hmc_memory_alloc
func hmc_memory_alloc(h C.uint64_t, size C.uint64_t, out *C.uint64_t) C.int {
	return withMemory(h, func(m *memory.Memory) error {
		if out == nil {
			return fmt.Errorf("hmc: null out pointer: %w", status.ErrInvalidConfig)
		}
		b, err := m.Alloc(uint64(size))
		if err != nil {
			return err
		}
		allocs.Store(uintptr(b.Ptr()), b)
		*out = C.uint64_t(b.Ptr())
		return nil
	})
}

//export hmc_memory_free
func hmc_memory_free(h C.uint64_t, ptr C.uint64_t) C.int {
	return withMemory(h, func(m *memory.Memory) error {
		v, ok := allocs.Load(uintptr(ptr))
		if !ok {
			return fmt.Errorf("hmc: free of %#x, which this library did not allocate: %w", uint64(ptr), status.ErrInvalidConfig)
		}
		if err := m.Free(v.(*memory.Buffer)); err != nil {
			return err
		}
		allocs.Delete(uintptr(ptr))
		return nil
	})
}

//export hmc_memory_copy_h2d
func hmc_memory_copy_h2d(h C.uint64_t, dst C.uint64_t, src unsafe.Pointer, n C.uint64_t) C.int {
	return withMemory(h, func(m *memory.Memory) error {
		b, err := hostBytes(src, n)
		if err != nil {
			return err
		}
		return m.CopyHostToDevice(memory.Ptr(dst), b)
	})
}

//export hmc_memory_copy_d2h
func hmc_memory_copy_d2h(h C.uint64_t, dst unsafe.Pointer, src C.uint64_t, n C.uint64_t) C.int {
	return withMemory(h, func(m *memory.Memory) error {
		b, err := hostBytes(dst, n)
		if err != nil {
			return err
		}
		return m.CopyDeviceToHost(b, memory.Ptr(src))
	})
}

//export hmc_memory_copy_d2d
func hmc_memory_copy_d2d(h C.uint64_t, dst, src C.uint64_t, n C.uint64_t) C.int {
	return withMemory(h, func(m *memory.Memory) error {
		return m.CopyDeviceToDevice(memory.Ptr(dst), memory.Ptr(src), uint64(n))
	})
}

//export hmc_memory_close
func hmc_memory_close(h C.uint64_t) C.int {
	return withMemory(h, func(m *memory.Memory) error {
		cabi.Remove(uint64(h))
		return m.Close()
	})
}

//export hmc_memory_locate
func hmc_memory_locate(addr C.uint64_t, kind, device, vendor *C.int) C.int {
	return call(func() error {
		pl, err := memory.Locate(memory.Ptr(addr))
		if err != nil {
			return err
		}
		if kind != nil {
			*kind = C.int(pl.Kind)
		}
		if device != nil {
			*device = C.int(pl.Device)
		}
		if vendor != nil {
			*vendor = C.int(pl.Vendor)
		}
		return nil
	})
}

//export hmc_memory_copy
func hmc_memory_copy(dst, src, n C.uint64_t) C.int {
	return call(func() error { return memory.Copy(memory.Ptr(dst), memory.Ptr(src), uint64(n)) })
}

//export hmc_stream_create
func hmc_stream_create(memType, deviceID C.int, out *C.uint64_t) C.int {
	return call(func() error {
		if out == nil {
			return fmt.Errorf("hmc: null out stream: %w", status.ErrInvalidConfig)
		}
		s, err := memory.NewStream(memory.Type(memType), int(deviceID))
		if err != nil {
			return err
		}
		*out = C.uint64_t(s)
		return nil
	})
}

// placeOf is where addr lives, or the first GPU's place for 0 (a stream call that names no
// memory).
func placeOf(addr C.uint64_t) (memory.Place, error) {
	if addr == 0 {
		return memory.Place{Kind: memory.Device, Vendor: memory.NvidiaGPU}, nil
	}
	return memory.Locate(memory.Ptr(addr))
}

//export hmc_stream_sync
func hmc_stream_sync(stream, addr C.uint64_t) C.int {
	return call(func() error {
		pl, err := placeOf(addr)
		if err != nil {
			return err
		}
		return memory.SyncStream(uintptr(stream), pl)
	})
}

//export hmc_stream_destroy
func hmc_stream_destroy(stream, addr C.uint64_t) C.int {
	return call(func() error {
		pl, err := placeOf(addr)
		if err != nil {
			return err
		}
		return memory.DestroyStream(uintptr(stream), pl)
	})
}

//export hmc_memory_memset_async
func hmc_memory_memset_async(addr C.uint64_t, v C.int, n, stream C.uint64_t) C.int {
	return call(func() error {
		pl, err := memory.LocateRange(memory.Ptr(addr), uint64(n))
		if err != nil {
			return err
		}
		return memory.MemsetAsync(memory.Ptr(addr), pl, byte(v), uint64(n), uintptr(stream))
	})
}

// ---- Session (ConnBuffer + Communicator) ----

// transportsFromEnv is a session option with the transports built for HMC_UCX_SPIN_US (the UCX
// busy-poll time in µs) and a's authentication; nil when the variable is not set.
func transportsFromEnv(a auth.Config) (hmc.Option, error) {
	v, err := strconv.Atoi(os.Getenv("HMC_UCX_SPIN_US"))
	if err != nil || v <= 0 {
		return func(*comm.Config) {}, nil
	}
	reg, err := stack.New(stack.Config{UCX: ucx.Config{SpinTime: v}, Auth: a})
	if err != nil {
		return nil, err
	}
	return func(c *comm.Config) { c.Transports = reg }, nil
}

// ctrlFromEnv applies CTRL_TRANSPORT as the Python SDK reads it: "uds" forces Unix control
// sockets, any other non-empty value TCP; unset or empty lets the Session choose.
func ctrlFromEnv(s *hmc.Session) {
	switch v := strings.TrimSpace(os.Getenv("CTRL_TRANSPORT")); {
	case v == "":
	case strings.EqualFold(v, "uds"):
		s.ForceCtrlTransport(ctrl.UDS)
	default:
		s.ForceCtrlTransport(ctrl.TCP)
	}
}

//export hmc_session_create
func hmc_session_create(deviceID C.int, bufferSize C.uint64_t, memType, numChs C.int, localIP *C.char, out *C.uint64_t) C.int {
	return call(func() error {
		if out == nil {
			return fmt.Errorf("hmc: null out handle: %w", status.ErrInvalidConfig)
		}
		withTransports, err := transportsFromEnv(auth.Config{})
		if err != nil {
			return err
		}
		s, err := hmc.NewSession(int(deviceID), uint64(bufferSize), memory.Type(memType), int(numChs), goString(localIP), withTransports)
		if err != nil {
			return err
		}
		ctrlFromEnv(s)
		*out = C.uint64_t(cabi.Add(s))
		return nil
	})
}

//export hmc_session_create_secure
func hmc_session_create_secure(deviceID C.int, bufferSize C.uint64_t, memType, numChs C.int, localIP *C.char,
	secret unsafe.Pointer, secretLen C.uint64_t, tlsCert, tlsKey, tlsCA *C.char, out *C.uint64_t) C.int {
	return call(func() error {
		if out == nil {
			return fmt.Errorf("hmc: null out handle: %w", status.ErrInvalidConfig)
		}
		var a auth.Config
		if secretLen > 0 {
			if secret == nil {
				return fmt.Errorf("hmc: null secret of %d bytes: %w", secretLen, status.ErrInvalidConfig)
			}
			a.Secret = C.GoBytes(secret, C.int(secretLen))
		}
		tc, err := auth.TLSFromFiles(goString(tlsCert), goString(tlsKey), goString(tlsCA))
		if err != nil {
			return err
		}
		a.TLS = tc
		withTransports, err := transportsFromEnv(a)
		if err != nil {
			return err
		}
		s, err := hmc.NewSession(int(deviceID), uint64(bufferSize), memory.Type(memType), int(numChs), goString(localIP), hmc.WithAuth(a), withTransports)
		if err != nil {
			return err
		}
		ctrlFromEnv(s)
		*out = C.uint64_t(cabi.Add(s))
		return nil
	})
}

// peerAt is the seeds' (ip, port, conn) addressing of the C and Python SDK: the handle of the
// peer behind it, looked up per call (the Go facade hands handles out instead).
func peerAt(s *hmc.Session, ip *C.char, port, conn C.int) *hmc.Peer {
	return s.Comm().Peer(goString(ip), int(port), hmc.ConnType(conn))
}

func session(h C.uint64_t) (*hmc.Session, error) { return cabi.Get[*hmc.Session](uint64(h)) }

// withSession runs f on the session behind handle h, as call does.
func withSession(h C.uint64_t, f func(*hmc.Session) error) C.int {
	return call(func() error {
		s, err := session(h)
		if err != nil {
			return err
		}
		return f(s)
	})
}

// withMemory runs f on the memory behind handle h, as call does.
func withMemory(h C.uint64_t, f func(*memory.Memory) error) C.int {
	return call(func() error {
		m, err := cabi.Get[*memory.Memory](uint64(h))
		if err != nil {
			return err
		}
		return f(m)
	})
}

//export hmc_session_destroy
func hmc_session_destroy(h C.uint64_t) C.int {
	return withSession(h, func(s *hmc.Session) error {
		cabi.Remove(uint64(h))
		return s.Close()
	})
}

//export hmc_session_init_server
func hmc_session_init_server(h C.uint64_t, bindIP *C.char, dataPort, ctrlTCPPort C.int, selfID C.uint32_t, udsDir *C.char, conn C.int) C.int {
	return withSession(h, func(s *hmc.Session) error {
		return s.InitServer(goString(bindIP), int(dataPort), int(ctrlTCPPort), uint32(selfID), goString(udsDir), hmc.ConnType(conn))
	})
}

//export hmc_session_data_port
func hmc_session_data_port(h C.uint64_t) C.int {
	s, err := session(h)
	if err != nil {
		setError(err.Error())
		return -1
	}
	return C.int(s.DataPort())
}

//export hmc_session_ctrl_port
func hmc_session_ctrl_port(h C.uint64_t) C.int {
	s, err := session(h)
	if err != nil {
		setError(err.Error())
		return -1
	}
	return C.int(s.CtrlPort())
}

//export hmc_session_connect
func hmc_session_connect(h C.uint64_t, peerID, selfID C.uint32_t, peerIP *C.char, dataPort, ctrlTCPPort C.int, udsDir *C.char, conn, timeoutMS C.int) C.int {
	return withSession(h, func(s *hmc.Session) error {
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		_, err := s.Connect(ctx, uint32(peerID), uint32(selfID), goString(peerIP), int(dataPort), int(ctrlTCPPort), goString(udsDir), hmc.ConnType(conn))
		return err
	})
}

//export hmc_session_check_conn
func hmc_session_check_conn(h C.uint64_t, ip *C.char, port, conn C.int) C.int {
	return withSession(h, func(s *hmc.Session) error {
		return peerAt(s, ip, port, conn).Check()
	})
}

//export hmc_session_disconnect
func hmc_session_disconnect(h C.uint64_t, ip *C.char, port, conn C.int) C.int {
	return withSession(h, func(s *hmc.Session) error {
		return peerAt(s, ip, port, conn).Disconnect()
	})
}

//export hmc_session_close_server
func hmc_session_close_server(h C.uint64_t) C.int {
	return withSession(h, func(s *hmc.Session) error {
		return s.CloseServer()
	})
}

//export hmc_session_put
func hmc_session_put(h C.uint64_t, ip *C.char, port C.int, localOff, remoteOff, n C.uint64_t, conn, timeoutMS C.int) C.int {
	return withSession(h, func(s *hmc.Session) error {
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		return peerAt(s, ip, port, conn).Put(ctx, uint64(localOff), uint64(remoteOff), uint64(n))
	})
}

//export hmc_session_put_from
func hmc_session_put_from(h C.uint64_t, ip *C.char, port C.int, src unsafe.Pointer, n, remoteOff C.uint64_t, conn, timeoutMS C.int) C.int {
	return withSession(h, func(s *hmc.Session) error {
		b, err := hostBytes(src, n)
		if err != nil {
			return err
		}
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		return peerAt(s, ip, port, conn).PutFrom(ctx, b, uint64(remoteOff))
	})
}

//export hmc_session_get_to
func hmc_session_get_to(h C.uint64_t, ip *C.char, port C.int, dst unsafe.Pointer, n, remoteOff C.uint64_t, conn, timeoutMS C.int) C.int {
	return withSession(h, func(s *hmc.Session) error {
		b, err := hostBytes(dst, n)
		if err != nil {
			return err
		}
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		return peerAt(s, ip, port, conn).GetTo(ctx, b, uint64(remoteOff))
	})
}

//export hmc_session_get
func hmc_session_get(h C.uint64_t, ip *C.char, port C.int, localOff, remoteOff, n C.uint64_t, conn, timeoutMS C.int) C.int {
	return withSession(h, func(s *hmc.Session) error {
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		return peerAt(s, ip, port, conn).Get(ctx, uint64(localOff), uint64(remoteOff), uint64(n))
	})
}

//export hmc_session_put_nb
func hmc_session_put_nb(h C.uint64_t, ip *C.char, port C.int, localOff, remoteOff, n C.uint64_t, conn C.int, id *C.uint64_t) C.int {
	return postNB(true, h, ip, port, localOff, remoteOff, n, conn, id)
}

//export hmc_session_get_nb
func hmc_session_get_nb(h C.uint64_t, ip *C.char, port C.int, localOff, remoteOff, n C.uint64_t, conn C.int, id *C.uint64_t) C.int {
	return postNB(false, h, ip, port, localOff, remoteOff, n, conn, id)
}

func postNB(put bool, h C.uint64_t, ip *C.char, port C.int, localOff, remoteOff, n C.uint64_t, conn C.int, id *C.uint64_t) C.int {
	return withSession(h, func(s *hmc.Session) error {
		if id == nil {
			return fmt.Errorf("hmc: null id pointer: %w", status.ErrInvalidConfig)
		}
		var (
			v   uint64
			err error
		)
		if put {
			v, err = peerAt(s, ip, port, conn).PutNB(context.Background(), uint64(localOff), uint64(remoteOff), uint64(n))
		} else {
			v, err = peerAt(s, ip, port, conn).GetNB(context.Background(), uint64(localOff), uint64(remoteOff), uint64(n))
		}
		if err != nil {
			return err
		}
		*id = C.uint64_t(v)
		return nil
	})
}

//export hmc_session_wait
func hmc_session_wait(h C.uint64_t, ids *C.uint64_t, count C.uint64_t, timeoutMS C.int) C.int {
	return withSession(h, func(s *hmc.Session) error {
		if count > 0 && ids == nil {
			return fmt.Errorf("hmc: null id array: %w", status.ErrInvalidConfig)
		}
		list := make([]uint64, count)
		if count > 0 {
			for i, v := range unsafe.Slice((*C.uint64_t)(ids), int(count)) {
				list[i] = uint64(v)
			}
		}
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		return s.Wait(ctx, list...)
	})
}

//export hmc_session_put_pipeline
func hmc_session_put_pipeline(h C.uint64_t, ip *C.char, port C.int, localOff, remoteOff, n, chunk C.uint64_t, maxInflight, conn, timeoutMS C.int) C.int {
	return pipeline(true, h, ip, port, localOff, remoteOff, n, chunk, maxInflight, conn, timeoutMS)
}

//export hmc_session_get_pipeline
func hmc_session_get_pipeline(h C.uint64_t, ip *C.char, port C.int, localOff, remoteOff, n, chunk C.uint64_t, maxInflight, conn, timeoutMS C.int) C.int {
	return pipeline(false, h, ip, port, localOff, remoteOff, n, chunk, maxInflight, conn, timeoutMS)
}

func pipeline(put bool, h C.uint64_t, ip *C.char, port C.int, localOff, remoteOff, n, chunk C.uint64_t, maxInflight, conn, timeoutMS C.int) C.int {
	return withSession(h, func(s *hmc.Session) error {
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		p := peerAt(s, ip, port, conn)
		f := p.GetPipeline
		if put {
			f = p.PutPipeline
		}
		return f(ctx, uint64(localOff), uint64(remoteOff), uint64(n), uint64(chunk), int(maxInflight))
	})
}

func streamData(p C.uint64_t, n C.uint64_t, memType, deviceID C.int) comm.Data {
	t := memory.Type(memType)
	if t == memory.Default {
		t = memory.CPU
	}
	return comm.DeviceData(memory.Ptr(p), uint64(n), t, int(deviceID))
}

//export hmc_session_send_data
func hmc_session_send_data(h C.uint64_t, ip *C.char, port C.int, src C.uint64_t, n C.uint64_t, memType, deviceID, conn, timeoutMS C.int) C.int {
	return withSession(h, func(s *hmc.Session) error {
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		return peerAt(s, ip, port, conn).SendDataTo(ctx, streamData(src, n, memType, deviceID))
	})
}

//export hmc_session_recv_data
func hmc_session_recv_data(h C.uint64_t, ip *C.char, port C.int, dst C.uint64_t, capacity C.uint64_t, memType, deviceID C.int, received *C.uint64_t, conn, timeoutMS C.int) C.int {
	return withSession(h, func(s *hmc.Session) error {
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		got, err := peerAt(s, ip, port, conn).RecvDataFrom(ctx, streamData(dst, capacity, memType, deviceID))
		if received != nil {
			*received = C.uint64_t(got)
		}
		return err
	})
}

//export hmc_session_ctrl_send
func hmc_session_ctrl_send(h C.uint64_t, peer C.uint32_t, tag C.uint64_t, timeoutMS C.int) C.int {
	return withSession(h, func(s *hmc.Session) error {
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		return s.CtrlSend(ctx, uint32(peer), uint64(tag))
	})
}

//export hmc_session_ctrl_recv
func hmc_session_ctrl_recv(h C.uint64_t, peer C.uint32_t, tag *C.uint64_t, timeoutMS C.int) C.int {
	return withSession(h, func(s *hmc.Session) error {
		if tag == nil {
			return fmt.Errorf("hmc: null tag pointer: %w", status.ErrInvalidConfig)
		}
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		v, err := s.CtrlRecv(ctx, uint32(peer))
		if err != nil {
			return err
		}
		*tag = C.uint64_t(v)
		return nil
	})
}

//export hmc_session_ctrl_send_bytes
func hmc_session_ctrl_send_bytes(h C.uint64_t, peer C.uint32_t, msgType C.uint16_t, data unsafe.Pointer, n C.uint64_t, timeoutMS C.int) C.int {
	return withSession(h, func(s *hmc.Session) error {
		b, err := hostBytes(data, n)
		if err != nil {
			return err
		}
		t, err := ctrlType(uint16(msgType))
		if err != nil {
			return err
		}
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		return s.Comm().Ctrl().Send(ctx, uint32(peer), t, 0, b)
	})
}

//export hmc_session_ctrl_recv_bytes
func hmc_session_ctrl_recv_bytes(h C.uint64_t, peer C.uint32_t, msgType *C.uint16_t, buf unsafe.Pointer, capacity C.uint64_t, n *C.uint64_t, timeoutMS C.int) C.int {
	return withSession(h, func(s *hmc.Session) error {
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		msg, err := s.Comm().Ctrl().Recv(ctx, uint32(peer))
		if err != nil {
			return err
		}
		if n != nil {
			*n = C.uint64_t(len(msg.Payload))
		}
		if msgType != nil {
			*msgType = C.uint16_t(msg.Type)
		}
		if uint64(len(msg.Payload)) > uint64(capacity) {
			return fmt.Errorf("hmc: message of %d bytes, buffer of %d (message dropped): %w", len(msg.Payload), uint64(capacity), status.ErrInvalidConfig)
		}
		dst, err := hostBytes(buf, C.uint64_t(len(msg.Payload)))
		if err != nil {
			return err
		}
		copy(dst, msg.Payload)
		return nil
	})
}

// ---- the Session's buffer ----

//export hmc_buffer_size
func hmc_buffer_size(h C.uint64_t) C.uint64_t {
	s, err := session(h)
	if err != nil {
		setError(err.Error())
		return 0
	}
	return C.uint64_t(s.Buffer().Size())
}

//export hmc_buffer_ptr
func hmc_buffer_ptr(h C.uint64_t) C.uint64_t {
	s, err := session(h)
	if err != nil {
		setError(err.Error())
		return 0
	}
	return C.uint64_t(s.Buffer().Ptr())
}

//export hmc_buffer_write
func hmc_buffer_write(h C.uint64_t, src unsafe.Pointer, n, off C.uint64_t) C.int {
	return withSession(h, func(s *hmc.Session) error {
		b, err := hostBytes(src, n)
		if err != nil {
			return err
		}
		return s.Buffer().WriteFromCPU(b, uint64(off))
	})
}

//export hmc_buffer_read
func hmc_buffer_read(h C.uint64_t, dst unsafe.Pointer, n, off C.uint64_t) C.int {
	return withSession(h, func(s *hmc.Session) error {
		b, err := hostBytes(dst, n)
		if err != nil {
			return err
		}
		return s.Buffer().ReadToCPU(b, uint64(off))
	})
}

//export hmc_buffer_write_gpu
func hmc_buffer_write_gpu(h C.uint64_t, src, n, off C.uint64_t) C.int {
	return withSession(h, func(s *hmc.Session) error {
		return s.Buffer().WriteFromGPU(memory.Ptr(src), uint64(n), uint64(off))
	})
}

//export hmc_buffer_read_gpu
func hmc_buffer_read_gpu(h C.uint64_t, dst, n, off C.uint64_t) C.int {
	return withSession(h, func(s *hmc.Session) error {
		return s.Buffer().ReadToGPU(memory.Ptr(dst), uint64(n), uint64(off))
	})
}

//export hmc_buffer_copy_within
func hmc_buffer_copy_within(h C.uint64_t, dstOff, srcOff, n C.uint64_t) C.int {
	return withSession(h, func(s *hmc.Session) error {
		return s.CopyWithin(uint64(dstOff), uint64(srcOff), uint64(n))
	})
}

// deviceMemories caches one Memory per (type, device) for copies between device memory and a
// host ConnBuffer; they live as long as the process.
var deviceMemories sync.Map

func deviceMemory(t memory.Type, dev int) (*memory.Memory, error) {
	key := [2]int{int(t), dev}
	if m, ok := deviceMemories.Load(key); ok {
		return m.(*memory.Memory), nil
	}
	m, err := memory.New(dev, t)
	if err != nil {
		return nil, err
	}
	if prev, loaded := deviceMemories.LoadOrStore(key, m); loaded {
		_ = m.Close() // another thread won; it allocated nothing
		return prev.(*memory.Memory), nil
	}
	return m, nil
}

// deviceCopy copies n bytes between device address p (memory type mt on device dev) and the
// session's buffer at off: device to device when the buffer lives on that device, through the
// host when the buffer is host memory (HMC's g2h2g).
func deviceCopy(h C.uint64_t, p, n, off C.uint64_t, mt, dev C.int, write bool) error {
	s, err := session(h)
	if err != nil {
		return err
	}
	buf, t := s.Buffer(), memory.Type(mt)
	if t == buf.Type() && int(dev) == buf.DeviceID() {
		if write {
			return buf.WriteFromGPU(memory.Ptr(p), uint64(n), uint64(off))
		}
		return buf.ReadToGPU(memory.Ptr(p), uint64(n), uint64(off))
	}
	// Any other pair (a CPU buffer, another device): one copy by unified addressing.
	if err := buf.Check(uint64(off), uint64(n)); err != nil {
		return err
	}
	at := buf.Ptr() + memory.Ptr(off)
	if write {
		return memory.Copy(at, memory.Ptr(p), uint64(n))
	}
	return memory.Copy(memory.Ptr(p), at, uint64(n))
}

//export hmc_buffer_write_device
func hmc_buffer_write_device(h C.uint64_t, src, n, off C.uint64_t, memType, deviceID C.int) C.int {
	return call(func() error { return deviceCopy(h, src, n, off, memType, deviceID, true) })
}

//export hmc_buffer_read_device
func hmc_buffer_read_device(h C.uint64_t, dst, n, off C.uint64_t, memType, deviceID C.int) C.int {
	return call(func() error { return deviceCopy(h, dst, n, off, memType, deviceID, false) })
}

// ---- collectives ----

//export hmc_group_create
func hmc_group_create(h C.uint64_t, n C.int, ips **C.char, dataPorts, ctrlPorts *C.int, rank C.uint32_t, conn, timeoutMS C.int, out *C.uint64_t) C.int {
	return withSession(h, func(s *hmc.Session) error {
		if n <= 0 || ips == nil || dataPorts == nil || ctrlPorts == nil || out == nil {
			return fmt.Errorf("hmc: group of %d with null arrays: %w", int(n), status.ErrInvalidConfig)
		}
		ipv := unsafe.Slice(ips, int(n))
		dpv := unsafe.Slice(dataPorts, int(n))
		cpv := unsafe.Slice(ctrlPorts, int(n))
		members := make([]collective.Member, n)
		for i := range members {
			members[i] = collective.Member{Rank: uint32(i), IP: goString(ipv[i]), DataPort: int(dpv[i]), CtrlPort: int(cpv[i])}
		}
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		g, err := collective.New(ctx, s.Comm(), members, uint32(rank), hmc.ConnType(conn))
		if err != nil {
			return err
		}
		*out = C.uint64_t(cabi.Add(g))
		return nil
	})
}

//export hmc_group_alltoall
func hmc_group_alltoall(g C.uint64_t, algo C.int, sendOff, recvOff, scratchOff, block C.uint64_t, timeoutMS C.int) C.int {
	return call(func() error {
		grp, err := cabi.Get[*collective.Group](uint64(g))
		if err != nil {
			return err
		}
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		return grp.AllToAll(ctx, collective.Algo(algo), uint64(sendOff), uint64(recvOff), uint64(scratchOff), uint64(block))
	})
}

//export hmc_group_scratch_size
func hmc_group_scratch_size(world C.int, block C.uint64_t) C.uint64_t {
	if world < 1 {
		return 0
	}
	return C.uint64_t(collective.ScratchSize(int(world), uint64(block)))
}

//export hmc_group_destroy
func hmc_group_destroy(g C.uint64_t) C.int {
	return call(func() error {
		if _, err := cabi.Get[*collective.Group](uint64(g)); err != nil {
			return err
		}
		cabi.Remove(uint64(g))
		return nil
	})
}
