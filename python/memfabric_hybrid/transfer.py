"""memfabric_hybrid's TransferEngine: upstream's _pymf_transfer module (also shipped as the
mf_adapter package), with its names, argument order and keyword names.

Upstream moves data with the Ascend NPU's engines (SDMA, device RDMA); here host memory moves
over shared memory (peers on this host), TCP or UCX, whatever data_op_type says. The four
``*_submit`` forms enqueue on an Ascend ACL stream upstream: given no stream (0 or None) they run
at once and are complete on return; given a stream they return -1, the reason in
``memfabric_hybrid.get_last_err_msg()``. Every call returns 0 or a negative error code, as
upstream's.
"""

import os
import socket
from enum import IntEnum

from hmc import _lib, _ptr, _u64

from . import _smem
from ._smem import L as _L
from ._smem import b as _b

__all__ = ["TransferEngine", "TransferOpcode", "TransDataOpType", "set_log_level", "create_config_store",
           "set_conf_store_tls"]

class TransferOpcode(IntEnum):
    Read = 0
    Write = 1


Read = TransferOpcode.Read  # upstream exports the values into the module
Write = TransferOpcode.Write


class TransDataOpType(IntEnum):
    """How upstream moves data (smem_bm_data_op_type); on this host every value moves host
    memory with the host transports."""
    SDMA = 1
    HOST_RDMA = 2
    HOST_TCP = 4
    DEVICE_RDMA = 8


SDMA = TransDataOpType.SDMA
DEVICE_RDMA = TransDataOpType.DEVICE_RDMA

_ROLES = {"Prefill": 1, "Decode": 2}


def _stream(stream):
    """0 for no stream, else the stream's value (refused by the library with the reason)."""
    return 0 if stream is None else _u64("stream", stream)


def set_log_level(level):
    return _L.smem_set_log_level(int(level))


def create_config_store(store_url):
    return _L.smem_create_config_store(_b(store_url))


def set_conf_store_tls(enable, tls_info):
    info = _b(tls_info or "")
    return _L.smem_set_conf_store_tls(bool(enable), info, len(info))


class TransferEngine:
    """upstream's TransferEngine (TransferAdapterPy)."""

    TransferOpcode = TransferOpcode
    TransDataOpType = TransDataOpType

    def __init__(self):
        self._h = None
        self._rpc = None

    def initialize(self, store_url, session_id, role, device_id, data_op_type=TransDataOpType.SDMA):
        """Starts the engine named session_id ("ip:port") on the config store at store_url
        (ASCEND_MF_STORE_URL when empty); role "Prefill" (sender) or "Decode" (receiver).
        device_id and data_op_type are accepted (host memory, host transports here). Returns
        0, or -1 with get_last_err_msg() set."""
        url = store_url or os.environ.get("ASCEND_MF_STORE_URL", "")
        if role not in _ROLES:
            raise ValueError(f"role must be 'Prefill' or 'Decode', got {role!r}")
        _u64("device_id", device_id)
        TransDataOpType(int(data_op_type))  # ValueError for a value upstream does not have
        cfg = _smem.TransConfigC()
        _L.smem_trans_config_init(cfg)
        cfg.role = _ROLES[role]
        cfg.deviceId = int(device_id)
        cfg.dataOpType = int(TransDataOpType.HOST_TCP)
        if self._rpc is not None and str(session_id).rsplit(":", 1)[-1] == str(self._rpc.getsockname()[1]):
            # get_rpc_port's port named in session_id: the engine serves on it now
            self._rpc.close()
            self._rpc = None
        h = _L.smem_trans_create(_b(url), _b(session_id), cfg)
        if not h:
            return -1
        self._h = h
        return 0

    def get_rpc_port(self):
        """A free TCP port in 15000..25000, held until initialize is given a session id with it
        (then the engine serves on it), as upstream's."""
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
        return _L.smem_trans_register_mem(self._h, _ptr("buffer_addr", buffer_addr), _u64("capacity", capacity), 0)

    def batch_register_memory(self, buffer_addrs, capacities):
        # _smem's conversion checks each entry (naming a wrong one) and takes NumPy arrays whole
        addrs, caps = _smem.ptrs(buffer_addrs, "buffer_addrs", _ptr), _smem.sizes(capacities, "capacities")
        if len(addrs) != len(caps) or not len(addrs) or len(addrs) > 1 << 20:
            return -1
        return _L.smem_trans_batch_register_mem(self._h, addrs, caps, len(caps), 0)

    def unregister_memory(self, buffer_addr):
        return _L.smem_trans_deregister_mem(self._h, _u64("buffer_addr", buffer_addr))

    def _one(self, fn, dest_session, buffer, peer_buffer, length, flags, *stream):
        return fn(self._h, _ptr("buffer", buffer), _b(dest_session), _u64("peer_buffer", peer_buffer),
                  _u64("length", length), *stream, int(flags))

    def _many(self, fn, dest_session, buffers, peer_buffers, lengths, flags, *stream):
        fast = _lib.batch_lists(buffers, peer_buffers, lengths)  # three lists of plain ints: one C call
        if fast is not None:
            n, a, b, c, keep = fast
            rc = fn(self._h, a, _b(dest_session), b, c, n, *stream, int(flags))
            del keep  # the library has read the lists
            return rc
        locs, rems = _smem.ptrs(buffers, "buffers", _ptr), _smem.ptrs(peer_buffers, "peer_buffers")
        lens = _smem.sizes(lengths, "lengths")
        if not (len(locs) == len(rems) == len(lens)) or not len(locs):
            return -1
        return fn(self._h, locs, _b(dest_session), rems, lens, len(lens), *stream, int(flags))

    def transfer_sync_write(self, dest_session, buffer, peer_buffer, length, flags=0):
        return self._one(_L.smem_trans_write, dest_session, buffer, peer_buffer, length, flags)

    def transfer_sync_read(self, dest_session, buffer, peer_buffer, length, flags=0):
        return self._one(_L.smem_trans_read, dest_session, buffer, peer_buffer, length, flags)

    def batch_transfer_sync_write(self, dest_session, buffers, peer_buffers, lengths, flags=0):
        return self._many(_L.smem_trans_batch_write, dest_session, buffers, peer_buffers, lengths, flags)

    def batch_transfer_sync_read(self, dest_session, buffers, peer_buffers, lengths, flags=0):
        return self._many(_L.smem_trans_batch_read, dest_session, buffers, peer_buffers, lengths, flags)

    def transfer_async_write_submit(self, dest_session, buffer, peer_buffer, length, stream, flags=0):
        return self._one(_L.smem_trans_write_submit, dest_session, buffer, peer_buffer, length, flags, _stream(stream))

    def transfer_async_read_submit(self, dest_session, buffer, peer_buffer, length, stream, flags=0):
        return self._one(_L.smem_trans_read_submit, dest_session, buffer, peer_buffer, length, flags, _stream(stream))

    def batch_transfer_async_write_submit(self, dest_session, buffers, peer_buffers, lengths, stream, flags=0):
        return self._many(_L.smem_trans_batch_write_submit, dest_session, buffers, peer_buffers, lengths, flags,
                          _stream(stream))

    def batch_transfer_async_read_submit(self, dest_session, buffers, peer_buffers, lengths, stream, flags=0):
        return self._many(_L.smem_trans_batch_read_submit, dest_session, buffers, peer_buffers, lengths, flags,
                          _stream(stream))

    def destroy(self):
        if self._h:
            h, self._h = self._h, None
            _L.smem_trans_destroy(h, 0)
        if self._rpc is not None:
            self._rpc.close()
            self._rpc = None

    def unInitialize(self):
        self.destroy()
