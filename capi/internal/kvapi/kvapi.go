//go:build cgo

// Package kvapi exports the KV-cache pool (fabric/kv) as hmc_kv_*: the functions under
// python/hmc/kv.py's MooncakeDistributedStore. Calls return Mooncake Store's error codes (0,
// or negative: kv.Code), sizes and counts where those are the result; the reason of a failure is
// hmc_last_error's.
package kvapi

/*
#include <stdint.h>
#include <stdlib.h>
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unsafe"

	"github.com/hmc-go/hmc/capi/internal/cabi"
	"github.com/hmc-go/hmc/fabric/kv"
	"github.com/hmc-go/hmc/fabric/trans"
	"github.com/hmc-go/hmc/status"
)

// code runs f and returns its Mooncake code, recording the failure's text.
func code(f func() error) C.int32_t {
	err := f()
	if err == nil {
		return 0
	}
	cabi.SetError(err.Error())
	return C.int32_t(kv.CodeOf(err))
}

func gostr(p *C.char) string { return cabi.GoString(unsafe.Pointer(p)) }

func client(h C.uint64_t) (*kv.Client, error) {
	c, err := cabi.Get[*kv.Client](uint64(h))
	if err != nil {
		return nil, &kv.Error{Code: kv.InvalidParams, Msg: err.Error()}
	}
	return c, nil
}

// callTimeout bounds each call of the C face.
const callTimeout = 30 * time.Second

// onClient runs f on client h with a bounded context and returns its Mooncake code.
func onClient(h C.uint64_t, f func(ctx context.Context, c *kv.Client) error) C.int32_t {
	return code(func() error {
		c, err := client(h)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		return f(ctx, c)
	})
}

// putString writes s and a NUL into the n bytes at buf.
func putString(buf *C.char, n C.uint64_t, s string) error {
	b, err := cabi.HostBytes(unsafe.Pointer(buf), uint64(n))
	if err != nil || len(b) <= len(s) {
		return &kv.Error{Code: kv.BufferOverflow, Msg: fmt.Sprintf("a %d-byte buffer for %q", n, s)}
	}
	b[copy(b, s)] = 0
	return nil
}

// hostBytes is the n bytes at p, or INVALID_PARAMS.
func hostBytes(p unsafe.Pointer, n C.uint64_t) ([]byte, error) {
	b, err := cabi.HostBytes(p, uint64(n))
	if err != nil {
		return nil, &kv.Error{Code: kv.InvalidParams, Msg: err.Error()}
	}
	return b, nil
}

// hmc_kv_client_create joins the pool at master ("ip:port", or the masters' store URL) as a
// client named by local_hostname ("ip" or "ip:port"; port 0 or none: any) lending segment_size
// bytes (0: none), its transfer engine on metadata (NULL or "P2PHANDSHAKE": peer to peer) with
// Mooncake's protocol ("tcp", "rdma": UCX's RDMA, "ucx"; NULL: tcp; peers on one host use
// shared memory whatever the protocol).
//
//export hmc_kv_client_create
func hmc_kv_client_create(master, localHostname, metadata, protocol *C.char, segmentSize C.uint64_t, out *C.uint64_t) C.int32_t {
	return code(func() error {
		if out == nil {
			return &kv.Error{Code: kv.InvalidParams, Msg: "no output handle"}
		}
		id := gostr(localHostname)
		if id == "" {
			id = "127.0.0.1"
		}
		if !strings.Contains(id, ":") || strings.HasSuffix(id, "]") {
			id += ":0"
		}
		kinds, err := trans.Protocol(gostr(protocol), false)
		if err != nil {
			return &kv.Error{Code: kv.InvalidParams, Msg: err.Error()}
		}
		c, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		cl, err := kv.NewClient(c, kv.ClientConfig{Master: gostr(master), UniqueID: id, Metadata: gostr(metadata), SegmentSize: uint64(segmentSize), Kinds: kinds})
		if err != nil {
			if kv.CodeOf(err) == kv.InternalError {
				return &kv.Error{Code: kv.InvalidParams, Msg: err.Error()}
			}
			return err
		}
		*out = C.uint64_t(cabi.Add(cl))
		return nil
	})
}

// hmc_kv_client_id writes the client's name (its transfer engine's id) into buf.
//
//export hmc_kv_client_id
func hmc_kv_client_id(h C.uint64_t, buf *C.char, n C.uint64_t) C.int32_t {
	return onClient(h, func(_ context.Context, c *kv.Client) error { return putString(buf, n, c.ID()) })
}

// hmc_kv_put stores n bytes at value under key in replicas replicas.
//
//export hmc_kv_put
func hmc_kv_put(h C.uint64_t, key *C.char, value unsafe.Pointer, n C.uint64_t, replicas C.int) C.int32_t {
	return onClient(h, func(ctx context.Context, c *kv.Client) error {
		v, err := hostBytes(value, n)
		if err != nil {
			return err
		}
		return c.Put(ctx, gostr(key), v, int(replicas))
	})
}

// hmc_kv_get_size returns key's size, or a negative code.
//
//export hmc_kv_get_size
func hmc_kv_get_size(h C.uint64_t, key *C.char) C.int64_t {
	var n uint64
	rc := onClient(h, func(ctx context.Context, c *kv.Client) (err error) {
		n, err = c.Size(ctx, gostr(key))
		return err
	})
	if rc != 0 {
		return C.int64_t(rc)
	}
	return C.int64_t(n)
}

// hmc_kv_get_into reads key's value into the n bytes at dst and returns its length, or a
// negative code (BUFFER_OVERFLOW when dst is shorter).
//
//export hmc_kv_get_into
func hmc_kv_get_into(h C.uint64_t, key *C.char, dst unsafe.Pointer, n C.uint64_t) C.int64_t {
	var got int
	rc := onClient(h, func(ctx context.Context, c *kv.Client) error {
		b, err := hostBytes(dst, n)
		if err != nil {
			return err
		}
		got, err = c.GetInto(ctx, gostr(key), b)
		return err
	})
	if rc != 0 {
		return C.int64_t(rc)
	}
	return C.int64_t(got)
}

// hmc_kv_exist returns 1 when key names a complete object, 0 when not, or a negative code.
//
//export hmc_kv_exist
func hmc_kv_exist(h C.uint64_t, key *C.char) C.int32_t {
	yes := false
	rc := onClient(h, func(ctx context.Context, c *kv.Client) (err error) {
		yes, err = c.Exist(ctx, gostr(key))
		return err
	})
	if rc != 0 {
		return rc
	}
	if yes {
		return 1
	}
	return 0
}

// hmc_kv_remove removes key (OBJECT_HAS_LEASE while a get's lease lasts, unless force).
//
//export hmc_kv_remove
func hmc_kv_remove(h C.uint64_t, key *C.char, force C.int) C.int32_t {
	return onClient(h, func(ctx context.Context, c *kv.Client) error { return c.Remove(ctx, gostr(key), force != 0) })
}

// hmc_kv_remove_regex removes every object whose key matches pattern (leased ones only if
// force); it returns how many, or a negative code. pattern NULL: every object.
//
//export hmc_kv_remove_regex
func hmc_kv_remove_regex(h C.uint64_t, pattern *C.char, force C.int) C.int64_t {
	var n int
	rc := onClient(h, func(ctx context.Context, c *kv.Client) (err error) {
		if pattern == nil {
			n, err = c.RemoveAll(ctx, force != 0)
		} else {
			n, err = c.RemoveByRegex(ctx, gostr(pattern), force != 0)
		}
		return err
	})
	if rc != 0 {
		return C.int64_t(rc)
	}
	return C.int64_t(n)
}

// hmc_kv_register_buffer records size bytes at addr as a buffer of puts and gets.
//
//export hmc_kv_register_buffer
func hmc_kv_register_buffer(h C.uint64_t, addr, size C.uint64_t) C.int32_t {
	return onClient(h, func(_ context.Context, c *kv.Client) error { return c.RegisterBuffer(uint64(addr), uint64(size)) })
}

// hmc_kv_unregister_buffer forgets the buffer registered at addr.
//
//export hmc_kv_unregister_buffer
func hmc_kv_unregister_buffer(h C.uint64_t, addr C.uint64_t) C.int32_t {
	return onClient(h, func(_ context.Context, c *kv.Client) error { return c.UnregisterBuffer(uint64(addr)) })
}

// hmc_kv_ping returns 0 when the master answers, else a negative code.
//
//export hmc_kv_ping
func hmc_kv_ping(h C.uint64_t) C.int32_t {
	return onClient(h, func(ctx context.Context, c *kv.Client) error { return c.Ping(ctx) })
}

// hmc_kv_client_close leaves the pool and frees the client.
//
//export hmc_kv_client_close
func hmc_kv_client_close(h C.uint64_t) C.int32_t {
	return code(func() error {
		c, err := client(h)
		if err != nil {
			return err
		}
		cabi.Remove(uint64(h))
		return c.Close()
	})
}

// master is a master served by this process.
type master struct{ srv *kv.Server }

// hmc_kv_master_start serves a master on addr ("ip:port"; port 0: any) with the lease and
// client TTLs in ms (0: defaults), and writes the address it serves on into addrBuf.
//
//export hmc_kv_master_start
func hmc_kv_master_start(addr *C.char, leaseMS, clientTTLMS C.int, addrBuf *C.char, n C.uint64_t, out *C.uint64_t) C.int32_t {
	return code(func() error {
		if out == nil {
			return &kv.Error{Code: kv.InvalidParams, Msg: "no output handle"}
		}
		m := kv.NewMaster(kv.MasterConfig{LeaseTTL: time.Duration(leaseMS) * time.Millisecond})
		srv, err := kv.Serve(m, kv.ServerConfig{Addr: gostr(addr), ClientTTL: time.Duration(clientTTLMS) * time.Millisecond})
		if err != nil {
			return &kv.Error{Code: kv.InvalidParams, Msg: err.Error()}
		}
		if err := putString(addrBuf, n, srv.Addr()); err != nil {
			_ = srv.Close()
			return err
		}
		*out = C.uint64_t(cabi.Add(&master{srv}))
		return nil
	})
}

// hmc_kv_master_stop stops a master of hmc_kv_master_start.
//
//export hmc_kv_master_stop
func hmc_kv_master_stop(h C.uint64_t) C.int32_t {
	return code(func() error {
		m, err := cabi.Get[*master](uint64(h))
		if err != nil {
			return &kv.Error{Code: kv.InvalidParams, Msg: err.Error()}
		}
		cabi.Remove(uint64(h))
		if err := m.srv.Close(); err != nil && !errors.Is(err, status.ErrClosed) {
			return err
		}
		return nil
	})
}

// hmc_kv_get reads key's object into memory it allocates with malloc (free it with
// hmc_kv_free) and writes its address and size into out and n: one call to the master.
//
//export hmc_kv_get
func hmc_kv_get(h C.uint64_t, key *C.char, out *unsafe.Pointer, n *C.uint64_t) C.int32_t {
	return onClient(h, func(ctx context.Context, c *kv.Client) error {
		if out == nil || n == nil {
			return &kv.Error{Code: kv.InvalidParams, Msg: "no output pointer"}
		}
		var p unsafe.Pointer
		size, err := c.GetWith(ctx, gostr(key), func(size uint64) (kv.Span, error) {
			if p = C.malloc(C.size_t(size)); p == nil {
				return kv.Span{}, &kv.Error{Code: kv.NoAvailableHandle, Msg: fmt.Sprintf("malloc of %d bytes", size)}
			}
			return kv.Span{Addr: uint64(uintptr(p)), Size: size}, nil
		})
		if err != nil {
			if p != nil {
				C.free(p)
			}
			return err
		}
		*out, *n = p, C.uint64_t(size)
		return nil
	})
}

// hmc_kv_free frees memory hmc_kv_get returned.
//
//export hmc_kv_free
func hmc_kv_free(p unsafe.Pointer) { C.free(p) }

// hmc_kv_mount_segment lends one more segment of size bytes at location ("" or "cpu", "cuda:N",
// "hip:N") and writes its name into buf.
//
//export hmc_kv_mount_segment
func hmc_kv_mount_segment(h C.uint64_t, size C.uint64_t, location *C.char, buf *C.char, n C.uint64_t) C.int32_t {
	return onClient(h, func(ctx context.Context, c *kv.Client) error {
		name, err := c.MountSegment(ctx, uint64(size), gostr(location))
		if err != nil {
			return err
		}
		if err := putString(buf, n, name); err != nil {
			uctx, cancel := context.WithTimeout(context.Background(), callTimeout)
			defer cancel()
			return errors.Join(err, c.UnmountSegment(uctx, name, 0))
		}
		return nil
	})
}

// hmc_kv_unmount_segment takes segment name out of the pool, waits grace_ms for readers, and
// frees its memory.
//
//export hmc_kv_unmount_segment
func hmc_kv_unmount_segment(h C.uint64_t, name *C.char, graceMS C.int64_t) C.int32_t {
	return onClient(h, func(ctx context.Context, c *kv.Client) error {
		return c.UnmountSegment(ctx, gostr(name), time.Duration(max(graceMS, 0))*time.Millisecond)
	})
}
