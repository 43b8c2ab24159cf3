//go:build cgo

package kvapi

/*
#include <stdint.h>
*/
import "C"

import (
	"bytes"
	"context"
	"fmt"
	"unsafe"

	"github.com/hmc-go/hmc/capi/internal/cabi"
	"github.com/hmc-go/hmc/fabric/kv"
)

// maxItems bounds one batch call's objects (the master's limit).
const maxItems = 1 << 16

// keysOf splits the n NUL-terminated keys in the size bytes at p.
func keysOf(p unsafe.Pointer, size C.uint64_t, n C.uint64_t) ([]string, error) {
	if n > maxItems {
		return nil, &kv.Error{Code: kv.InvalidParams, Msg: fmt.Sprintf("%d keys in one batch (at most %d)", n, maxItems)}
	}
	b, err := hostBytes(p, size)
	if err != nil {
		return nil, err
	}
	keys := make([]string, 0, n)
	for len(b) > 0 && uint64(len(keys)) < uint64(n) {
		k, rest, ok := bytes.Cut(b, []byte{0})
		if !ok {
			break
		}
		keys, b = append(keys, string(k)), rest
	}
	if uint64(len(keys)) != uint64(n) {
		return nil, &kv.Error{Code: kv.InvalidParams, Msg: fmt.Sprintf("%d NUL-terminated keys in %d bytes, %d expected", len(keys), size, n)}
	}
	return keys, nil
}

// words is the n uint64 values at p.
func words(p *C.uint64_t, n uint64) ([]uint64, error) {
	if n == 0 {
		return nil, nil
	}
	if p == nil {
		return nil, &kv.Error{Code: kv.InvalidParams, Msg: fmt.Sprintf("no array for %d values", n)}
	}
	return unsafe.Slice((*uint64)(unsafe.Pointer(p)), n), nil
}

// itemsOf builds the batch's items: key i gathers (or scatters over) counts[i] parts (counts
// NULL: one each), taken in order from addrs and sizes.
func itemsOf(keys []string, counts *C.uint32_t, addrs, sizes *C.uint64_t) ([]kv.Item, error) {
	per := make([]uint64, len(keys))
	var total uint64
	var cs []uint32
	if counts != nil && len(keys) > 0 {
		cs = unsafe.Slice((*uint32)(unsafe.Pointer(counts)), len(keys))
	}
	for i := range keys {
		per[i] = 1
		if cs != nil {
			per[i] = uint64(cs[i])
		}
		total += per[i]
	}
	if total > 64*maxItems {
		return nil, &kv.Error{Code: kv.InvalidParams, Msg: fmt.Sprintf("%d parts in one batch (at most %d)", total, 64*maxItems)}
	}
	as, err := words(addrs, total)
	if err != nil {
		return nil, err
	}
	ss, err := words(sizes, total)
	if err != nil {
		return nil, err
	}
	spans := make([]kv.Span, total)
	for k := range spans {
		spans[k] = kv.Span{Addr: as[k], Size: ss[k]}
	}
	items := make([]kv.Item, len(keys))
	var at uint64
	for i, k := range keys {
		items[i] = kv.Item{Key: k, Parts: spans[at : at+per[i] : at+per[i]]}
		at += per[i]
	}
	return items, nil
}

// keysFor is a batch call's keys (keysOf), refusing a missing output array.
func keysFor(n C.uint64_t, keys unsafe.Pointer, keysSize C.uint64_t, out unsafe.Pointer) ([]string, error) {
	ks, err := keysOf(keys, keysSize, n)
	if err == nil && out == nil && n > 0 {
		err = &kv.Error{Code: kv.InvalidParams, Msg: "no output array"}
	}
	return ks, err
}

// batchOf is a batch call's items (keysFor, itemsOf).
func batchOf(n C.uint64_t, keys unsafe.Pointer, keysSize C.uint64_t, counts *C.uint32_t, addrs, sizes *C.uint64_t, out unsafe.Pointer) ([]kv.Item, error) {
	ks, err := keysFor(n, keys, keysSize, out)
	if err != nil {
		return nil, err
	}
	return itemsOf(ks, counts, addrs, sizes)
}

// hmc_kv_batch_put stores n objects: their keys NUL-terminated one after another in the
// keys_size bytes at keys, object i gathered from counts[i] parts (counts NULL: one) of addrs
// and sizes, in replicas replicas; upsert != 0 rewrites keys that exist. out[i] is each one's
// code (0 or negative); the call returns 0, or a negative code when it could not start.
//
//export hmc_kv_batch_put
func hmc_kv_batch_put(h C.uint64_t, n C.uint64_t, keys unsafe.Pointer, keysSize C.uint64_t, counts *C.uint32_t, addrs, sizes *C.uint64_t, replicas, upsert C.int, out *C.int32_t) C.int32_t {
	return onClient(h, func(ctx context.Context, c *kv.Client) error {
		items, err := batchOf(n, keys, keysSize, counts, addrs, sizes, unsafe.Pointer(out))
		if err != nil {
			return err
		}
		res := unsafe.Slice((*int32)(unsafe.Pointer(out)), len(items))
		for i, err := range c.BatchPut(ctx, items, kv.PutOptions{Replicas: int(replicas), Upsert: upsert != 0}) {
			res[i] = int32(kv.CodeOf(err))
			if err != nil {
				cabi.SetError(err.Error())
			}
		}
		return nil
	})
}

// hmc_kv_batch_get reads n objects (keys as hmc_kv_batch_put's) into counts[i] parts each of
// addrs and sizes (their total is the capacity). out[i] is each object's size, or a negative
// code. The call returns 0, or a negative code when it could not start.
//
//export hmc_kv_batch_get
func hmc_kv_batch_get(h C.uint64_t, n C.uint64_t, keys unsafe.Pointer, keysSize C.uint64_t, counts *C.uint32_t, addrs, sizes *C.uint64_t, out *C.int64_t) C.int32_t {
	return onClient(h, func(ctx context.Context, c *kv.Client) error {
		items, err := batchOf(n, keys, keysSize, counts, addrs, sizes, unsafe.Pointer(out))
		if err != nil {
			return err
		}
		res := unsafe.Slice((*int64)(unsafe.Pointer(out)), len(items))
		got, errs := c.BatchGet(ctx, items)
		for i, err := range errs {
			res[i] = int64(got[i])
			if err != nil {
				res[i] = int64(kv.CodeOf(err))
				cabi.SetError(err.Error())
			}
		}
		return nil
	})
}

// hmc_kv_batch_exist writes 1 or 0 into out[i] for each of n keys (as hmc_kv_batch_put's).
//
//export hmc_kv_batch_exist
func hmc_kv_batch_exist(h C.uint64_t, n C.uint64_t, keys unsafe.Pointer, keysSize C.uint64_t, out *C.int32_t) C.int32_t {
	return onClient(h, func(ctx context.Context, c *kv.Client) error {
		ks, err := keysFor(n, keys, keysSize, unsafe.Pointer(out))
		if err != nil || n == 0 {
			return err
		}
		yes, err := c.BatchExist(ctx, ks)
		if err != nil {
			return err
		}
		res := unsafe.Slice((*int32)(unsafe.Pointer(out)), len(ks))
		for i, y := range yes {
			res[i] = 0
			if y {
				res[i] = 1
			}
		}
		return nil
	})
}

// hmc_kv_batch_remove removes n keys (as hmc_kv_batch_put's; leased ones only if force) and
// writes each one's code into out.
//
//export hmc_kv_batch_remove
func hmc_kv_batch_remove(h C.uint64_t, n C.uint64_t, keys unsafe.Pointer, keysSize C.uint64_t, force C.int, out *C.int32_t) C.int32_t {
	return onClient(h, func(ctx context.Context, c *kv.Client) error {
		ks, err := keysFor(n, keys, keysSize, unsafe.Pointer(out))
		if err != nil || n == 0 {
			return err
		}
		res := unsafe.Slice((*int32)(unsafe.Pointer(out)), len(ks))
		for i, err := range c.BatchRemove(ctx, ks, force != 0) {
			res[i] = int32(kv.CodeOf(err))
		}
		return nil
	})
}
