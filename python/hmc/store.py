"""The config store (Go package coord/store) and its groups, for rendezvous and coordination.

``Store("tcp://127.0.0.1:29600", rank=None, world=4, serve=True)`` connects to the embedded store
(starting it in this process when the address is free and ``serve`` is set), or to etcd with an
``etcd://host:port[,host:port]/namespace`` URL. ``rank=None`` takes the lowest free rank below
``world``; an int claims that rank; ``rank=False`` connects without one.
"""

import ctypes
import struct

from . import DEFAULT_TIMEOUT, Status, _b, _check, _ms
from ._lib import LIB as _L

__all__ = ["Store", "StoreGroup"]


def _sized(cap, what, call):
    """Runs call(buf, cap, byref(length)) with a buffer of cap bytes, again with a larger one if
    the result did not fit (the C side reports the length it needs), and returns the bytes."""
    while True:
        buf = ctypes.create_string_buffer(cap)
        n = ctypes.c_uint64()
        rc = call(buf, cap, ctypes.byref(n))
        if rc == Status.INVALID_CONFIG and n.value > cap:
            cap = n.value
            continue
        _check(rc, what)
        return buf.raw[:n.value]


def _opt(path):
    return None if path is None else _b(str(path))


class Store:
    def __init__(self, url, rank=None, world=0, serve=False, timeout=DEFAULT_TIMEOUT, *, secret=None,
                 tls_cert=None, tls_key=None, tls_ca=None):
        """Connects to the store at url (serve=True: serves it if nobody does yet).

        ``secret`` (bytes or str) is the store's shared secret (``hmc store serve --secret-file``);
        ``tls_cert``/``tls_key`` are this side's PEM certificate and key (mutual TLS, or when
        serving) and ``tls_ca`` the authority the other side must be signed by."""
        r = -1 if rank is None else (-2 if rank is False else int(rank))
        h = ctypes.c_uint64()
        if isinstance(secret, str):
            secret = secret.encode()
        sec = bytes(secret or b"")
        _check(_L.hmc_store_open_secure(_b(url), r, int(world), _ms(timeout), 1 if serve else 0, sec or None,
                                        len(sec), _opt(tls_cert), _opt(tls_key), _opt(tls_ca), ctypes.byref(h)),
               "store open")
        self._h, self.url, self.timeout = h.value, url, timeout

    @property
    def rank(self):
        r, s = ctypes.c_int(), ctypes.c_int()
        _check(_L.hmc_store_rank(self._h, ctypes.byref(r), ctypes.byref(s)), "store rank")
        return r.value

    @property
    def serving(self):
        """True when this process runs the embedded store (keep it open until the job ends)."""
        r, s = ctypes.c_int(), ctypes.c_int()
        _check(_L.hmc_store_rank(self._h, ctypes.byref(r), ctypes.byref(s)), "store rank")
        return bool(s.value)

    def set(self, key, value):
        value = bytes(value)
        _check(_L.hmc_store_set(self._h, _b(key), value, len(value), _ms(self.timeout)), "store set")

    def get(self, key, wait=0.0):
        """The value of key; ``wait`` seconds for it to appear (None: until the timeout).
        Absent: HMCStatusError with NOT_FOUND; waited in vain: TIMEOUT."""
        wait_ms = -1 if wait is None else int(wait * 1000)
        return _sized(4096, "store get", lambda buf, cap, n: _L.hmc_store_get(
            self._h, _b(key), wait_ms, buf, cap, n, _ms(self.timeout)))

    def add(self, key, delta=1):
        out = ctypes.c_int64()
        _check(_L.hmc_store_add(self._h, _b(key), int(delta), ctypes.byref(out), _ms(self.timeout)), "store add")
        return out.value

    def group(self, name, size):
        return StoreGroup(self, name, size)

    def close(self):
        if self._h:
            h, self._h = self._h, 0
            _check(_L.hmc_store_close(h), "store close")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class StoreGroup:
    """A static group of store ranks 0..size-1: barrier and rank-ordered allgather."""

    def __init__(self, store, name, size):
        h = ctypes.c_uint64()
        _check(_L.hmc_store_group_open(store._h, _b(name), int(size), _ms(store.timeout), ctypes.byref(h)),
               "store group open")
        self._h, self.store, self.size = h.value, store, size

    def barrier(self, timeout=DEFAULT_TIMEOUT):
        _check(_L.hmc_store_group_barrier(self._h, _ms(timeout)), "store barrier")

    def allgather(self, data, timeout=DEFAULT_TIMEOUT):
        """Every member's ``data`` (bytes), as a list in rank order."""
        data = bytes(data)
        raw = _sized(max(4096, (len(data) + 4) * self.size), "store allgather", lambda buf, cap, n:
                     _L.hmc_store_group_allgather(self._h, data, len(data), buf, cap, n, _ms(timeout)))
        parts, off = [], 0
        while off < len(raw):
            (ln,) = struct.unpack_from("<I", raw, off)
            parts.append(raw[off + 4:off + 4 + ln])
            off += 4 + ln
        return parts

    def close(self):
        if self._h:
            h, self._h = self._h, 0
            _check(_L.hmc_store_group_close(h), "store group close")


