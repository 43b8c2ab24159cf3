//go:build cgo

// Package smemapi exports memfabric_hybrid's host C API (smem_*, capi/include/smem/host/) on
// HMC-Go's fabric faces, so programs written for upstream's libmf_smem.so (MemCache's dlopen of
// it, upstream's examples) run on any Linux host. Process-wide state mirrors upstream's (one BM
// initialisation per process); objects are handles passed as pointers.
package smemapi

/*
#include <stdint.h>
#include <stdbool.h>
#include <stdlib.h>
#include "../../include/smem/host/smem_bm_def.h" // types only: the exports declare the functions

typedef void (*smem_logger)(int level, const char *msg);
static void smem_call_logger(smem_logger f, int level, const char *msg) { f(level, msg); }
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/hmc-go/hmc/capi/internal/cabi"
	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/fabric/bm"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
)

// The SM_* codes.
const (
	smOK            = 0
	smError         = -1
	smInvalidParam  = -2000
	smTimeout       = -2004
	smObjectMissing = -2007
)

// state is the process's smem state (upstream keeps the same in singletons).
var state struct {
	mu     sync.Mutex
	fab    *bm.Fabric
	stores []*store.Server
}

// logState is the installed logger: its own lock, since the library logs while state.mu is
// held (smem_bm_init logs from bm.Init).
var logState struct {
	mu       sync.Mutex
	logger   C.smem_logger
	logLevel int
}

// code maps an error to an SM_* code and records its text.
func code(err error) C.int32_t {
	if err == nil {
		return smOK
	}
	cabi.SetError(err.Error())
	switch {
	case errors.Is(err, status.ErrInvalidConfig):
		return smInvalidParam
	case errors.Is(err, status.ErrTimeout):
		return smTimeout
	case errors.Is(err, status.ErrNotFound):
		return smObjectMissing
	}
	return smError
}

// guard runs f, turning a panic into SM_ERROR: nothing unwinds into C.
func guard(f func() error) (rc C.int32_t) {
	defer func() {
		if r := recover(); r != nil {
			rc = code(fmt.Errorf("smem: internal error: %v", r))
		}
	}()
	return code(f())
}

// logHandler forwards log records to the C logger installed by smem_set_extern_logger.
type logHandler struct{ attrs []slog.Attr }

func (h logHandler) Enabled(_ context.Context, l slog.Level) bool {
	logState.mu.Lock()
	defer logState.mu.Unlock()
	return logState.logger != nil && smemLevel(l) >= logState.logLevel
}

func smemLevel(l slog.Level) int {
	switch {
	case l < slog.LevelInfo:
		return 0
	case l < slog.LevelWarn:
		return 1
	case l < slog.LevelError:
		return 2
	}
	return 3
}

func (h logHandler) Handle(_ context.Context, r slog.Record) error {
	logState.mu.Lock()
	f := logState.logger
	logState.mu.Unlock()
	if f == nil {
		return nil
	}
	var b strings.Builder
	b.WriteString(r.Message)
	for _, a := range h.attrs {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
	}
	r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
	cs := C.CString(b.String())
	C.smem_call_logger(f, C.int(smemLevel(r.Level)), cs)
	C.free(unsafe.Pointer(cs))
	return nil
}

func (h logHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return logHandler{attrs: append(append([]slog.Attr(nil), h.attrs...), as...)}
}

func (h logHandler) WithGroup(string) slog.Handler { return h }

//export smem_init
func smem_init(flags C.uint32_t) C.int32_t { return smOK }

//export smem_uninit
func smem_uninit() {
	state.mu.Lock()
	srvs := state.stores
	state.stores = nil
	state.mu.Unlock()
	for _, s := range srvs {
		_ = s.Close()
	}
}

//export smem_create_config_store
func smem_create_config_store(url *C.char) C.int32_t {
	return guard(func() error {
		if url == nil {
			return fmt.Errorf("smem: null store URL: %w", status.ErrInvalidConfig)
		}
		srv, err := store.Listen(C.GoString(url), store.ServerConfig{Logger: slog.New(logHandler{})})
		if err != nil {
			return err
		}
		state.mu.Lock()
		state.stores = append(state.stores, srv)
		state.mu.Unlock()
		return nil
	})
}

//export smem_set_extern_logger
func smem_set_extern_logger(f C.smem_logger) C.int32_t {
	if f == nil {
		return code(fmt.Errorf("smem: null logger: %w", status.ErrInvalidConfig))
	}
	logState.mu.Lock()
	logState.logger = f
	logState.mu.Unlock()
	return smOK
}

//export smem_set_log_level
func smem_set_log_level(level C.int) C.int32_t {
	if level < 0 || level > 3 {
		return smError
	}
	logState.mu.Lock()
	logState.logLevel = int(level)
	logState.mu.Unlock()
	return smOK
}

//export smem_set_conf_store_tls
func smem_set_conf_store_tls(enable C.bool, info *C.char, n C.uint32_t) C.int32_t {
	if !enable {
		return smOK
	}
	return code(fmt.Errorf("smem: store TLS is set through smem_bm_config_t.storeTlsConfig (caPath, certPath, keyPath): %w", status.ErrInvalidConfig))
}

//export smem_set_config_store_tls_key
func smem_set_config_store_tls_key(pk *C.char, pkLen C.uint32_t, pw *C.char, pwLen C.uint32_t, h unsafe.Pointer) C.int32_t {
	if pk == nil || pkLen == 0 {
		return code(fmt.Errorf("smem: empty TLS key: %w", status.ErrInvalidConfig))
	}
	return smOK // store TLS keys come from smem_bm_config_t.storeTlsConfig (docs/memfabric.md)
}

//export smem_get_last_err_msg
func smem_get_last_err_msg() *C.char { return (*C.char)(cabi.LastError()) }

//export smem_get_and_clear_last_err_msg
func smem_get_and_clear_last_err_msg() *C.char { return (*C.char)(cabi.TakeError()) }

// seconds turns a config timeout into a duration (0: the default).
func seconds(s C.uint32_t) time.Duration { return time.Duration(s) * time.Second }

//export smem_bm_config_init
func smem_bm_config_init(c *C.smem_bm_config_t) C.int32_t {
	if c == nil {
		return code(fmt.Errorf("smem: null config: %w", status.ErrInvalidConfig))
	}
	*c = C.smem_bm_config_t{}
	c.initTimeout, c.createTimeout, c.controlOperationTimeout = 120, 120, 120
	c.startConfigStoreServer, c.unifiedAddressSpace, c.autoRanking = true, true, true
	c.rankId = 65535
	return smOK
}

// hcomIP extracts the data-plane IP from upstream's hcomUrl ("tcp://ip:port",
// "tcp://ip/maskbits:port"); "" for none.
func hcomIP(u string) (string, error) {
	if u == "" {
		return "", nil
	}
	rest, ok := strings.CutPrefix(u, "tcp://")
	if !ok {
		return "", fmt.Errorf("smem: hcomUrl %q: want tcp://ip:port: %w", u, status.ErrInvalidConfig)
	}
	host := rest
	if h, _, err := net.SplitHostPort(rest); err == nil {
		host = h
	}
	host, _, _ = strings.Cut(host, "/")
	ip := net.ParseIP(host)
	if ip == nil {
		return "", fmt.Errorf("smem: hcomUrl %q: no IP: %w", u, status.ErrInvalidConfig)
	}
	if ip.IsUnspecified() {
		return "", nil // any: our default (loopback) unless the user names an address
	}
	return ip.String(), nil
}

//export smem_bm_init
func smem_bm_init(url *C.char, worldSize C.uint32_t, deviceID C.uint16_t, c *C.smem_bm_config_t) C.int32_t {
	return guard(func() error {
		if url == nil || c == nil {
			return fmt.Errorf("smem: bm init with null arguments: %w", status.ErrInvalidConfig)
		}
		if !bool(c.unifiedAddressSpace) || c.initTimeout == 0 || c.createTimeout == 0 || c.controlOperationTimeout == 0 {
			return fmt.Errorf("smem: bm config: unifiedAddressSpace must be true and timeouts non-zero: %w", status.ErrInvalidConfig)
		}
		state.mu.Lock()
		defer state.mu.Unlock()
		if state.fab != nil {
			return nil // idempotent, as upstream
		}
		cfg := bm.DefaultConfig()
		cfg.InitTimeout, cfg.ControlTimeout = seconds(c.initTimeout), seconds(c.controlOperationTimeout)
		cfg.StartStore, cfg.AutoRanking, cfg.Rank = bool(c.startConfigStoreServer), bool(c.autoRanking), int(c.rankId)
		cfg.Logger = slog.New(logHandler{})
		ip, err := hcomIP(C.GoString(&c.hcomUrl[0]))
		if err != nil {
			return err
		}
		cfg.BindIP = ip
		if c.storeTlsConfig.tlsEnable {
			cfg.TLS, err = store.TLSFromFiles(C.GoString(&c.storeTlsConfig.certPath[0]), C.GoString(&c.storeTlsConfig.keyPath[0]),
				C.GoString(&c.storeTlsConfig.caPath[0]), false)
			if err != nil {
				return err
			}
		}
		cfg.World, cfg.Device = int(worldSize), int(deviceID)
		f, err := bm.Init(context.Background(), C.GoString(url), cfg)
		if err != nil {
			return err
		}
		state.fab = f
		return nil
	})
}

//export smem_bm_uninit
func smem_bm_uninit(flags C.uint32_t) {
	state.mu.Lock()
	f := state.fab
	state.fab = nil
	state.mu.Unlock()
	if f != nil {
		_ = f.Close()
	}
}

func fabric() (*bm.Fabric, error) {
	state.mu.Lock()
	defer state.mu.Unlock()
	if state.fab == nil {
		return nil, fmt.Errorf("smem: smem_bm_init has not run: %w", status.ErrInvalidConfig)
	}
	return state.fab, nil
}

//export smem_bm_get_rank_id
func smem_bm_get_rank_id() C.uint32_t {
	f, err := fabric()
	if err != nil {
		return C.uint32_t(^uint32(0))
	}
	return C.uint32_t(f.Rank())
}

// ptrHandle turns an object into the opaque pointer C callers hold (a table id, never an
// address); fromPtr turns it back.
func ptrHandle(v any) unsafe.Pointer {
	return unsafe.Pointer(unsafe.SliceData(memory.HostSlice(memory.Ptr(cabi.Add(v)), 1))) // an id, never dereferenced
}

func fromPtr[T any](p unsafe.Pointer) (T, error) { return cabi.Get[T](uint64(uintptr(p))) }

func handle(b *bm.BigMemory) C.smem_bm_t { return C.smem_bm_t(ptrHandle(b)) }

func object(h C.smem_bm_t) (*bm.BigMemory, error) { return fromPtr[*bm.BigMemory](unsafe.Pointer(h)) }

func create(id C.uint32_t, o bm.Options) C.smem_bm_t {
	var out C.smem_bm_t
	rc := guard(func() error {
		f, err := fabric()
		if err != nil {
			return err
		}
		if o.DataOps&(bm.OpHostTCP|bm.OpHostRDMA) != 0 {
			o.DataOps |= bm.OpHostSHM // co-located ranks share memory (docs/memfabric.md)
		}
		b, err := f.Create(context.Background(), int(id), o)
		if err != nil {
			return err
		}
		out = handle(b)
		return nil
	})
	if rc != smOK {
		return nil
	}
	return out
}

//export smem_bm_create
func smem_bm_create(id, memberSize C.uint32_t, op C.smem_bm_data_op_type, dram, hbm C.uint64_t, flags C.uint32_t) C.smem_bm_t {
	return create(id, bm.Options{LocalDRAM: uint64(dram), LocalHBM: uint64(hbm), DataOps: bm.DataOp(op), Flags: uint32(flags) &^ bm.FlagCreateWithShm, DRAMShmFD: -1})
}

//export smem_bm_create2
func smem_bm_create2(id C.uint32_t, o *C.smem_bm_create_option_t) C.smem_bm_t {
	if o == nil {
		code(fmt.Errorf("smem: null create options: %w", status.ErrInvalidConfig))
		return nil
	}
	return create(id, bm.Options{MaxDRAM: uint64(o.maxDramSize), MaxHBM: uint64(o.maxHbmSize), LocalDRAM: uint64(o.localDRAMSize),
		LocalHBM: uint64(o.localHBMSize), DataOps: bm.DataOp(o.dataOpType), Flags: uint32(o.flags),
		Tag: C.GoString(&o.tag[0]), TagOpInfo: C.GoString(&o.tagOpInfo[0]), DRAMShmFD: int(o.dramShmFd)})
}

//export smem_bm_destroy
func smem_bm_destroy(h C.smem_bm_t) {
	guard(func() error {
		b, err := object(h)
		if err != nil {
			return err
		}
		cabi.Remove(uint64(uintptr(unsafe.Pointer(h))))
		return b.Destroy(context.Background())
	})
}

//export smem_bm_join
func smem_bm_join(h C.smem_bm_t, flags C.uint32_t) C.int32_t {
	return guard(func() error {
		b, err := object(h)
		if err != nil {
			return err
		}
		return b.Join(context.Background())
	})
}

//export smem_bm_leave
func smem_bm_leave(h C.smem_bm_t, flags C.uint32_t) C.int32_t {
	return guard(func() error {
		b, err := object(h)
		if err != nil {
			return err
		}
		return b.Leave(context.Background())
	})
}

//export smem_bm_get_local_mem_size_by_mem_type
func smem_bm_get_local_mem_size_by_mem_type(h C.smem_bm_t, t C.smem_bm_mem_type) C.uint64_t {
	b, err := object(h)
	if err != nil {
		code(err)
		return 0
	}
	return C.uint64_t(b.LocalMemSize(bm.MemType(t)))
}

//export smem_bm_ptr_by_mem_type
func smem_bm_ptr_by_mem_type(h C.smem_bm_t, t C.smem_bm_mem_type, peer C.uint16_t) unsafe.Pointer {
	b, err := object(h)
	if err == nil {
		var p uint64
		if p, err = b.PtrByMemType(bm.MemType(t), int(peer)); err == nil {
			return unsafe.Pointer(unsafe.SliceData(memory.HostSlice(memory.Ptr(p), 1))) // a global address; its bytes may be remote
		}
	}
	code(err)
	return nil
}

//export smem_bm_get_rank_id_by_gva
func smem_bm_get_rank_id_by_gva(h C.smem_bm_t, gva unsafe.Pointer) C.uint32_t {
	b, err := object(h)
	if err == nil {
		var r int
		if r, err = b.RankByGVA(uint64(uintptr(gva))); err == nil {
			return C.uint32_t(r)
		}
	}
	code(err)
	return C.uint32_t(^uint32(0))
}

//export smem_bm_copy
func smem_bm_copy(h C.smem_bm_t, p *C.smem_copy_params, t C.smem_bm_copy_type, flags C.uint32_t) C.int32_t {
	return guard(func() error {
		b, err := object(h)
		if err != nil {
			return err
		}
		if p == nil {
			return fmt.Errorf("smem: null copy params: %w", status.ErrInvalidConfig)
		}
		return b.Copy(context.Background(), uint64(uintptr(p.src)), uint64(uintptr(p.dest)), uint64(p.dataSize), bm.CopyType(t), uint32(flags))
	})
}

//export smem_bm_copy_batch
func smem_bm_copy_batch(h C.smem_bm_t, p *C.smem_batch_copy_params, t C.smem_bm_copy_type, flags C.uint32_t) C.int32_t {
	return guard(func() error {
		b, err := object(h)
		if err != nil {
			return err
		}
		if p == nil || p.sources == nil || p.destinations == nil || p.dataSizes == nil || p.batchSize == 0 || p.batchSize > bm.MaxBatch {
			return fmt.Errorf("smem: batch copy params: %w", status.ErrInvalidConfig)
		}
		n := int(p.batchSize)
		srcs := unsafe.Slice((*uintptr)(unsafe.Pointer(p.sources)), n)
		dsts := unsafe.Slice((*uintptr)(unsafe.Pointer(p.destinations)), n)
		sizes := unsafe.Slice((*uint64)(unsafe.Pointer(p.dataSizes)), n)
		ps := make([]bm.CopyParams, n)
		for i := range ps {
			ps[i] = bm.CopyParams{Src: uint64(srcs[i]), Dst: uint64(dsts[i]), Size: sizes[i]}
		}
		return b.CopyBatch(context.Background(), ps, bm.CopyType(t), uint32(flags))
	})
}

//export smem_bm_wait
func smem_bm_wait(h C.smem_bm_t) C.int32_t {
	return guard(func() error {
		b, err := object(h)
		if err != nil {
			return err
		}
		return b.Wait(context.Background())
	})
}

//export smem_bm_register_user_mem
func smem_bm_register_user_mem(h C.smem_bm_t, addr, size C.uint64_t) C.int32_t {
	return guard(func() error {
		b, err := object(h)
		if err != nil {
			return err
		}
		return b.RegisterUserMem(uint64(addr), uint64(size))
	})
}

//export smem_bm_unregister_user_mem
func smem_bm_unregister_user_mem(h C.smem_bm_t, addr C.uint64_t) C.int32_t {
	return guard(func() error {
		b, err := object(h)
		if err != nil {
			return err
		}
		return b.UnregisterUserMem(context.Background(), uint64(addr))
	})
}
