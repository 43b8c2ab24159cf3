//go:build cgo

package smemapi

/*
#include <stdint.h>
#include <stdbool.h>
#include <stdlib.h>
#include "../../include/smem/host/smem_trans_def.h" // types only: the exports declare the functions
#include "../../include/smem/host/smem_shm_def.h"

typedef void (*smem_exit_fn)(int);
static void smem_call_exit(smem_exit_fn f, int status) { f(status); }
*/
import "C"

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/hmc-go/hmc/capi/internal/cabi"
	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/fabric/shmem"
	"github.com/hmc-go/hmc/fabric/trans"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// ---- smem_trans ----

type transHandle struct {
	e   *trans.Engine
	srv *store.Server // the store this process started (startConfigServer)
}

//export smem_trans_config_init
func smem_trans_config_init(c *C.smem_trans_config_t) C.int32_t {
	if c == nil {
		return code(fmt.Errorf("smem: null config: %w", status.ErrInvalidConfig))
	}
	*c = C.smem_trans_config_t{role: C.SMEM_TRANS_SENDER, initTimeout: 120, deviceId: C.uint32_t(^uint32(0))}
	return smOK
}

//export smem_trans_init
func smem_trans_init(c *C.smem_trans_config_t) C.int32_t {
	if c == nil {
		return code(fmt.Errorf("smem: null config: %w", status.ErrInvalidConfig))
	}
	return smOK
}

//export smem_trans_uninit
func smem_trans_uninit(flags C.uint32_t) {}

//export smem_trans_create
func smem_trans_create(url, uid *C.char, c *C.smem_trans_config_t) unsafe.Pointer {
	var out unsafe.Pointer
	rc := guard(func() error {
		if url == nil || uid == nil || c == nil || C.GoString(url) == "" || C.GoString(uid) == "" {
			return fmt.Errorf("smem: trans create with empty arguments: %w", status.ErrInvalidConfig)
		}
		if c.role != C.SMEM_TRANS_SENDER && c.role != C.SMEM_TRANS_RECEIVER && c.role != C.SMEM_TRANS_BOTH {
			return fmt.Errorf("smem: trans role %d: %w", int(c.role), status.ErrInvalidConfig)
		}
		if c.dataOpType&(1|8) != 0 && c.dataOpType&(2|4) == 0 {
			return fmt.Errorf("smem: trans data op %d needs Ascend hardware: %w", int(c.dataOpType), status.ErrUnsupported)
		}
		h := &transHandle{}
		u := C.GoString(url)
		if bool(c.startConfigServer) && strings.HasPrefix(u, "tcp://") {
			if srv, err := store.Listen(u, store.ServerConfig{Logger: slog.New(logHandler{})}); err == nil {
				h.srv = srv
			}
		}
		cfg := trans.DefaultConfig()
		cfg.Role = trans.Role(c.role)
		cfg.Logger = slog.New(logHandler{})
		if c.initTimeout > 0 {
			cfg.Timeout = max(seconds(c.initTimeout), 30*time.Second)
		}
		if c.dataOpType&2 != 0 {
			cfg.Kinds = []transport.ConnType{transport.SHM, transport.UCX, transport.TCP}
		}
		cfg.UniqueID = C.GoString(uid)
		e, err := trans.Create(context.Background(), u, cfg)
		if err != nil && cfg.Kinds != nil && errors.Is(err, status.ErrUnsupported) {
			cfg.Kinds = nil // no UCX in this build: shared memory and TCP
			e, err = trans.Create(context.Background(), u, cfg)
		}
		if err != nil {
			if h.srv != nil {
				_ = h.srv.Close()
			}
			return err
		}
		h.e = e
		out = ptrHandle(h)
		return nil
	})
	if rc != smOK {
		return nil
	}
	return out
}

func transOf(p unsafe.Pointer) (*trans.Engine, error) {
	h, err := fromPtr[*transHandle](p)
	if err != nil {
		return nil, err
	}
	return h.e, nil
}

//export smem_trans_destroy
func smem_trans_destroy(p unsafe.Pointer, flags C.uint32_t) {
	guard(func() error {
		h, err := fromPtr[*transHandle](p)
		if err != nil {
			return err
		}
		cabi.Remove(uint64(uintptr(p)))
		err = h.e.Close()
		if h.srv != nil {
			err = errors.Join(err, h.srv.Close())
		}
		return err
	})
}

//export smem_trans_malloc
func smem_trans_malloc(p unsafe.Pointer, capacity C.size_t) unsafe.Pointer {
	var out uint64
	if guard(func() error {
		e, err := transOf(p)
		if err == nil {
			out, err = e.Malloc(uint64(capacity))
		}
		return err
	}) != smOK {
		return nil
	}
	return unsafe.Pointer(unsafe.SliceData(memory.HostSlice(memory.Ptr(out), 1)))
}

//export smem_trans_free
func smem_trans_free(p, addr unsafe.Pointer) C.int32_t {
	return guard(func() error {
		e, err := transOf(p)
		if err != nil {
			return err
		}
		return e.Free(context.Background(), uint64(uintptr(addr)))
	})
}

//export smem_trans_register_mem
func smem_trans_register_mem(p, addr unsafe.Pointer, capacity C.size_t, flags C.uint32_t) C.int32_t {
	return guard(func() error {
		e, err := transOf(p)
		if err != nil {
			return err
		}
		return e.Register(uint64(uintptr(addr)), uint64(capacity))
	})
}

//export smem_trans_batch_register_mem
func smem_trans_batch_register_mem(p unsafe.Pointer, addrs *unsafe.Pointer, caps *C.size_t, n, flags C.uint32_t) C.int32_t {
	return guard(func() error {
		e, err := transOf(p)
		if err != nil {
			return err
		}
		if addrs == nil || caps == nil || n == 0 {
			return fmt.Errorf("smem: batch register of %d: %w", uint32(n), status.ErrInvalidConfig)
		}
		a := unsafe.Slice((*uintptr)(unsafe.Pointer(addrs)), int(n))
		c := unsafe.Slice((*uint64)(unsafe.Pointer(caps)), int(n))
		bufs := make([]trans.Buffer, n)
		for i := range bufs {
			bufs[i] = trans.Buffer{Addr: uint64(a[i]), Size: c[i]}
		}
		return e.BatchRegister(bufs)
	})
}

//export smem_trans_deregister_mem
func smem_trans_deregister_mem(p, addr unsafe.Pointer) C.int32_t {
	return guard(func() error {
		e, err := transOf(p)
		if err != nil {
			return err
		}
		return e.Deregister(context.Background(), uint64(uintptr(addr)))
	})
}

func transfer(p unsafe.Pointer, op trans.Opcode, peer *C.char, locals, remotes *unsafe.Pointer, sizes *C.size_t, n C.uint32_t) C.int32_t {
	return guard(func() error {
		e, err := transOf(p)
		if err != nil {
			return err
		}
		if peer == nil || locals == nil || remotes == nil || sizes == nil || n == 0 {
			return fmt.Errorf("smem: transfer with null arguments: %w", status.ErrInvalidConfig)
		}
		l := unsafe.Slice((*uintptr)(unsafe.Pointer(locals)), int(n))
		r := unsafe.Slice((*uintptr)(unsafe.Pointer(remotes)), int(n))
		s := unsafe.Slice((*uint64)(unsafe.Pointer(sizes)), int(n))
		reqs := make([]trans.Request, n)
		for i := range reqs {
			reqs[i] = trans.Request{Op: op, Local: uint64(l[i]), Remote: uint64(r[i]), Size: s[i]}
		}
		return e.Transfer(context.Background(), C.GoString(peer), reqs, nil)
	})
}

//export smem_trans_write
func smem_trans_write(p, src unsafe.Pointer, peer *C.char, dst unsafe.Pointer, size C.size_t, flags C.uint32_t) C.int32_t {
	l, r, s := src, dst, size
	return transfer(p, trans.Write, peer, &l, &r, &s, 1)
}

//export smem_trans_batch_write
func smem_trans_batch_write(p unsafe.Pointer, srcs *unsafe.Pointer, peer *C.char, dsts *unsafe.Pointer, sizes *C.size_t, n, flags C.uint32_t) C.int32_t {
	return transfer(p, trans.Write, peer, srcs, dsts, sizes, n)
}

//export smem_trans_read
func smem_trans_read(p, local unsafe.Pointer, peer *C.char, remote unsafe.Pointer, size C.size_t, flags C.uint32_t) C.int32_t {
	l, r, s := local, remote, size
	return transfer(p, trans.Read, peer, &l, &r, &s, 1)
}

//export smem_trans_batch_read
func smem_trans_batch_read(p unsafe.Pointer, locals *unsafe.Pointer, peer *C.char, remotes *unsafe.Pointer, sizes *C.size_t, n, flags C.uint32_t) C.int32_t {
	return transfer(p, trans.Read, peer, locals, remotes, sizes, n)
}

// submit is the _submit forms: upstream enqueues the transfer on the caller's Ascend ACL
// stream. Here a stream is a device stream (a CUstream or hipStream_t, or the GPU emulation's):
// the transfer waits for the work queued on it, then runs, and is complete on return (so work
// queued on the stream afterwards comes after it, as upstream's); with no stream (NULL) it runs
// at once.
func submit(stream unsafe.Pointer, p unsafe.Pointer, op trans.Opcode, peer *C.char, locals, remotes *unsafe.Pointer, sizes *C.size_t, n C.uint32_t) C.int32_t {
	if stream != nil {
		pl := memory.HostPlace
		if n > 0 && locals != nil {
			if first := *locals; first != nil {
				var err error
				if pl, err = memory.Locate(memory.Ptr(uintptr(first))); err != nil {
					return code(fmt.Errorf("smem: submit: %w", err))
				}
			}
		}
		if err := memory.SyncStream(uintptr(stream), pl); err != nil {
			return code(fmt.Errorf("smem: submit: waiting for stream %p: %w", stream, err))
		}
	}
	return transfer(p, op, peer, locals, remotes, sizes, n)
}

//export smem_trans_write_submit
func smem_trans_write_submit(p, src unsafe.Pointer, peer *C.char, dst unsafe.Pointer, size C.size_t, stream unsafe.Pointer, flags C.uint32_t) C.int32_t {
	l, r, s := src, dst, size
	return submit(stream, p, trans.Write, peer, &l, &r, &s, 1)
}

//export smem_trans_read_submit
func smem_trans_read_submit(p, local unsafe.Pointer, peer *C.char, remote unsafe.Pointer, size C.size_t, stream unsafe.Pointer, flags C.uint32_t) C.int32_t {
	l, r, s := local, remote, size
	return submit(stream, p, trans.Read, peer, &l, &r, &s, 1)
}

//export smem_trans_batch_write_submit
func smem_trans_batch_write_submit(p unsafe.Pointer, srcs *unsafe.Pointer, peer *C.char, dsts *unsafe.Pointer, sizes *C.size_t, n C.uint32_t, stream unsafe.Pointer, flags C.uint32_t) C.int32_t {
	return submit(stream, p, trans.Write, peer, srcs, dsts, sizes, n)
}

//export smem_trans_batch_read_submit
func smem_trans_batch_read_submit(p unsafe.Pointer, locals *unsafe.Pointer, peer *C.char, remotes *unsafe.Pointer, sizes *C.size_t, n C.uint32_t, stream unsafe.Pointer, flags C.uint32_t) C.int32_t {
	return submit(stream, p, trans.Read, peer, locals, remotes, sizes, n)
}

// ---- smem_shm ----

var shmState struct {
	mu    sync.Mutex
	world *shmem.World
}

type shmHandle struct {
	h      *shmem.Heap
	mu     sync.Mutex
	rounds map[string]int // sub-group rounds by key
	exit   func()
}

//export smem_shm_config_init
func smem_shm_config_init(c *C.smem_shm_config_t) C.int32_t {
	if c == nil {
		return code(fmt.Errorf("smem: null config: %w", status.ErrInvalidConfig))
	}
	*c = C.smem_shm_config_t{shmInitTimeout: 120, shmCreateTimeout: 120, controlOperationTimeout: 120, startConfigStoreServer: true}
	return smOK
}

//export smem_shm_init
func smem_shm_init(url *C.char, worldSize, rankID C.uint32_t, deviceID C.uint16_t, c *C.smem_shm_config_t) C.int32_t {
	return guard(func() error {
		if url == nil || c == nil {
			return fmt.Errorf("smem: shm init with null arguments: %w", status.ErrInvalidConfig)
		}
		shmState.mu.Lock()
		defer shmState.mu.Unlock()
		if shmState.world != nil {
			return nil // idempotent
		}
		cfg := shmem.DefaultConfig()
		cfg.InitTimeout, cfg.ControlTimeout = seconds(c.shmInitTimeout), seconds(c.controlOperationTimeout)
		cfg.StartStore = bool(c.startConfigStoreServer)
		cfg.Logger = slog.New(logHandler{})
		cfg.World, cfg.Rank, cfg.Device = int(worldSize), int(rankID), int(deviceID)
		w, err := shmem.Init(context.Background(), C.GoString(url), cfg)
		if err != nil {
			return err
		}
		shmState.world = w
		return nil
	})
}

//export smem_shm_uninit
func smem_shm_uninit(flags C.uint32_t) {
	shmState.mu.Lock()
	w := shmState.world
	shmState.world = nil
	shmState.mu.Unlock()
	if w != nil {
		_ = w.Close()
	}
}

//export smem_shm_query_support_data_operation
func smem_shm_query_support_data_operation() C.uint32_t {
	return C.uint32_t(shmem.QuerySupportDataOperation())
}

func shmWorld() (*shmem.World, error) {
	shmState.mu.Lock()
	defer shmState.mu.Unlock()
	if shmState.world == nil {
		return nil, fmt.Errorf("smem: smem_shm_init has not run: %w", status.ErrInvalidConfig)
	}
	return shmState.world, nil
}

//export smem_shm_create
func smem_shm_create(id, rankSize, rankID C.uint32_t, size C.uint64_t, op C.smem_shm_data_op_type, flags C.uint32_t, gva *unsafe.Pointer) unsafe.Pointer {
	var out unsafe.Pointer
	if guard(func() error {
		w, err := shmWorld()
		if err != nil {
			return err
		}
		if gva == nil || int(rankSize) != w.Size() || int(rankID) != w.Rank() {
			return fmt.Errorf("smem: shm create: rank %d of %d in a world where this is rank %d of %d: %w",
				uint32(rankID), uint32(rankSize), w.Rank(), w.Size(), status.ErrInvalidConfig)
		}
		h, err := w.Create(context.Background(), int(id), uint64(size))
		if err != nil {
			return err
		}
		*gva = unsafe.Pointer(unsafe.SliceData(memory.HostSlice(memory.Ptr(h.Base()), 1)))
		out = ptrHandle(&shmHandle{h: h, rounds: map[string]int{}})
		return nil
	}) != smOK {
		return nil
	}
	return out
}

func shmOf(p unsafe.Pointer) (*shmHandle, error) { return fromPtr[*shmHandle](p) }

// onShm runs f with the heap behind handle p and the world, as an export's body.
func onShm(p unsafe.Pointer, f func(sh *shmHandle, w *shmem.World) error) C.int32_t {
	return guard(func() error {
		sh, err := shmOf(p)
		if err != nil {
			return err
		}
		w, err := shmWorld()
		if err != nil {
			return err
		}
		return f(sh, w)
	})
}

//export smem_shm_destroy
func smem_shm_destroy(p unsafe.Pointer, flags C.uint32_t) C.int32_t {
	return guard(func() error {
		sh, err := shmOf(p)
		if err != nil {
			return err
		}
		cabi.Remove(uint64(uintptr(p)))
		if sh.exit != nil {
			sh.exit()
		}
		return sh.h.Destroy(context.Background())
	})
}

//export smem_shm_set_extra_context
func smem_shm_set_extra_context(p, ctx unsafe.Pointer, size C.uint32_t) C.int32_t {
	return onShm(p, func(sh *shmHandle, w *shmem.World) error {
		b, err := cabi.HostBytes(ctx, uint64(size))
		if err != nil {
			return err
		}
		return w.SetExtraContext(b)
	})
}

//export smem_shm_get_global_rank
func smem_shm_get_global_rank(p unsafe.Pointer) C.uint32_t {
	sh, err := shmOf(p)
	if err != nil {
		code(err)
		return C.uint32_t(^uint32(0))
	}
	return C.uint32_t(sh.h.Rank())
}

//export smem_shm_get_global_rank_size
func smem_shm_get_global_rank_size(p unsafe.Pointer) C.uint32_t {
	sh, err := shmOf(p)
	if err != nil {
		code(err)
		return C.uint32_t(^uint32(0))
	}
	return C.uint32_t(sh.h.NumRanks())
}

//export smem_shm_control_barrier
func smem_shm_control_barrier(p unsafe.Pointer) C.int32_t {
	return onShm(p, func(sh *shmHandle, w *shmem.World) error {
		return w.ControlBarrier(context.Background())
	})
}

//export smem_shm_control_allgather
func smem_shm_control_allgather(p unsafe.Pointer, send *C.char, sendSize C.uint32_t, recv *C.char, recvSize C.uint32_t) C.int32_t {
	return onShm(p, func(sh *shmHandle, w *shmem.World) error {
		if uint64(recvSize) != uint64(sendSize)*uint64(w.Size()) {
			return fmt.Errorf("smem: allgather receive size %d, want %d × %d: %w", uint32(recvSize), uint32(sendSize), w.Size(), status.ErrInvalidConfig)
		}
		in, err := cabi.HostBytes(unsafe.Pointer(send), uint64(sendSize))
		if err != nil {
			return err
		}
		out, err := cabi.HostBytes(unsafe.Pointer(recv), uint64(recvSize))
		if err != nil {
			return err
		}
		all, err := w.ControlAllGather(context.Background(), in)
		if err != nil {
			return err
		}
		copy(out, all)
		return nil
	})
}

// subRound starts the next round of sub-group key and returns its store prefix.
func (sh *shmHandle) subRound(key string) string {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.rounds[key]++
	return "SHM_SUB/" + key + "/" + strconv.Itoa(sh.rounds[key]) + "/"
}

// subgroup runs one round of a keyed sub-group over the store (upstream's algorithm): each
// member adds its arrival (and appends [u32 rank | data]); the member that completes the count
// sets the done key; all wait for it.
func subgroup(p unsafe.Pointer, key *C.char, rankSize, rankID C.uint32_t, data []byte) ([][]byte, error) {
	sh, err := shmOf(p)
	if err != nil {
		return nil, err
	}
	w, err := shmWorld()
	if err != nil {
		return nil, err
	}
	k := C.GoString(key)
	if k == "" || len(k) >= 64 || rankSize == 0 || int(rankSize) > w.Size() || rankID >= rankSize {
		return nil, fmt.Errorf("smem: sub-group %q rank %d of %d: %w", k, uint32(rankID), uint32(rankSize), status.ErrInvalidConfig)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	kv, pre := w.Store(), sh.subRound(k)
	if data != nil {
		rec := binary.LittleEndian.AppendUint32(nil, uint32(rankID))
		if _, err := kv.Append(ctx, pre+"data", append(rec, data...)); err != nil {
			return nil, err
		}
	}
	n, err := kv.Add(ctx, pre+"arrive", 1)
	if err != nil {
		return nil, err
	}
	if n == int64(rankSize) {
		if err := kv.Set(ctx, pre+"done", []byte("ok")); err != nil {
			return nil, err
		}
	}
	if _, err := kv.Get(ctx, pre+"done", store.Forever); err != nil {
		return nil, err
	}
	if data == nil {
		return nil, nil
	}
	raw, err := kv.Get(ctx, pre+"data", 0)
	if err != nil {
		return nil, err
	}
	rec := 4 + len(data)
	if len(raw) != rec*int(rankSize) {
		return nil, fmt.Errorf("smem: sub-group %q gathered %d bytes, want %d: %w", k, len(raw), rec*int(rankSize), status.ErrInvalidConfig)
	}
	parts := make([][]byte, 0, rankSize)
	for i := 0; i < len(raw); i += rec {
		parts = append(parts, raw[i:i+rec])
	}
	sort.Slice(parts, func(a, b int) bool {
		return binary.LittleEndian.Uint32(parts[a]) < binary.LittleEndian.Uint32(parts[b])
	})
	for i := range parts {
		parts[i] = parts[i][4:]
	}
	return parts, nil
}

//export smem_shm_subgroup_barrier
func smem_shm_subgroup_barrier(p unsafe.Pointer, key *C.char, rankSize, rankID C.uint32_t) C.int32_t {
	return guard(func() error {
		_, err := subgroup(p, key, rankSize, rankID, nil)
		return err
	})
}

//export smem_shm_subgroup_allgather
func smem_shm_subgroup_allgather(p unsafe.Pointer, key *C.char, rankSize, rankID C.uint32_t, send *C.char, sendSize C.uint32_t, recv *C.char, recvSize C.uint32_t) C.int32_t {
	return guard(func() error {
		if sendSize == 0 || uint64(recvSize) != uint64(sendSize)*uint64(rankSize) {
			return fmt.Errorf("smem: sub-group allgather sizes %d and %d for %d ranks: %w", uint32(sendSize), uint32(recvSize), uint32(rankSize), status.ErrInvalidConfig)
		}
		in, err := cabi.HostBytes(unsafe.Pointer(send), uint64(sendSize))
		if err != nil {
			return err
		}
		out, err := cabi.HostBytes(unsafe.Pointer(recv), uint64(recvSize))
		if err != nil {
			return err
		}
		parts, err := subgroup(p, key, rankSize, rankID, in)
		if err != nil {
			return err
		}
		for i, part := range parts {
			copy(out[i*len(in):], part)
		}
		return nil
	})
}

//export smem_shm_topology_can_reach
func smem_shm_topology_can_reach(p unsafe.Pointer, remote C.uint32_t, info *C.uint32_t) C.int32_t {
	return guard(func() error {
		sh, err := shmOf(p)
		if err != nil {
			return err
		}
		if info == nil {
			return fmt.Errorf("smem: null reach info: %w", status.ErrInvalidConfig)
		}
		ops, err := sh.h.TopologyCanReach(int(remote))
		if err != nil {
			return err
		}
		*info = C.uint32_t(ops)
		return nil
	})
}

//export smem_shm_atomic_alloc_value
func smem_shm_atomic_alloc_value(p unsafe.Pointer, limit C.uint32_t, out *C.uint32_t) C.int32_t {
	return onShm(p, func(sh *shmHandle, w *shmem.World) error {
		if out == nil {
			return fmt.Errorf("smem: null output: %w", status.ErrInvalidConfig)
		}
		n, err := w.AllocNumber(context.Background(), int(limit))
		if err != nil {
			return err
		}
		*out = C.uint32_t(n)
		return nil
	})
}

//export smem_shm_atomic_release_value
func smem_shm_atomic_release_value(p unsafe.Pointer, v C.int32_t) C.int32_t {
	return onShm(p, func(sh *shmHandle, w *shmem.World) error {
		return w.ReleaseNumber(context.Background(), int(v))
	})
}

//export smem_shm_register_exit
func smem_shm_register_exit(p unsafe.Pointer, fn C.smem_exit_fn) C.int32_t {
	return onShm(p, func(sh *shmHandle, w *shmem.World) error {
		if fn == nil {
			return fmt.Errorf("smem: null exit callback: %w", status.ErrInvalidConfig)
		}
		sh.mu.Lock()
		defer sh.mu.Unlock()
		if sh.exit != nil {
			return fmt.Errorf("smem: an exit callback is registered already: %w", status.ErrInvalidConfig)
		}
		sh.exit = w.OnExit(func(s int) { C.smem_call_exit(fn, C.int(s)) })
		return nil
	})
}

//export smem_shm_global_exit
func smem_shm_global_exit(p unsafe.Pointer, s C.int) {
	onShm(p, func(_ *shmHandle, w *shmem.World) error { return w.GlobalExit(context.Background(), int(s)) })
}
