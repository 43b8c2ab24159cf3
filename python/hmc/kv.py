"""hmc.kv: the KV-cache pool (fabric/kv) with Mooncake Store's Python contract.

``MooncakeDistributedStore`` keeps Mooncake's names, arguments and return conventions for what
exists so far: ``setup`` (0 or a negative Mooncake error code), ``put`` (0 or negative),
``get`` (the value, or empty bytes on failure), ``get_size`` (the size or negative),
``is_exist`` (1, 0, or negative), ``remove`` / ``remove_by_regex`` / ``remove_all`` (0 or a
count, or negative), ``get_hostname`` and ``close``. Batch and zero-copy forms, ``upsert``,
tensors and the ``mooncake.store`` import path come with the rest of issue 35 (docs/kv.md).
A failure's reason is in ``last_error``.

``Master`` serves a pool's master in this process (tests, tools); ``hmc kv master`` is the
command that serves one on its own.
"""

import ctypes

from . import _b
from ._lib import LIB as _L

__all__ = ["MooncakeDistributedStore", "Master"]

OBJECT_NOT_FOUND = -704


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


class MooncakeDistributedStore:
    """Mooncake Store's client, on HMC-Go's pool."""

    def __init__(self):
        self._h = 0
        self.last_error = ""

    def _rc(self, rc):
        self.last_error = "" if rc >= 0 else _err()
        return rc

    def setup(self, local_hostname, metadata_server, global_segment_size=16 << 20, local_buffer_size=16 << 20,
              protocol="tcp", rdma_devices="", master_server_addr="127.0.0.1:50051"):
        """Joins the pool at master_server_addr, lending global_segment_size bytes. 0, or a
        negative Mooncake error code. local_buffer_size is accepted (the pool copies out of the
        caller's own memory); protocol "tcp" or "rdma" (same-host peers use shared memory)."""
        if self._h:
            self.last_error = "setup: already set up"
            return -600
        if protocol not in ("tcp", "rdma"):
            self.last_error = f"setup: protocol {protocol!r} (tcp or rdma)"
            return -600
        meta = metadata_server if metadata_server not in (None, "", "P2PHANDSHAKE") else "P2PHANDSHAKE"
        h = ctypes.c_uint64()
        rc = _L.hmc_kv_client_create(_b(master_server_addr), _b(local_hostname or "127.0.0.1"), _b(meta),
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

    def put(self, key, value, config=None):
        """Stores value (bytes-like) under key: 0, or a negative code (OBJECT_ALREADY_EXISTS for
        a key that exists). config: a replica count (int) or an object with replica_num."""
        if not self._ready():
            return -600
        reps = 1
        if config is not None:
            reps = int(getattr(config, "replica_num", config))
        mv = memoryview(value).cast("B")
        n = mv.nbytes
        if mv.readonly:
            buf = ctypes.c_char_p(bytes(mv))
            addr = ctypes.cast(buf, ctypes.c_void_p).value
        else:
            buf = (ctypes.c_char * n).from_buffer(mv) if n else None
            addr = ctypes.addressof(buf) if buf is not None else None
        rc = _L.hmc_kv_put(self._h, _b(key), addr, n, reps)
        del buf
        return self._rc(rc)

    def get_size(self, key):
        if not self._ready():
            return -600
        return self._rc(_L.hmc_kv_get_size(self._h, _b(key)))

    def get(self, key):
        """key's value as bytes; empty bytes when it cannot be read (last_error says why)."""
        n = self.get_size(key)
        if n <= 0:
            return b""
        buf = ctypes.create_string_buffer(n)
        got = self._rc(_L.hmc_kv_get_into(self._h, _b(key), buf, n))
        return buf.raw[:got] if got >= 0 else b""

    def is_exist(self, key):
        if not self._ready():
            return -600
        return self._rc(_L.hmc_kv_exist(self._h, _b(key)))

    def remove(self, key, force=False):
        if not self._ready():
            return -600
        return self._rc(_L.hmc_kv_remove(self._h, _b(key)))

    def remove_by_regex(self, regex_pattern, force=False):
        if not self._ready():
            return -600
        return self._rc(_L.hmc_kv_remove_regex(self._h, _b(regex_pattern)))

    def remove_all(self, force=False):
        if not self._ready():
            return -600
        return self._rc(_L.hmc_kv_remove_regex(self._h, None))

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
