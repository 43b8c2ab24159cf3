//go:build cgo

// Package transapi exports the transfer engine (fabric/trans) as hmc_trans_* (capi/include/hmc.h);
// the Python hmc.trans module (Mooncake's TransferEngine API) is built on it.
package transapi

/*
#include <stdint.h>
*/
import "C"

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/hmc-go/hmc/capi/internal/cabi"
	"github.com/hmc-go/hmc/fabric/trans"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// engine is an Engine and its submitted batches, by handle.
type engine struct {
	e       *trans.Engine
	mu      sync.Mutex
	batches map[uint64]*trans.Batch
	next    uint64
	// pendingNotifs are notifications taken from the engine that did not fit the caller's
	// buffer; the next call returns them first.
	pendingNotifs []trans.Notify
}

func getEngine(h C.uint64_t) (*engine, error) { return cabi.Get[*engine](uint64(h)) }

// onEngine runs f with the engine behind handle h, as an export's body.
func onEngine(h C.uint64_t, f func(en *engine) error) C.int {
	return call(func() error {
		en, err := getEngine(h)
		if err != nil {
			return err
		}
		return f(en)
	})
}

// kinds parses "shm,tcp" (auto or empty: the default).
func kinds(p string) ([]transport.ConnType, error) {
	p = strings.TrimSpace(strings.ToLower(p))
	if p == "" || p == "auto" {
		return nil, nil
	}
	if p == "rdma" {
		return trans.Protocol(p, os.Getenv("MC_FORCE_TCP") == "1") // Mooncake's: UCX's RDMA, or TCP when forced
	}
	var ks []transport.ConnType
	for _, s := range strings.Split(p, ",") {
		k, err := transport.ParseConnType(s)
		if err != nil {
			if _, perr := trans.Protocol(s, false); perr != nil {
				return nil, perr // names Mooncake's transports too, with the reason
			}
			return nil, err
		}
		ks = append(ks, k)
	}
	return ks, nil
}

// redisFromEnv is Mooncake's Redis login: MC_REDIS_USERNAME, MC_REDIS_PASSWORD and
// MC_REDIS_DB_INDEX (0..255).
func redisFromEnv() (trans.RedisConfig, error) {
	rc := trans.RedisConfig{Username: os.Getenv("MC_REDIS_USERNAME"), Password: os.Getenv("MC_REDIS_PASSWORD")}
	if s := os.Getenv("MC_REDIS_DB_INDEX"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n > 255 {
			return rc, fmt.Errorf("hmc: MC_REDIS_DB_INDEX=%q (want 0..255): %w", s, status.ErrInvalidConfig)
		}
		rc.DB = n
	}
	return rc, nil
}

// hmc_trans_create starts an engine named unique_id ("ip:port", port 0: any) on metadata
// (tcp://, etcd:// or host:port, http://, redis://, or P2PHANDSHAKE / empty for none); role 1
// sender, 2 receiver, 3 both (0: both); protocols "shm,tcp" in order of preference (NULL or
// "auto": the default), or Mooncake's "rdma".
//
//export hmc_trans_create
func hmc_trans_create(metadata, uniqueID *C.char, role C.int, protocols *C.char, timeoutMS C.int, out *C.uint64_t) C.int {
	return call(func() error {
		if uniqueID == nil || out == nil {
			return fmt.Errorf("hmc: trans create with null arguments: %w", status.ErrInvalidConfig)
		}
		cfg := trans.DefaultConfig()
		cfg.Logger = cabi.Logger()
		var err error
		if strings.HasPrefix(goString(metadata), "redis://") {
			if cfg.Redis, err = redisFromEnv(); err != nil {
				return err
			}
		}
		if role != 0 {
			cfg.Role = trans.Role(role)
		}
		ks, err := kinds(goString(protocols))
		if err != nil {
			return err
		}
		if ks != nil {
			cfg.Kinds = ks
		}
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		cfg.UniqueID = goString(uniqueID)
		e, err := trans.Create(ctx, goString(metadata), cfg)
		if err != nil {
			return err
		}
		*out = C.uint64_t(cabi.Add(&engine{e: e, batches: make(map[uint64]*trans.Batch)}))
		return nil
	})
}

//export hmc_trans_destroy
func hmc_trans_destroy(h C.uint64_t) C.int {
	return onEngine(h, func(en *engine) error {
		cabi.Remove(uint64(h))
		return en.e.Close()
	})
}

// hmc_trans_unique_id writes the engine's unique id ("ip:port") into buf (cap bytes, NUL
// included).
//
//export hmc_trans_unique_id
func hmc_trans_unique_id(h C.uint64_t, buf *C.char, capacity C.uint64_t) C.int {
	return onEngine(h, func(en *engine) error {
		id := en.e.UniqueID()
		if buf == nil || uint64(capacity) < uint64(len(id))+1 {
			return fmt.Errorf("hmc: unique id needs %d bytes: %w", len(id)+1, status.ErrInvalidConfig)
		}
		b := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(capacity))
		copy(b, id)
		b[len(id)] = 0
		return nil
	})
}

//export hmc_trans_register
func hmc_trans_register(h C.uint64_t, addr, size C.uint64_t) C.int {
	return onEngine(h, func(en *engine) error {
		return en.e.Register(uint64(addr), uint64(size))
	})
}

//export hmc_trans_batch_register
func hmc_trans_batch_register(h C.uint64_t, addrs, sizes *C.uint64_t, n C.uint64_t) C.int {
	return onEngine(h, func(en *engine) error {
		a, s, err := pairs(addrs, sizes, n)
		if err != nil {
			return err
		}
		bufs := make([]trans.Buffer, len(a))
		for i := range a {
			bufs[i] = trans.Buffer{Addr: a[i], Size: s[i]}
		}
		return en.e.BatchRegister(bufs)
	})
}

//export hmc_trans_deregister
func hmc_trans_deregister(h C.uint64_t, addr C.uint64_t, timeoutMS C.int) C.int {
	return onEngine(h, func(en *engine) error {
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		return en.e.Deregister(ctx, uint64(addr))
	})
}

//export hmc_trans_malloc
func hmc_trans_malloc(h C.uint64_t, size C.uint64_t, out *C.uint64_t) C.int {
	return onEngine(h, func(en *engine) error {
		if out == nil {
			return fmt.Errorf("hmc: malloc without an output: %w", status.ErrInvalidConfig)
		}
		a, err := en.e.Malloc(uint64(size))
		if err != nil {
			return err
		}
		*out = C.uint64_t(a)
		return nil
	})
}

//export hmc_trans_free
func hmc_trans_free(h C.uint64_t, addr C.uint64_t, timeoutMS C.int) C.int {
	return onEngine(h, func(en *engine) error {
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		return en.e.Free(ctx, uint64(addr))
	})
}

// pairs views two C arrays of n uint64s.
func pairs(a, b *C.uint64_t, n C.uint64_t) ([]uint64, []uint64, error) {
	if n == 0 || n > trans.MaxBatch || a == nil || b == nil {
		return nil, nil, fmt.Errorf("hmc: %d elements: %w", uint64(n), status.ErrInvalidConfig)
	}
	return unsafe.Slice((*uint64)(unsafe.Pointer(a)), int(n)), unsafe.Slice((*uint64)(unsafe.Pointer(b)), int(n)), nil
}

// requests turns the caller's arrays into n requests, in buf's array when it holds n (a
// synchronous call's pooled list), and returns their total size.
func requests(op C.int, locals, remotes, sizes *C.uint64_t, n C.uint64_t, buf []trans.Request) ([]trans.Request, uint64, error) {
	l, r, err := pairs(locals, remotes, n)
	if err != nil {
		return nil, 0, err
	}
	if sizes == nil {
		return nil, 0, fmt.Errorf("hmc: no sizes: %w", status.ErrInvalidConfig)
	}
	s := unsafe.Slice((*uint64)(unsafe.Pointer(sizes)), int(n))
	reqs := buf[:0]
	if uint64(cap(buf)) < uint64(n) {
		reqs = make([]trans.Request, 0, n)
	}
	var total uint64
	for i := range s {
		if l[i]+s[i] < l[i] || r[i]+s[i] < r[i] {
			return nil, 0, fmt.Errorf("hmc: entry %d: %d bytes at %#x (local) / %#x (peer) run past the address space: %w", i, s[i], l[i], r[i], status.ErrInvalidConfig)
		}
		reqs = append(reqs, trans.Request{Op: trans.Opcode(op), Local: l[i], Remote: r[i], Size: s[i]})
		total += s[i]
	}
	return reqs, total, nil
}

// reqPool keeps synchronous calls' request lists: a batch of 1,024 blocks made 32 KiB of
// garbage per call, a collection every hundred-odd calls from Python. The engine holds none of
// a synchronous batch's requests once Transfer has returned.
var reqPool = sync.Pool{New: func() any { return new([]trans.Request) }}

// perMiB is Mooncake's allowance for a synchronous batch of total bytes: timeoutMS plus 1 ms
// per MiB it moves (timeoutMS 0: the default, left as it is).
func perMiB(timeoutMS C.int, total uint64) C.int {
	if timeoutMS <= 0 {
		return timeoutMS
	}
	return C.int(min(int64(timeoutMS)+int64(total>>20), 1<<31-1))
}

func notify(msg *C.char) *trans.Notify {
	if msg == nil {
		return nil
	}
	return &trans.Notify{Msg: goString(msg)}
}

// hmc_trans_transfer runs n requests (op 0 read, 1 write) to peer and returns when they are
// complete; notify_msg (NULL: none) is delivered to the peer after them.
//
//export hmc_trans_transfer
func hmc_trans_transfer(h C.uint64_t, peer *C.char, op C.int, locals, remotes, sizes *C.uint64_t, n C.uint64_t, notifyMsg *C.char, timeoutMS C.int) C.int {
	return onEngine(h, func(en *engine) error {
		pooled := reqPool.Get().(*[]trans.Request)
		defer reqPool.Put(pooled)
		reqs, total, err := requests(op, locals, remotes, sizes, n, *pooled)
		if err != nil {
			return err
		}
		*pooled = reqs // grown: kept for the next call
		ctx, cancel := deadline(perMiB(timeoutMS, total))
		defer cancel()
		return en.e.Transfer(ctx, goString(peer), reqs, notify(notifyMsg))
	})
}

// pylist.c writes requests as struct { int64_t op; uint64_t local, remote, size; }: these fail
// to compile if trans.Request is laid out otherwise.
var (
	_ = [1]struct{}{}[unsafe.Sizeof(trans.Request{})-32]
	_ = [1]struct{}{}[unsafe.Sizeof(trans.Request{}.Op)-8]
	_ = [1]struct{}{}[unsafe.Offsetof(trans.Request{}.Local)-8]
	_ = [1]struct{}{}[unsafe.Offsetof(trans.Request{}.Remote)-16]
	_ = [1]struct{}{}[unsafe.Offsetof(trans.Request{}.Size)-24]
)

// hmc_trans_run runs n requests laid out as trans.Request at reqs (C memory), total bytes in
// all: the Python package's one-call batch (pylist.c's hmc_py_trans_transfer) after it has
// read its lists into them. Not declared in hmc.h: C callers have hmc_trans_transfer.
//
//export hmc_trans_run
func hmc_trans_run(h C.uint64_t, peer *C.char, reqs unsafe.Pointer, n, total C.uint64_t, timeoutMS C.int) C.int {
	return onEngine(h, func(en *engine) error {
		if reqs == nil || n == 0 || n > trans.MaxBatch {
			return fmt.Errorf("hmc: %d requests: %w", uint64(n), status.ErrInvalidConfig)
		}
		ctx, cancel := deadline(perMiB(timeoutMS, uint64(total)))
		defer cancel()
		return en.e.Transfer(ctx, goString(peer), unsafe.Slice((*trans.Request)(reqs), int(n)), nil)
	})
}

// hmc_trans_submit starts n requests and returns a batch handle at once.
//
//export hmc_trans_submit
func hmc_trans_submit(h C.uint64_t, peer *C.char, op C.int, locals, remotes, sizes *C.uint64_t, n C.uint64_t, notifyMsg *C.char, out *C.uint64_t) C.int {
	return onEngine(h, func(en *engine) error {
		reqs, _, err := requests(op, locals, remotes, sizes, n, nil) // the batch keeps them
		if err != nil {
			return err
		}
		if out == nil {
			return fmt.Errorf("hmc: submit without an output: %w", status.ErrInvalidConfig)
		}
		ctx, cancel := deadline(0)
		defer cancel()
		b, err := en.e.Submit(ctx, goString(peer), reqs, notify(notifyMsg))
		if err != nil {
			return err
		}
		en.mu.Lock()
		en.next++
		id := en.next
		en.batches[id] = b
		en.mu.Unlock()
		*out = C.uint64_t(id)
		return nil
	})
}

func (en *engine) batch(id C.uint64_t) (*trans.Batch, error) {
	en.mu.Lock()
	defer en.mu.Unlock()
	b, ok := en.batches[uint64(id)]
	if !ok {
		return nil, fmt.Errorf("hmc: no batch %d: %w", uint64(id), status.ErrNotFound)
	}
	return b, nil
}

// hmc_trans_status writes a batch's state (Mooncake's TransferStatusEnum: 0 waiting, 1 pending,
// 4 completed, 5 timeout, 6 failed); a failed batch's error is the last error text.
//
//export hmc_trans_status
func hmc_trans_status(h C.uint64_t, id C.uint64_t, st *C.int) C.int {
	return onEngine(h, func(en *engine) error {
		b, err := en.batch(id)
		if err != nil {
			return err
		}
		if st != nil {
			*st = C.int(b.Status())
		}
		return nil
	})
}

// hmc_trans_wait waits for a batch and forgets it; its error is returned.
//
//export hmc_trans_wait
func hmc_trans_wait(h C.uint64_t, id C.uint64_t, timeoutMS C.int) C.int {
	return onEngine(h, func(en *engine) error {
		b, err := en.batch(id)
		if err != nil {
			return err
		}
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		if err := b.Wait(ctx); err != nil && b.Status() == trans.Pending {
			return err // timed out waiting: the batch stays
		} else if err != nil {
			en.forget(id)
			return err
		}
		en.forget(id)
		return nil
	})
}

func (en *engine) forget(id C.uint64_t) {
	en.mu.Lock()
	delete(en.batches, uint64(id))
	en.mu.Unlock()
}

// hmc_trans_json writes a JSON document about the engine into buf (cap bytes) and its length
// into len (the length needed when it does not fit: INVALID_CONFIG): what 0 = the notifications
// received since the last call ([{"name","msg"}]), 1 = peer's registered buffers
// ([{"Addr","Size"}]), 2 = this engine's.
//
//export hmc_trans_json
func hmc_trans_json(h C.uint64_t, what C.int, peer *C.char, buf *C.char, capacity C.uint64_t, n *C.uint64_t, timeoutMS C.int) C.int {
	return onEngine(h, func(en *engine) error {
		var v any
		switch what {
		case 0:
			en.mu.Lock()
			pendingNotifs := en.pendingNotifs
			en.pendingNotifs = nil
			en.mu.Unlock()
			v = append(pendingNotifs, en.e.Notifies()...)
		case 1:
			ctx, cancel := deadline(timeoutMS)
			defer cancel()
			bufs, err := en.e.PeerBuffers(ctx, goString(peer))
			if err != nil {
				return err
			}
			v = bufs
		case 2:
			v = en.e.Buffers()
		default:
			return fmt.Errorf("hmc: trans json %d: %w", int(what), status.ErrInvalidConfig)
		}
		doc, _ := json.Marshal(v) // these marshal
		if n != nil {
			*n = C.uint64_t(len(doc))
		}
		if buf == nil || uint64(capacity) < uint64(len(doc)) {
			if what == 0 { // keep them for the retry with a larger buffer
				var keep []trans.Notify
				_ = json.Unmarshal(doc, &keep)
				en.mu.Lock()
				en.pendingNotifs = append(keep, en.pendingNotifs...)
				en.mu.Unlock()
			}
			return fmt.Errorf("hmc: %d bytes needed: %w", len(doc), status.ErrInvalidConfig)
		}
		copy(unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(capacity)), doc)
		return nil
	})
}

// hmc_trans_probe checks that peer is published (with metadata) and answers now (Mooncake's
// send_probe).
//
//export hmc_trans_probe
func hmc_trans_probe(h C.uint64_t, peer *C.char, timeoutMS C.int) C.int {
	return onEngine(h, func(en *engine) error {
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		return en.e.Probe(ctx, goString(peer))
	})
}

// hmc_trans_notify_as delivers a notification with a sender name of the caller's choosing
// (Mooncake's TransferNotify{name, msg}; NULL or "": this engine's unique id).
//
//export hmc_trans_notify_as
func hmc_trans_notify_as(h C.uint64_t, peer, name, msg *C.char, timeoutMS C.int) C.int {
	return onEngine(h, func(en *engine) error {
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		return en.e.SendNotify(ctx, goString(peer), trans.Notify{Name: goString(name), Msg: goString(msg)})
	})
}

// hmc_trans_notify delivers a notification to peer on its own (Mooncake's sendNotifyByName).
//
//export hmc_trans_notify
func hmc_trans_notify(h C.uint64_t, peer, msg *C.char, timeoutMS C.int) C.int {
	return onEngine(h, func(en *engine) error {
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		return en.e.SendNotify(ctx, goString(peer), trans.Notify{Msg: goString(msg)})
	})
}
