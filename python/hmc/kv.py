"""hmc.kv: the KV-cache pool (fabric/kv) with Mooncake Store's Python contract.

``MooncakeDistributedStore`` keeps the names, arguments and return conventions of
``mooncake.store.MooncakeDistributedStore`` (mooncake-integration/store/store_py.cpp):

- ``setup`` / ``init_all`` / ``close`` / ``health_check``: 0, or a negative Mooncake error code
  (``health_check``: 0 healthy, 1 not set up or closed, 2 master unreachable).
- puts return 0 or a negative code: ``put``, ``put_from``, ``put_parts``, ``put_batch``, the
  ``upsert*`` forms (insert or update); the batch forms (``batch_put_from``,
  ``batch_put_from_multi_buffers``, ``batch_upsert_from``) a list with one code per key.
- reads: ``get`` (the value, or empty bytes), ``get_batch`` (a list of those), ``get_into`` (the
  object's size, or negative; the buffer must hold the whole object), ``batch_get_into`` and
  ``batch_get_into_multi_buffers`` (a list of those), ``get_buffer`` / ``batch_get_buffer`` (a
  ``BufferHandle``, or None).
- ``is_exist`` (1, 0, negative), ``batch_is_exist`` (a list of those), ``get_size``,
  ``remove`` / ``batch_remove`` / ``remove_by_regex`` / ``remove_all`` (each with ``force``).
- ``register_buffer`` / ``unregister_buffer`` (0 or negative), ``get_hostname``.
- tensors: ``put_tensor`` / ``get_tensor`` / ``batch_put_tensor`` / ``batch_get_tensor``
  (torch; CPU or CUDA tensors are put, tensors come back on the CPU).

Buffer pointers are ints as in Mooncake; torch tensors, NumPy arrays and objects with
``__cuda_array_interface__`` are accepted where a pointer is. A batch call crosses into the
library once (keys joined, addresses as one uint64 array) and the pool serves it with one call to
the master and one transfer batch per peer. A failure's reason is in ``last_error``.
``ReplicateConfig`` and ``MooncakeHostMemAllocator`` are Mooncake's helpers of the same names;
``python3 -m hmc.compat install`` serves this module as ``mooncake.store``.

``Master`` serves a pool's master in this process (tests, tools); ``hmc kv master`` is the
command that serves one on its own.
"""

import array
import ctypes
import mmap
import os
import re
import struct
import weakref

from . import _b
from ._lib import LIB as _L
from .trans import _addr, _arr, _vec

__all__ = ["MooncakeDistributedStore", "ReplicateConfig", "BufferHandle", "MooncakeHostMemAllocator", "Master"]

INVALID_PARAMS = -600
OBJECT_NOT_FOUND = -704
_MAX_KEYS = 1 << 16


def _err():
    msg = _L.hmc_last_error()
    return msg.decode() if msg else ""


class Master:
    """A master served by this process, on addr ("ip:port"; port 0: any)."""

    def __init__(self, addr="127.0.0.1:0", lease_ttl_ms=0, client_ttl_ms=0):
        buf = ctypes.create_string_buffer(128)
        h = ctypes.c_uint64()
        rc = _L.hmc_kv_master_start(_b(addr), int(lease_ttl_ms), int(client_ttl_ms), buf, len(buf), ctypes.byref(h))
        if rc != 0:
            raise RuntimeError(f"kv master on {addr}: {_err()}")
        self._h, self.addr = h.value, buf.value.decode()

    def stop(self):
        if self._h:
            h, self._h = self._h, 0
            _L.hmc_kv_master_stop(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class ReplicateConfig:
    """Mooncake's ReplicateConfig: replica_num copies, each in another client's segment. The
    placement hints (soft pin, preferred segments, same node) are accepted and not used."""

    def __init__(self):
        self.replica_num = 1
        self.with_soft_pin = False
        self.with_hard_pin = False
        self.preferred_segments = []
        self.preferred_segment = ""
        self.prefer_alloc_in_same_node = False

    def __str__(self):
        return f"ReplicateConfig: replica_num: {self.replica_num}"

    __repr__ = __str__


class BufferHandle:
    """An object's bytes in memory this process owns (Mooncake's BufferHandle): ptr(), size(),
    len() and the buffer protocol through memoryview(handle) or bytes(handle)."""

    def __init__(self, buf, n):
        self._buf, self._n = buf, n

    def ptr(self):
        return ctypes.addressof(self._buf)

    def size(self):
        return self._n

    def __len__(self):
        return self._n

    def __buffer__(self, flags):  # Python 3.12+
        return memoryview(self._buf).cast("B")[: self._n]

    def __bytes__(self):
        return bytes(memoryview(self._buf).cast("B")[: self._n])

    def __repr__(self):
        return f"<BufferHandle {self._n} bytes at {self.ptr():#x}>"


class MooncakeHostMemAllocator:
    """Mooncake's host allocator: alloc(size) returns the address of size bytes of page-aligned
    host memory (0 on failure), free(ptr) releases it (0, or -600 for an address it did not
    give)."""

    def __init__(self):
        self._maps = {}

    def alloc(self, size):
        try:
            m = mmap.mmap(-1, max(int(size), 1))
        except (OSError, ValueError, OverflowError):
            return 0
        addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        self._maps[addr] = m
        return addr

    def free(self, ptr):
        m = self._maps.pop(int(ptr), None)
        if m is None:
            return INVALID_PARAMS
        try:
            m.close()
        except BufferError:  # a view of it is alive (a tensor): the memory stays with it
            pass
        return 0


def _byte_size(s):
    """Mooncake's size syntax (utils.h try_string_to_byte_size): bytes, or a number and a unit
    K/KB, M/MB, G/GB, T/TB (1024-based, case-insensitive, spaces allowed), "infinite"; None when
    it is not one (a percentage, say)."""
    s = str(s).strip()
    if s == "infinite":
        return (1 << 64) - 1
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z]*)", s)
    if not m:
        return None
    mult = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "M": 1 << 20, "MB": 1 << 20, "G": 1 << 30, "GB": 1 << 30,
            "T": 1 << 40, "TB": 1 << 40}.get(m.group(2).upper())
    return None if mult is None else int(float(m.group(1)) * mult)


def _replicas(config):
    if config is None:
        return 1
    return int(getattr(config, "replica_num", config))


def _keys(keys):
    """keys as NUL-terminated bytes one after another, their count and a pointer to them."""
    if isinstance(keys, (str, bytes)):
        raise TypeError("keys must be a list of strings, not one string")
    enc = [k.encode() if isinstance(k, str) else bytes(k) for k in keys]
    if len(enc) > _MAX_KEYS:
        raise ValueError(f"{len(enc)} keys in one call (at most {_MAX_KEYS})")
    for k in enc:
        if b"\0" in k:
            raise ValueError(f"key {k!r} contains a NUL byte")
    blob = b"\0".join(enc) + b"\0" if enc else b""
    return blob, len(enc)


def _host(value):
    """(address, length, keep-alive) of a bytes-like value without copying it where Python
    allows: bytes directly, writable buffers through ctypes, other read-only buffers through
    NumPy when present, else a copy."""
    if isinstance(value, bytes):
        p = ctypes.c_char_p(value)
        return ctypes.cast(p, ctypes.c_void_p).value or 0, len(value), (value, p)
    mv = memoryview(value)
    if not mv.contiguous:
        raise ValueError("a value must be contiguous")
    mv = mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv
    n = mv.nbytes
    if n == 0:
        return 0, 0, None
    if not mv.readonly:
        buf = (ctypes.c_char * n).from_buffer(mv)
        return ctypes.addressof(buf), n, (mv, buf)
    try:
        import numpy as np
        a = np.frombuffer(mv, dtype=np.uint8)
        return a.ctypes.data, n, (mv, a)
    except ImportError:
        b = bytes(mv)
        p = ctypes.c_char_p(b)
        return ctypes.cast(p, ctypes.c_void_p).value, n, (b, p)


def _hosts(values):
    """_host of each value: (keep-alives, addresses, lengths)."""
    held, addrs, sizes = [], [], []
    for v in values:
        a, n, keep = _host(v)
        held.append(keep)
        addrs.append(a)
        sizes.append(n)
    return held, addrs, sizes


class MooncakeDistributedStore:
    """Mooncake Store's client, on HMC-Go's pool."""

    def __init__(self):
        self._h = 0
        self.last_error = ""

    # -- set-up --------------------------------------------------------------------------------

    def _rc(self, rc):
        self.last_error = "" if rc >= 0 else _err()
        return rc

    def _fail(self, why, rc=INVALID_PARAMS):
        self.last_error = why
        return rc

    def setup(self, local_hostname, metadata_server=None, global_segment_size=16 << 20, local_buffer_size=16 << 20,
              protocol="tcp", rdma_devices="", master_server_addr="127.0.0.1:50051", engine=None,
              enable_ssd_offload=False, ssd_offload_path="", tenant_id="default", enable_client_http_server=False,
              client_http_port=9300):
        """Joins the pool at master_server_addr, lending global_segment_size bytes. 0, or a
        negative Mooncake error code. local_buffer_size is accepted (puts and gets use the
        caller's memory directly); protocol "tcp", "rdma" (UCX's RDMA: a -tags ucx build on a host
        with an RDMA device, else refused saying so; MC_FORCE_TCP=1 makes it tcp, as the transfer
        engine's) or "ucx"; peers on one host use shared memory whatever the protocol.
        setup(config_dict) takes the same settings as a dict, as Mooncake's second form. An
        engine to share, SSD offload, another tenant and the client HTTP server are not
        supported: asking for them fails with the reason."""
        if isinstance(local_hostname, dict):
            cfg = {k: str(v) for k, v in local_hostname.items()}
            if "local_hostname" not in cfg or "metadata_server" not in cfg:
                return self._fail("setup: the config needs local_hostname and metadata_server")
            seg = _byte_size(cfg.get("global_segment_size", str(16 << 20)))
            buf = _byte_size(cfg.get("local_buffer_size", str(16 << 20)))
            if seg is None or buf is None:
                return self._fail(f"setup: sizes {cfg.get('global_segment_size')!r}, {cfg.get('local_buffer_size')!r} "
                                  "(bytes, or a number with K, KB, M, MB, G, GB, T, TB)")
            return self.setup(cfg["local_hostname"], cfg["metadata_server"], seg, buf,
                              cfg.get("protocol", "tcp"), cfg.get("rdma_devices", ""),
                              cfg.get("master_server_addr", "127.0.0.1:50051"),
                              enable_ssd_offload=cfg.get("enable_ssd_offload", "false").lower() in ("1", "true"),
                              tenant_id=cfg.get("tenant_id", "default"))
        if self._h:
            return self._fail("setup: already set up")
        proto = (protocol or "tcp").strip().lower()
        if proto == "rdma" and os.environ.get("MC_FORCE_TCP") == "1":
            proto = "tcp"
        if proto not in ("tcp", "rdma", "ucx"):
            return self._fail(f"setup: protocol {protocol!r} (tcp, rdma: UCX's RDMA, ucx)")
        for asked, what in ((engine is not None, "a shared transfer engine (engine=)"),
                            (enable_ssd_offload, "SSD offload"),
                            (tenant_id not in (None, "", "default"), f"tenant {tenant_id!r}"),
                            (enable_client_http_server, "the client HTTP server")):
            if asked:
                return self._fail(f"setup: {what} is not supported by HMC-Go's pool")
        meta = metadata_server if metadata_server not in (None, "", "P2PHANDSHAKE") else "P2PHANDSHAKE"
        h = ctypes.c_uint64()
        rc = _L.hmc_kv_client_create(_b(master_server_addr), _b(local_hostname or "127.0.0.1"), _b(meta), _b(proto),
                                     int(global_segment_size), ctypes.byref(h))
        if self._rc(rc) == 0:
            self._h = h.value
        return rc

    def init_all(self, protocol, device_name, mount_segment_size=16 << 20):
        """Mooncake's test entry: setup on 127.0.0.1 with the default master."""
        return self.setup("127.0.0.1", "P2PHANDSHAKE", mount_segment_size, 16 << 20, protocol, device_name)

    def _ready(self):
        if not self._h:
            self.last_error = "the store is not set up (setup first)"
            return False
        return True

    def health_check(self):
        """0 when the master answers, 1 when not set up or closed, 2 when the master does not
        answer."""
        if not self._h:
            return 1
        return 0 if self._rc(_L.hmc_kv_ping(self._h)) == 0 else 2

    def get_hostname(self):
        """This client's name in the pool (its transfer engine's ip:port)."""
        if not self._ready():
            return ""
        buf = ctypes.create_string_buffer(128)
        if self._rc(_L.hmc_kv_client_id(self._h, buf, len(buf))) != 0:
            return ""
        return buf.value.decode()

    def close(self):
        if self._h:
            h, self._h = self._h, 0
            return self._rc(_L.hmc_kv_client_close(h))
        return 0

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def allocate_and_mount_segment(self, size, protocol="tcp", location=""):
        """Lends one more segment of size bytes at location ("" or "cpu", "cuda:N", "hip:N"):
        {"ret": 0 or a negative code, "segment_ids": [its name], "allocated_size": size}."""
        out = {"ret": INVALID_PARAMS, "segment_ids": [], "allocated_size": 0}
        if not self._ready():
            return out
        if protocol not in ("tcp", "rdma"):
            self.last_error = f"allocate_and_mount_segment: protocol {protocol!r} (tcp or rdma)"
            return out
        buf = ctypes.create_string_buffer(256)
        rc = self._rc(_L.hmc_kv_mount_segment(self._h, int(size), _b(location or ""), buf, len(buf)))
        out["ret"] = rc
        if rc == 0:
            out["segment_ids"], out["allocated_size"] = [buf.value.decode()], int(size)
        return out

    def unmount_and_free_segment(self, segment_ids, grace_period_seconds=0):
        """Takes the segments out of the pool, waits grace_period_seconds for readers, frees
        them: 0, or the first failure's negative code."""
        if not self._ready():
            return INVALID_PARAMS
        ms = int(float(grace_period_seconds) * 1000)
        for sid in segment_ids:
            rc = self._rc(_L.hmc_kv_unmount_segment(self._h, _b(sid), ms))
            if rc != 0:
                return rc
        return 0

    def mount_segment(self, path, size, offset=0, protocol="tcp", location=""):
        """Mooncake mounts a file's memory here (shared memory, SSD); HMC-Go's pool lends memory
        it allocates: use allocate_and_mount_segment. Refused with the reason."""
        self.last_error = "mount_segment of a path is not supported: use allocate_and_mount_segment"
        return {"ret": INVALID_PARAMS, "segment_ids": []}

    def register_buffer(self, buffer_ptr, size):
        if not self._ready():
            return INVALID_PARAMS
        return self._rc(_L.hmc_kv_register_buffer(self._h, _addr("buffer_ptr", buffer_ptr), int(size)))

    def unregister_buffer(self, buffer_ptr):
        if not self._ready():
            return INVALID_PARAMS
        return self._rc(_L.hmc_kv_unregister_buffer(self._h, _addr("buffer_ptr", buffer_ptr)))

    # -- the one way in: batches of keys, each with parts --------------------------------------

    def _batch(self, what, keys, counts, addrs, sizes, call):
        """One batch call: keys[i] with counts[i] parts (None: one each) of addrs and sizes; call
        gets (n, keys blob, counts, addrs, sizes) as the library takes them and returns the
        call's code and its per-key results. A list of those results, or of the failure code."""
        n = len(keys)
        if not self._ready():
            return [INVALID_PARAMS] * n
        try:
            blob, n = _keys(keys)
            av, sv = _vec("buffer_ptrs", addrs, _addr), _vec("sizes", sizes)
            cv = array.array("I", counts) if counts is not None else None
        except (TypeError, ValueError, OverflowError) as e:
            return [self._fail(f"{what}: {e}")] * n
        if len(av) != len(sv) or len(av) != (sum(cv) if cv is not None else n):
            return [self._fail(f"{what}: {n} keys, {len(av)} pointers, {len(sv)} sizes")] * n
        rc, out = call(n, blob, _arr(cv) if cv is not None else None, _arr(av), _arr(sv))
        if rc != 0:
            return [self._rc(rc)] * n
        res = list(out)
        self.last_error = _err() if any(r < 0 for r in res) else ""
        return res

    def _put(self, keys, counts, addrs, sizes, config, upsert):
        """Codes of a batch put."""
        try:
            reps = _replicas(config)
        except (TypeError, ValueError) as e:
            return [self._fail(f"put: config: {e}")] * len(keys)

        def call(n, blob, cv, av, sv):
            out = (ctypes.c_int32 * n)()
            return _L.hmc_kv_batch_put(self._h, n, blob, len(blob), cv, av, sv, reps, 1 if upsert else 0, out), out
        return self._batch("put", keys, counts, addrs, sizes, call)

    def _get(self, keys, counts, addrs, sizes):
        """Sizes (or negative codes) of a batch get."""
        def call(n, blob, cv, av, sv):
            out = (ctypes.c_int64 * n)()
            return _L.hmc_kv_batch_get(self._h, n, blob, len(blob), cv, av, sv, out), out
        return self._batch("get", keys, counts, addrs, sizes, call)

    def _values(self, keys, values, config, upsert):
        held, addrs, sizes = _hosts(values)
        return self._put(keys, None, addrs, sizes, config, upsert)

    def _parts(self, key, parts, config, upsert):
        for p in parts:
            mv = memoryview(p)
            if mv.ndim != 1 or mv.itemsize != 1:
                raise RuntimeError("parts must be 1-D bytes-like")
        held, addrs, sizes = _hosts(parts)
        return self._put([key], [len(addrs)], addrs, sizes, config, upsert)[0]

    # -- puts ----------------------------------------------------------------------------------

    def put(self, key, value, config=None):
        """Stores value (bytes-like) under key: 0, or a negative code (OBJECT_ALREADY_EXISTS for a
        key that exists). config: a ReplicateConfig, or a replica count."""
        return self._values([key], [value], config, False)[0]

    def upsert(self, key, value, config=None):
        return self._values([key], [value], config, True)[0]

    def put_batch(self, keys, values, config=None):
        """Stores every value: 0, or the first failure's code."""
        if len(keys) != len(values):
            return self._fail(f"put_batch: {len(keys)} keys, {len(values)} values")
        return next((r for r in self._values(keys, values, config, False) if r != 0), 0)

    def upsert_batch(self, keys, values, config=None):
        if len(keys) != len(values):
            return self._fail(f"upsert_batch: {len(keys)} keys, {len(values)} values")
        return next((r for r in self._values(keys, values, config, True) if r != 0), 0)

    def put_parts(self, key, *parts, config=None):
        """Stores the parts' concatenation under key, without joining them first."""
        return self._parts(key, parts, config, False)

    def upsert_parts(self, key, *parts, config=None):
        return self._parts(key, parts, config, True)

    def put_from(self, key, buffer_ptr, size, config=None):
        """Stores size bytes at buffer_ptr (host or device memory) under key: 0 or negative."""
        return self._put([key], None, [buffer_ptr], [size], config, False)[0]

    def upsert_from(self, key, buffer_ptr, size, config=None):
        return self._put([key], None, [buffer_ptr], [size], config, True)[0]

    def batch_put_from(self, keys, buffer_ptrs, sizes, config=None):
        """Stores keys[i] from sizes[i] bytes at buffer_ptrs[i]: a list of codes."""
        return self._put(keys, None, buffer_ptrs, sizes, config, False)

    def batch_upsert_from(self, keys, buffer_ptrs, sizes, config=None):
        return self._put(keys, None, buffer_ptrs, sizes, config, True)

    def batch_put_from_multi_buffers(self, keys, all_buffer_ptrs, all_sizes, config=None):
        """Stores keys[i] gathered from the buffers all_buffer_ptrs[i] (sizes all_sizes[i])."""
        if len(all_buffer_ptrs) != len(keys) or len(all_sizes) != len(keys):
            return [self._fail("batch_put_from_multi_buffers: lists of different lengths")] * len(keys)
        if any(len(p) != len(s) for p, s in zip(all_buffer_ptrs, all_sizes)):
            return [self._fail("batch_put_from_multi_buffers: a key's pointers and sizes differ in number")] * len(keys)
        return self._put(keys, [len(p) for p in all_buffer_ptrs], [a for p in all_buffer_ptrs for a in p],
                         [s for ss in all_sizes for s in ss], config, False)

    # -- reads ---------------------------------------------------------------------------------

    def get_into(self, key, buffer_ptr, size):
        """Reads key's object into the size bytes at buffer_ptr: its size, or a negative code
        (INVALID_PARAMS when it is larger than size)."""
        return self._get([key], None, [buffer_ptr], [size])[0]

    def batch_get_into(self, keys, buffer_ptrs, sizes):
        return self._get(keys, None, buffer_ptrs, sizes)

    def batch_get_into_multi_buffers(self, keys, all_buffer_ptrs, all_sizes, prefer_alloc_in_same_node=False):
        """Reads keys[i] scattered over the buffers all_buffer_ptrs[i] (sizes all_sizes[i])."""
        if len(all_buffer_ptrs) != len(keys) or len(all_sizes) != len(keys):
            return [self._fail("batch_get_into_multi_buffers: lists of different lengths")] * len(keys)
        if any(len(p) != len(s) for p, s in zip(all_buffer_ptrs, all_sizes)):
            return [self._fail("batch_get_into_multi_buffers: a key's pointers and sizes differ in number")] * len(keys)
        return self._get(keys, [len(p) for p in all_buffer_ptrs], [a for p in all_buffer_ptrs for a in p],
                         [s for ss in all_sizes for s in ss])

    def get_size(self, key):
        if not self._ready():
            return INVALID_PARAMS
        return self._rc(_L.hmc_kv_get_size(self._h, _b(key)))

    def _fetch(self, key):
        """(address, size) of key's object in memory the library allocated (free with
        hmc_kv_free), read with one call to the master; None when it cannot be read."""
        if not self._ready():
            return None
        p, n = ctypes.c_void_p(), ctypes.c_uint64()
        if self._rc(_L.hmc_kv_get(self._h, _b(key), ctypes.byref(p), ctypes.byref(n))) != 0:
            return None
        return p.value, n.value

    def get_buffer(self, key):
        """A BufferHandle of key's object (None when it cannot be read); its memory is freed
        with the handle."""
        got = self._fetch(key)
        if got is None:
            return None
        p, n = got
        h = BufferHandle((ctypes.c_char * max(n, 1)).from_address(p), n)
        weakref.finalize(h, _L.hmc_kv_free, p)
        return h

    def batch_get_buffer(self, keys):
        """BufferHandles of the keys' objects (None for one that cannot be read)."""
        return [self.get_buffer(k) for k in keys]

    def get(self, key):
        """key's value as bytes; empty bytes when it cannot be read (last_error says why)."""
        got = self._fetch(key)
        if got is None:
            return b""
        p, n = got
        try:
            return ctypes.string_at(p, n)
        finally:
            _L.hmc_kv_free(p)

    def get_batch(self, keys):
        """The keys' values as bytes (empty bytes for one that cannot be read)."""
        return [self.get(k) for k in keys]

    def is_exist(self, key):
        if not self._ready():
            return INVALID_PARAMS
        return self._rc(_L.hmc_kv_exist(self._h, _b(key)))

    def batch_is_exist(self, keys):
        """1 or 0 for each key, or -1 for each when the master cannot be asked."""
        if not self._ready():
            return [-1] * len(keys)
        blob, n = _keys(keys)
        out = (ctypes.c_int32 * n)()
        if self._rc(_L.hmc_kv_batch_exist(self._h, n, blob, len(blob), out)) != 0:
            return [-1] * n
        return list(out)

    # -- removal -------------------------------------------------------------------------------

    def remove(self, key, force=False):
        if not self._ready():
            return INVALID_PARAMS
        return self._rc(_L.hmc_kv_remove(self._h, _b(key), 1 if force else 0))

    def batch_remove(self, keys, force=False):
        if not self._ready():
            return [INVALID_PARAMS] * len(keys)
        blob, n = _keys(keys)
        out = (ctypes.c_int32 * n)()
        rc = self._rc(_L.hmc_kv_batch_remove(self._h, n, blob, len(blob), 1 if force else 0, out))
        return list(out) if rc == 0 else [rc] * n

    def remove_by_regex(self, regex_pattern, force=False):
        if not self._ready():
            return INVALID_PARAMS
        return self._rc(_L.hmc_kv_remove_regex(self._h, _b(regex_pattern), 1 if force else 0))

    def remove_all(self, force=False):
        if not self._ready():
            return INVALID_PARAMS
        return self._rc(_L.hmc_kv_remove_regex(self._h, None, 1 if force else 0))

    # -- tensors -------------------------------------------------------------------------------

    def put_tensor(self, key, tensor, config=None):
        """Stores a torch tensor (CPU or CUDA; its dtype and shape with it): 0 or negative."""
        return self.batch_put_tensor([key], [tensor], config)[0]

    def batch_put_tensor(self, keys, tensors, config=None):
        if len(keys) != len(tensors):
            return [self._fail(f"batch_put_tensor: {len(keys)} keys, {len(tensors)} tensors")] * len(keys)
        heads, addrs, sizes, held = [], [], [], []
        for t in tensors:
            t = t.contiguous()
            held.append(t)
            h = _tensor_header(t)
            heads.append(h)
            addrs += [ctypes.cast(ctypes.c_char_p(h), ctypes.c_void_p).value, t.data_ptr()]
            sizes += [len(h), t.numel() * t.element_size()]
        return self._put(keys, [2] * len(keys), addrs, sizes, config, False)

    def get_tensor(self, key):
        """The tensor stored under key (on the CPU), or None."""
        return self.batch_get_tensor([key])[0]

    def batch_get_tensor(self, keys):
        out = []
        for h in self.batch_get_buffer(keys):
            try:
                out.append(_tensor_of(h) if h is not None else None)
            except ValueError as e:
                self.last_error = str(e)
                out.append(None)
        return out


_TENSOR_MAGIC = b"HMCT1\0"


def _tensor_header(t):
    dt = str(t.dtype).removeprefix("torch.").encode()
    return _TENSOR_MAGIC + struct.pack("<HH", len(dt), t.dim()) + dt + struct.pack(f"<{t.dim()}q", *t.shape)


def _tensor_of(h):
    import torch
    mv = memoryview(bytes(h))
    m = len(_TENSOR_MAGIC)
    if mv[:m] != _TENSOR_MAGIC or len(mv) < m + 4:
        raise ValueError("get_tensor: the object is not a tensor put by put_tensor")
    nd, ndim = struct.unpack_from("<HH", mv, m)
    off = m + 4
    dt = bytes(mv[off:off + nd]).decode()
    off += nd
    shape = struct.unpack_from(f"<{ndim}q", mv, off)
    off += 8 * ndim
    dtype = getattr(torch, dt, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"get_tensor: unknown dtype {dt!r}")
    data = bytearray(mv[off:])
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(data, dtype=dtype).reshape(shape)
