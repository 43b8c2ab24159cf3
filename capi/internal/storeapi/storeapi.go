//go:build cgo

package storeapi

/*
#include <stdint.h>
*/
import "C"

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"time"
	"unsafe"

	"github.com/hmc-go/hmc/capi/internal/cabi"
	"github.com/hmc-go/hmc/coord/group"
	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/status"
)

// storeHandle is a store client and, when this process serves the store, its server.
type storeHandle struct {
	c   store.Client
	srv *store.Server
}

func storeConfig(rank, world, timeoutMS C.int) (store.Config, error) {
	cfg := store.Config{WorldSize: int(world)}
	switch {
	case rank >= 0:
		cfg.Ranking, cfg.Rank = store.Explicit, int(rank)
	case rank == -1:
		cfg.Ranking = store.Auto
	case rank == -2:
	default:
		return cfg, fmt.Errorf("hmc: store rank %d (>= 0, -1 auto, -2 none): %w", int(rank), status.ErrInvalidConfig)
	}
	if timeoutMS > 0 {
		cfg.DialTimeout = time.Duration(timeoutMS) * time.Millisecond
	}
	return cfg, nil
}

//export hmc_store_open
func hmc_store_open(url *C.char, rank, world, timeoutMS C.int, serve C.int, out *C.uint64_t) C.int {
	return hmc_store_open_secure(url, rank, world, timeoutMS, serve, nil, 0, nil, nil, nil, out)
}

// hmc_store_open_secure is hmc_store_open with the store's protections: a shared secret
// (secretLen bytes at secret; none when 0) and TLS from PEM files (tlsCert and tlsKey: this
// side's certificate and key, for mutual TLS or when serving; tlsCA: the authority the other
// side must be signed by). NULL or empty paths mean none.
//
//export hmc_store_open_secure
func hmc_store_open_secure(url *C.char, rank, world, timeoutMS C.int, serve C.int, secret unsafe.Pointer, secretLen C.uint64_t,
	tlsCert, tlsKey, tlsCA *C.char, out *C.uint64_t) C.int {
	return call(func() error {
		if url == nil || out == nil {
			return fmt.Errorf("hmc: store open with null arguments: %w", status.ErrInvalidConfig)
		}
		cfg, err := storeConfig(rank, world, timeoutMS)
		if err != nil {
			return err
		}
		scfg := store.ServerConfig{WorldSize: int(world)}
		if secretLen > 0 {
			b, err := hostBytes(secret, secretLen)
			if err != nil {
				return err
			}
			cfg.Secret = bytes.Clone(b)
			scfg.Secret = cfg.Secret
		}
		if cfg.TLS, err = store.TLSFromFiles(goString(tlsCert), goString(tlsKey), goString(tlsCA), false); err != nil {
			return err
		}
		if serve != 0 {
			if scfg.TLS, err = store.TLSFromFiles(goString(tlsCert), goString(tlsKey), goString(tlsCA), true); err != nil {
				return err
			}
		}
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		h := &storeHandle{}
		if serve != 0 {
			h.c, h.srv, err = store.ServeOrJoin(ctx, goString(url), scfg, cfg)
		} else {
			h.c, err = store.Open(ctx, goString(url), cfg)
		}
		if err != nil {
			return err
		}
		*out = C.uint64_t(cabi.Add(h))
		return nil
	})
}

//export hmc_store_rank
func hmc_store_rank(s C.uint64_t, rank *C.int, serving *C.int) C.int {
	return call(func() error {
		h, err := cabi.Get[*storeHandle](uint64(s))
		if err != nil {
			return err
		}
		if rank != nil {
			*rank = C.int(h.c.Rank())
		}
		if serving != nil {
			*serving = 0
			if h.srv != nil {
				*serving = 1
			}
		}
		return nil
	})
}

//export hmc_store_set
func hmc_store_set(s C.uint64_t, key *C.char, val unsafe.Pointer, n C.uint64_t, timeoutMS C.int) C.int {
	return call(func() error {
		h, err := cabi.Get[*storeHandle](uint64(s))
		if err != nil {
			return err
		}
		v, err := hostBytes(val, n)
		if err != nil {
			return err
		}
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		return h.c.Set(ctx, goString(key), v)
	})
}

// hmc_store_get waits up to wait_ms for the key (0: not at all, < 0: until timeout_ms) and
// copies its value into buf; *len gets the value's length even when it does not fit (then the
// call fails with INVALID_CONFIG and copies nothing).
//
//export hmc_store_get
func hmc_store_get(s C.uint64_t, key *C.char, waitMS C.int, buf unsafe.Pointer, capacity C.uint64_t, length *C.uint64_t, timeoutMS C.int) C.int {
	return call(func() error {
		h, err := cabi.Get[*storeHandle](uint64(s))
		if err != nil {
			return err
		}
		if length == nil {
			return fmt.Errorf("hmc: store get with a null length: %w", status.ErrInvalidConfig)
		}
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		wait := time.Duration(waitMS) * time.Millisecond
		if waitMS < 0 {
			wait = store.Forever
		}
		v, err := h.c.Get(ctx, goString(key), wait)
		if err != nil {
			return err
		}
		return deliver("value", v, buf, capacity, length)
	})
}

//export hmc_store_add
func hmc_store_add(s C.uint64_t, key *C.char, delta C.int64_t, out *C.int64_t, timeoutMS C.int) C.int {
	return call(func() error {
		h, err := cabi.Get[*storeHandle](uint64(s))
		if err != nil {
			return err
		}
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		n, err := h.c.Add(ctx, goString(key), int64(delta))
		if err == nil && out != nil {
			*out = C.int64_t(n)
		}
		return err
	})
}

// deliver copies b into the caller's buffer of capacity bytes and sets *length to len(b), also
// when b does not fit (then nothing is copied and the call fails with INVALID_CONFIG).
func deliver(what string, b []byte, buf unsafe.Pointer, capacity C.uint64_t, length *C.uint64_t) error {
	*length = C.uint64_t(len(b))
	if uint64(len(b)) > uint64(capacity) {
		return fmt.Errorf("hmc: %s of %d bytes, buffer of %d: %w", what, len(b), uint64(capacity), status.ErrInvalidConfig)
	}
	dst, err := hostBytes(buf, C.uint64_t(len(b)))
	if err != nil {
		return err
	}
	copy(dst, b)
	return nil
}

//export hmc_store_close
func hmc_store_close(s C.uint64_t) C.int {
	return call(func() error {
		h, err := cabi.Get[*storeHandle](uint64(s))
		if err != nil {
			return err
		}
		cabi.Remove(uint64(s))
		err = h.c.Close()
		if h.srv != nil {
			if e := h.srv.Close(); err == nil {
				err = e
			}
		}
		return err
	})
}

//export hmc_store_group_open
func hmc_store_group_open(s C.uint64_t, name *C.char, size, timeoutMS C.int, out *C.uint64_t) C.int {
	return call(func() error {
		h, err := cabi.Get[*storeHandle](uint64(s))
		if err != nil {
			return err
		}
		if out == nil || size <= 0 {
			return fmt.Errorf("hmc: store group of size %d: %w", int(size), status.ErrInvalidConfig)
		}
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		g, err := group.New(ctx, h.c, goString(name), group.Config{Size: int(size)})
		if err != nil {
			return err
		}
		*out = C.uint64_t(cabi.Add(g))
		return nil
	})
}

//export hmc_store_group_barrier
func hmc_store_group_barrier(g C.uint64_t, timeoutMS C.int) C.int {
	return call(func() error {
		grp, err := cabi.Get[*group.Group](uint64(g))
		if err != nil {
			return err
		}
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		return grp.Barrier(ctx)
	})
}

// hmc_store_group_allgather writes every member's contribution in rank order into out, each as
// a uint32 little-endian length and the bytes; *outlen gets the total (also when out is too
// small, then INVALID_CONFIG).
//
//export hmc_store_group_allgather
func hmc_store_group_allgather(g C.uint64_t, data unsafe.Pointer, n C.uint64_t, out unsafe.Pointer, capacity C.uint64_t, outlen *C.uint64_t, timeoutMS C.int) C.int {
	return call(func() error {
		grp, err := cabi.Get[*group.Group](uint64(g))
		if err != nil {
			return err
		}
		if outlen == nil {
			return fmt.Errorf("hmc: allgather with a null length: %w", status.ErrInvalidConfig)
		}
		in, err := hostBytes(data, n)
		if err != nil {
			return err
		}
		ctx, cancel := deadline(timeoutMS)
		defer cancel()
		parts, err := grp.AllGather(ctx, in)
		if err != nil {
			return err
		}
		var all []byte
		for _, p := range parts {
			all = binary.LittleEndian.AppendUint32(all, uint32(len(p)))
			all = append(all, p...)
		}
		return deliver("allgather", all, out, capacity, outlen)
	})
}

//export hmc_store_group_close
func hmc_store_group_close(g C.uint64_t) C.int {
	return call(func() error {
		grp, err := cabi.Get[*group.Group](uint64(g))
		if err != nil {
			return err
		}
		cabi.Remove(uint64(g))
		return grp.Close()
	})
}
