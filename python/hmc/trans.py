"""The transfer engine (Go package fabric/trans) with Mooncake's Python API.

``from hmc.trans import TransferEngine`` replaces ``from mooncake.engine import
TransferEngine``: the method names, arguments and return conventions are Mooncake's (0 on
success and a negative number on failure; ``transfer_check_status`` 1 done, 0 in progress,
-1 failed, -2 timed out), so code written for Mooncake runs unchanged. Buffers are addresses
(ints), as in Mooncake; NumPy arrays and torch tensors (CPU) are also accepted where a local
buffer is expected, and stand for their data pointer. ``last_error`` holds the Go error text of
the last failure.

``initialize(local_hostname, metadata_server, protocol, device_name)``: local_hostname is
"ip" or "ip:port" (the engine's unique id; without a port one is picked, see
``get_rpc_port``); metadata_server "P2PHANDSHAKE" (no store), "tcp://host:port" (HMC's embedded
store) or "etcd://host:port"; protocol "tcp", "shm", "rdma"/"ucx" or a list "shm,tcp";
device_name is ignored (NIC selection is the transports' own).
"""

import ctypes
import json
from enum import IntEnum

from . import Status, _b
from ._lib import LIB as _L

__all__ = ["TransferEngine", "TransferOpcode", "TransferStatus"]


class TransferOpcode(IntEnum):
    Read = 0
    Write = 1
    READ = 0
    WRITE = 1


class TransferStatus(IntEnum):
    WAITING = 0
    PENDING = 1
    INVALID = 2
    CANCELED = 3
    COMPLETED = 4
    TIMEOUT = 5
    FAILED = 6


def _addr(buf):
    """An int address, or the data pointer of a NumPy array / torch tensor / ctypes object."""
    if isinstance(buf, int):
        return buf
    if hasattr(buf, "data_ptr"):  # torch
        return int(buf.data_ptr())
    if hasattr(buf, "ctypes"):  # numpy
        return int(buf.ctypes.data)
    return ctypes.addressof(buf)


def _arr(vals):
    return (ctypes.c_uint64 * len(vals))(*[int(v) for v in vals])


class TransferEngine:
    """Mooncake's TransferEngine over HMC-Go's transfer engine."""

    def __init__(self):
        self._h = None
        self._batches = {}
        self.last_error = ""
        self.timeout_ms = 30000

    def _rc(self, rc):
        if rc != Status.SUCCESS:
            self.last_error = (_L.hmc_last_error() or b"").decode(errors="replace")
            return -1
        return 0

    # Set-up.
    def initialize(self, local_hostname, metadata_server="P2PHANDSHAKE", protocol="tcp", device_name=""):
        host = local_hostname
        if host.startswith("["):
            if "]:" not in host:
                host += ":0"
        elif host.count(":") == 0:
            host += ":0"
        elif host.count(":") > 1:  # a bare IPv6 address
            host = "[" + host + "]:0"
        proto = {"rdma": "ucx,tcp", "tcp": "tcp", "shm": "shm,tcp"}.get(protocol, protocol)
        h = ctypes.c_uint64()
        rc = _L.hmc_trans_create(_b(metadata_server or "P2PHANDSHAKE"), _b(host), 3, _b(proto), self.timeout_ms, ctypes.byref(h))
        if self._rc(rc) == 0:
            self._h = h.value
            return 0
        return -1

    def initialize_ext(self, local_hostname, metadata_server, protocol, device_name, metadata_type=None):
        return self.initialize(local_hostname, metadata_server, protocol, device_name)

    def get_local_hostname(self):
        buf = ctypes.create_string_buffer(256)
        if self._rc(_L.hmc_trans_unique_id(self._h, buf, 256)) != 0:
            return ""
        return buf.value.decode()

    get_session_id = get_local_hostname

    def get_rpc_port(self):
        hp = self.get_local_hostname()
        return int(hp.rsplit(":", 1)[1]) if hp else -1

    def get_engine(self):
        return self._h

    # Memory.
    def register_memory(self, buffer_addr, capacity):
        return self._rc(_L.hmc_trans_register(self._h, _addr(buffer_addr), int(capacity)))

    def unregister_memory(self, buffer_addr):
        return self._rc(_L.hmc_trans_deregister(self._h, _addr(buffer_addr), self.timeout_ms))

    def batch_register_memory(self, buffer_addresses, capacities):
        if len(buffer_addresses) != len(capacities) or not buffer_addresses:
            self.last_error = "batch_register_memory: lists of different or zero length"
            return -1
        return self._rc(_L.hmc_trans_batch_register(self._h, _arr([_addr(a) for a in buffer_addresses]),
                                                    _arr(capacities), len(capacities)))

    def batch_unregister_memory(self, buffer_addresses):
        rc = 0
        for a in buffer_addresses:
            rc = min(rc, self.unregister_memory(a))
        return rc

    def allocate_managed_buffer(self, length):
        out = ctypes.c_uint64()
        if self._rc(_L.hmc_trans_malloc(self._h, int(length), ctypes.byref(out))) != 0:
            return 0
        return out.value

    def free_managed_buffer(self, buffer_addr, length=0):
        return self._rc(_L.hmc_trans_free(self._h, int(buffer_addr), self.timeout_ms))

    def _json(self, what, peer=None):
        cap = 1 << 16
        while True:
            buf = ctypes.create_string_buffer(cap)
            n = ctypes.c_uint64()
            rc = _L.hmc_trans_json(self._h, what, _b(peer) if peer else None, buf, cap, ctypes.byref(n), self.timeout_ms)
            if rc == Status.INVALID_CONFIG and n.value > cap:
                cap = n.value
                continue
            if self._rc(rc) != 0:
                return None
            return json.loads(buf.raw[:n.value] or b"null")

    def get_first_buffer_address(self, segment_name):
        bufs = self._json(1, segment_name)
        return bufs[0]["Addr"] if bufs else 0

    def send_notify(self, target_hostname, message):
        """Delivers a notification alone (Mooncake C++'s sendNotifyByName)."""
        return self._rc(_L.hmc_trans_notify(self._h, _b(target_hostname), _b(message), self.timeout_ms))

    def get_notifies(self):
        """Notifications received since the last call, as (sender, message) pairs."""
        return [(n["name"], n["msg"]) for n in (self._json(0) or [])]

    # Transfers.
    def _transfer(self, target, op, bufs, peers, lens, notify=None):
        if not (len(bufs) == len(peers) == len(lens)) or not bufs:
            self.last_error = "transfer: lists of different or zero length"
            return -1
        msg = None if notify is None else _b(notify if isinstance(notify, str) else notify[1])
        return self._rc(_L.hmc_trans_transfer(self._h, _b(target), int(op), _arr([_addr(b) for b in bufs]),
                                              _arr(peers), _arr(lens), len(lens), msg, self.timeout_ms))

    def transfer_sync_write(self, target_hostname, buffer, peer_buffer_address, length):
        return self._transfer(target_hostname, TransferOpcode.Write, [buffer], [peer_buffer_address], [length])

    def transfer_sync_read(self, target_hostname, buffer, peer_buffer_address, length):
        return self._transfer(target_hostname, TransferOpcode.Read, [buffer], [peer_buffer_address], [length])

    def transfer_sync(self, target_hostname, buffer, peer_buffer_address, length, opcode, notify=None):
        return self._transfer(target_hostname, opcode, [buffer], [peer_buffer_address], [length], notify)

    def batch_transfer_sync_write(self, target_hostname, buffers, peer_buffer_addresses, lengths):
        return self._transfer(target_hostname, TransferOpcode.Write, buffers, peer_buffer_addresses, lengths)

    def batch_transfer_sync_read(self, target_hostname, buffers, peer_buffer_addresses, lengths):
        return self._transfer(target_hostname, TransferOpcode.Read, buffers, peer_buffer_addresses, lengths)

    def batch_transfer_sync(self, target_hostname, buffers, peer_buffer_addresses, lengths, opcode, notify=None):
        return self._transfer(target_hostname, opcode, buffers, peer_buffer_addresses, lengths, notify)

    def _submit(self, target, op, bufs, peers, lens, notify=None):
        if not (len(bufs) == len(peers) == len(lens)) or not bufs:
            self.last_error = "submit: lists of different or zero length"
            return -1
        msg = None if notify is None else _b(notify if isinstance(notify, str) else notify[1])
        out = ctypes.c_uint64()
        if self._rc(_L.hmc_trans_submit(self._h, _b(target), int(op), _arr([_addr(b) for b in bufs]), _arr(peers),
                                        _arr(lens), len(lens), msg, ctypes.byref(out))) != 0:
            return -1
        return out.value

    def transfer_submit_write(self, target_hostname, buffer, peer_buffer_address, length):
        return self._submit(target_hostname, TransferOpcode.Write, [buffer], [peer_buffer_address], [length])

    def transfer_submit_read(self, target_hostname, buffer, peer_buffer_address, length):
        return self._submit(target_hostname, TransferOpcode.Read, [buffer], [peer_buffer_address], [length])

    def batch_transfer_async_write(self, target_hostname, buffers, peer_buffer_addresses, lengths):
        return self._submit(target_hostname, TransferOpcode.Write, buffers, peer_buffer_addresses, lengths)

    def batch_transfer_async_read(self, target_hostname, buffers, peer_buffer_addresses, lengths):
        return self._submit(target_hostname, TransferOpcode.Read, buffers, peer_buffer_addresses, lengths)

    def transfer_check_status(self, batch_id):
        """1 completed, 0 in progress, -1 failed, -2 timed out (Mooncake's convention). A
        finished batch is forgotten once its status has been read."""
        st = ctypes.c_int()
        if self._rc(_L.hmc_trans_status(self._h, int(batch_id), ctypes.byref(st))) != 0:
            return -1
        s = TransferStatus(st.value)
        if s in (TransferStatus.WAITING, TransferStatus.PENDING):
            return 0
        rc = _L.hmc_trans_wait(self._h, int(batch_id), 1)
        if s == TransferStatus.COMPLETED and rc == Status.SUCCESS:
            return 1
        self._rc(rc)
        return -2 if s == TransferStatus.TIMEOUT else -1

    def get_batch_transfer_status(self, batch_ids):
        """Waits for every batch; 0 when all completed, else -1."""
        rc = 0
        for b in batch_ids:
            if self._rc(_L.hmc_trans_wait(self._h, int(b), self.timeout_ms)) != 0:
                rc = -1
        return rc

    # Life cycle.
    def destroy(self):
        if self._h is not None:
            h, self._h = self._h, None
            return self._rc(_L.hmc_trans_destroy(h))
        return 0

    unInitialize = destroy

    def __del__(self):
        try:
            self.destroy()
        except Exception:
            pass
