//go:build cgo

package hmcapi

/*
#include <stdint.h>
*/
import "C"

import (
	"fmt"
	"net"
	"strconv"
	"unsafe"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/capi/internal/cabi"
	"github.com/hmc-go/hmc/ctrl"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
)

// ---- ConnBuffer on its own ----

//export hmc_conn_buffer_create
func hmc_conn_buffer_create(deviceID C.int, size C.uint64_t, memType C.int, out *C.uint64_t) C.int {
	return call(func() error {
		if out == nil {
			return fmt.Errorf("hmc: null out handle: %w", status.ErrInvalidConfig)
		}
		b, err := buffer.New(int(deviceID), uint64(size), memory.Type(memType))
		if err != nil {
			return err
		}
		*out = C.uint64_t(cabi.Add(b))
		return nil
	})
}

// withBuffer runs f on the ConnBuffer behind handle h, as call does.
func withBuffer(h C.uint64_t, f func(*buffer.ConnBuffer) error) C.int {
	return call(func() error {
		b, err := cabi.Get[*buffer.ConnBuffer](uint64(h))
		if err != nil {
			return err
		}
		return f(b)
	})
}

//export hmc_conn_buffer_destroy
func hmc_conn_buffer_destroy(h C.uint64_t) C.int {
	return withBuffer(h, func(b *buffer.ConnBuffer) error {
		cabi.Remove(uint64(h))
		return b.Close()
	})
}

//export hmc_conn_buffer_info
func hmc_conn_buffer_info(h C.uint64_t, size, ptr *C.uint64_t, memType *C.int) C.int {
	return withBuffer(h, func(b *buffer.ConnBuffer) error {
		if size != nil {
			*size = C.uint64_t(b.Size())
		}
		if ptr != nil {
			*ptr = C.uint64_t(b.Ptr())
		}
		if memType != nil {
			*memType = C.int(b.Type())
		}
		return nil
	})
}

//export hmc_conn_buffer_write_cpu
func hmc_conn_buffer_write_cpu(h C.uint64_t, src unsafe.Pointer, n, off C.uint64_t) C.int {
	return withBuffer(h, func(b *buffer.ConnBuffer) error {
		s, err := hostBytes(src, n)
		if err != nil {
			return err
		}
		return b.WriteFromCPU(s, uint64(off))
	})
}

//export hmc_conn_buffer_read_cpu
func hmc_conn_buffer_read_cpu(h C.uint64_t, dst unsafe.Pointer, n, off C.uint64_t) C.int {
	return withBuffer(h, func(b *buffer.ConnBuffer) error {
		d, err := hostBytes(dst, n)
		if err != nil {
			return err
		}
		return b.ReadToCPU(d, uint64(off))
	})
}

//export hmc_conn_buffer_write_gpu
func hmc_conn_buffer_write_gpu(h C.uint64_t, src, n, off C.uint64_t) C.int {
	return withBuffer(h, func(b *buffer.ConnBuffer) error {
		return b.WriteFromGPU(memory.Ptr(src), uint64(n), uint64(off))
	})
}

//export hmc_conn_buffer_read_gpu
func hmc_conn_buffer_read_gpu(h C.uint64_t, dst, n, off C.uint64_t) C.int {
	return withBuffer(h, func(b *buffer.ConnBuffer) error {
		return b.ReadToGPU(memory.Ptr(dst), uint64(n), uint64(off))
	})
}

//export hmc_conn_buffer_copy_within
func hmc_conn_buffer_copy_within(h C.uint64_t, dstOff, srcOff, n C.uint64_t) C.int {
	return withBuffer(h, func(b *buffer.ConnBuffer) error {
		return b.CopyWithin(uint64(dstOff), uint64(srcOff), uint64(n))
	})
}

// ---- the control plane on its own (upstream CtrlSocketManager, one per handle) ----

func manager(h C.uint64_t) (*ctrl.Manager, error) { return cabi.Get[*ctrl.Manager](uint64(h)) }

// withManager runs f on the control plane behind handle h, as call does.
func withManager(h C.uint64_t, f func(*ctrl.Manager) error) C.int {
	return call(func() error {
		m, err := manager(h)
		if err != nil {
			return err
		}
		return f(m)
	})
}

//export hmc_ctrl_create
func hmc_ctrl_create(out *C.uint64_t) C.int {
	return call(func() error {
		if out == nil {
			return fmt.Errorf("hmc: null out handle: %w", status.ErrInvalidConfig)
		}
		m, err := ctrl.New(ctrl.Config{})
		if err != nil {
			return err
		}
		*out = C.uint64_t(cabi.Add(m))
		return nil
	})
}

//export hmc_ctrl_listen
func hmc_ctrl_listen(h C.uint64_t, bindIP *C.char, tcpPort C.int, udsPath *C.char) C.int {
	return withManager(h, func(m *ctrl.Manager) error {
		return m.Listen(goString(bindIP), int(tcpPort), goString(udsPath))
	})
}

//export hmc_ctrl_tcp_port
func hmc_ctrl_tcp_port(h C.uint64_t) C.int {
	m, err := manager(h)
	if err != nil {
		setError(err.Error())
		return -1
	}
	if a := m.TCPAddr(); a != nil {
		return C.int(a.Port)
	}
	return 0
}

//export hmc_ctrl_connect_tcp
func hmc_ctrl_connect_tcp(h C.uint64_t, peerID C.uint32_t, ip *C.char, port C.int, selfID C.uint32_t, timeoutMS C.int) C.int {
	return withManager(h, func(m *ctrl.Manager) error {
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		return m.DialTCP(ctx, uint32(peerID), uint32(selfID), net.JoinHostPort(goString(ip), strconv.Itoa(int(port))))
	})
}

//export hmc_ctrl_connect_uds
func hmc_ctrl_connect_uds(h C.uint64_t, peerID C.uint32_t, path *C.char, selfID C.uint32_t, timeoutMS C.int) C.int {
	return withManager(h, func(m *ctrl.Manager) error {
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		return m.DialUDS(ctx, uint32(peerID), uint32(selfID), goString(path))
	})
}

//export hmc_ctrl_send_u64
func hmc_ctrl_send_u64(h C.uint64_t, peer C.uint32_t, v C.uint64_t, timeoutMS C.int) C.int {
	return withManager(h, func(m *ctrl.Manager) error {
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		return m.SendU64(ctx, uint32(peer), uint64(v))
	})
}

//export hmc_ctrl_recv_u64
func hmc_ctrl_recv_u64(h C.uint64_t, peer C.uint32_t, v *C.uint64_t, timeoutMS C.int) C.int {
	return withManager(h, func(m *ctrl.Manager) error {
		if v == nil {
			return fmt.Errorf("hmc: null value pointer: %w", status.ErrInvalidConfig)
		}
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		x, err := m.RecvU64(ctx, uint32(peer))
		*v = C.uint64_t(x)
		return err
	})
}

//export hmc_ctrl_send_int
func hmc_ctrl_send_int(h C.uint64_t, peer C.uint32_t, v C.int32_t, timeoutMS C.int) C.int {
	return withManager(h, func(m *ctrl.Manager) error {
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		return m.SendInt(ctx, uint32(peer), int32(v))
	})
}

//export hmc_ctrl_recv_int
func hmc_ctrl_recv_int(h C.uint64_t, peer C.uint32_t, v *C.int32_t, timeoutMS C.int) C.int {
	return withManager(h, func(m *ctrl.Manager) error {
		if v == nil {
			return fmt.Errorf("hmc: null value pointer: %w", status.ErrInvalidConfig)
		}
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		x, err := m.RecvInt(ctx, uint32(peer))
		*v = C.int32_t(x)
		return err
	})
}

//export hmc_ctrl_send_struct
func hmc_ctrl_send_struct(h C.uint64_t, peer C.uint32_t, data unsafe.Pointer, n C.uint64_t, timeoutMS C.int) C.int {
	return withManager(h, func(m *ctrl.Manager) error {
		b, err := hostBytes(data, n)
		if err != nil {
			return err
		}
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		return m.Send(ctx, uint32(peer), ctrl.TypeStruct, 0, b)
	})
}

//export hmc_ctrl_recv_struct
func hmc_ctrl_recv_struct(h C.uint64_t, peer C.uint32_t, data unsafe.Pointer, n C.uint64_t, timeoutMS C.int) C.int {
	return withManager(h, func(m *ctrl.Manager) error {
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		msg, err := m.Recv(ctx, uint32(peer))
		if err != nil {
			return err
		}
		if msg.Type != ctrl.TypeStruct || uint64(len(msg.Payload)) != uint64(n) {
			return fmt.Errorf("hmc: got type %#x with %d bytes, want a %d-byte struct: %w", msg.Type, len(msg.Payload), uint64(n), status.ErrProtocol)
		}
		b, err := hostBytes(data, n)
		if err != nil {
			return err
		}
		copy(b, msg.Payload)
		return nil
	})
}

//export hmc_ctrl_close_peer
func hmc_ctrl_close_peer(h C.uint64_t, peer C.uint32_t) C.int {
	return withManager(h, func(m *ctrl.Manager) error {
		return m.ClosePeer(uint32(peer))
	})
}

//export hmc_ctrl_close_all
func hmc_ctrl_close_all(h C.uint64_t) C.int {
	return withManager(h, func(m *ctrl.Manager) error {
		m.CloseAll()
		return nil
	})
}

//export hmc_ctrl_destroy
func hmc_ctrl_destroy(h C.uint64_t) C.int {
	return withManager(h, func(m *ctrl.Manager) error {
		cabi.Remove(uint64(h))
		return m.Close()
	})
}
