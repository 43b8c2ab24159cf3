"""memfabric_hybrid's TransferEngine (upstream's _pymf_transfer / mf_adapter names)."""

import os
import socket
from enum import IntEnum

from . import _smem
from ._smem import L as _L
from ._smem import b as _b


class TransferOpcode(IntEnum):
    Read = 0
    Write = 1


class TransDataOpType(IntEnum):
    SDMA = 1
    DEVICE_RDMA = 8
    HOST_RDMA = 2
    HOST_TCP = 4


_ROLES = {"Prefill": 1, "Decode": 2, "prefill": 1, "decode": 2, "Sender": 1, "Receiver": 2}


class TransferEngine:
    def __init__(self):
        self._h = None
        self._rpc = None

    def initialize(self, store_url, session_id, role, device_id=0, data_op_type=TransDataOpType.HOST_TCP):
        """role "Prefill" (sender) or "Decode" (receiver); store_url falls back to
        ASCEND_MF_STORE_URL. Upstream's default data op (SDMA) needs Ascend hardware: host
        transports are used. Returns 0, or -1 with get_last_err_msg() set."""
        url = store_url or os.environ.get("ASCEND_MF_STORE_URL", "")
        if role not in _ROLES:
            return -1
        cfg = _smem.TransConfigC()
        _L.smem_trans_config_init(cfg)
        cfg.role = _ROLES[role]
        cfg.deviceId = int(device_id)
        op = int(data_op_type)
        cfg.dataOpType = op if op in (2, 4) else 4
        h = _L.smem_trans_create(_b(url), _b(session_id), cfg)
        if not h:
            return -1
        self._h = h
        return 0

    def get_rpc_port(self):
        """A free TCP port in 15000..25000, kept bound for the caller's own RPC (as upstream)."""
        if self._rpc is None:
            for port in range(15000, 25000):
                s = socket.socket()
                try:
                    s.bind(("0.0.0.0", port))
                except OSError:
                    s.close()
                    continue
                self._rpc = s
                break
        return self._rpc.getsockname()[1] if self._rpc else -1

    def register_memory(self, buffer_addr, capacity):
        return _L.smem_trans_register_mem(self._h, int(buffer_addr), int(capacity), 0)

    def batch_register_memory(self, buffer_addrs, capacities):
        if len(buffer_addrs) != len(capacities) or not buffer_addrs:
            return -1
        return _L.smem_trans_batch_register_mem(self._h, _smem.ptrs(buffer_addrs), _smem.sizes(capacities),
                                                len(capacities), 0)

    def unregister_memory(self, buffer_addr):
        return _L.smem_trans_deregister_mem(self._h, int(buffer_addr))

    def transfer_sync_write(self, dest_session, buffer, peer_buffer, length, flags=0):
        return _L.smem_trans_write(self._h, int(buffer), _b(dest_session), int(peer_buffer), int(length), flags)

    def transfer_sync_read(self, dest_session, buffer, peer_buffer, length, flags=0):
        return _L.smem_trans_read(self._h, int(buffer), _b(dest_session), int(peer_buffer), int(length), flags)

    def batch_transfer_sync_write(self, dest_session, buffers, peer_buffers, lengths, flags=0):
        if not (len(buffers) == len(peer_buffers) == len(lengths)) or not buffers:
            return -1
        return _L.smem_trans_batch_write(self._h, _smem.ptrs(buffers), _b(dest_session), _smem.ptrs(peer_buffers),
                                         _smem.sizes(lengths), len(lengths), flags)

    def batch_transfer_sync_read(self, dest_session, buffers, peer_buffers, lengths, flags=0):
        if not (len(buffers) == len(peer_buffers) == len(lengths)) or not buffers:
            return -1
        return _L.smem_trans_batch_read(self._h, _smem.ptrs(buffers), _b(dest_session), _smem.ptrs(peer_buffers),
                                        _smem.sizes(lengths), len(lengths), flags)

    def destroy(self):
        if self._h:
            h, self._h = self._h, None
            _L.smem_trans_destroy(h, 0)
        if self._rpc is not None:
            self._rpc.close()
            self._rpc = None

    unInitialize = destroy
