"""memfabric_hybrid.shm: Share Memory's host side (upstream's names; the heap's data operations
are HMC-Go's Go API, fabric/shmem)."""

import ctypes
from enum import IntEnum

from hmc import _sizes

from . import _smem
from ._smem import L as _L
from ._smem import b as _b


class ShmDataOpType(IntEnum):
    MTE = 1
    SDMA = 2
    RDMA = 4


class ShmConfig:
    def __init__(self):
        c = _smem.ShmConfigC()
        _L.smem_shm_config_init(ctypes.byref(c))
        self._c = c

    init_timeout = _smem.cfield("shmInitTimeout")
    create_timeout = _smem.cfield("shmCreateTimeout")
    operation_timeout = _smem.cfield("controlOperationTimeout")
    start_store = _smem.cfield("startConfigStoreServer")
    flags = _smem.cfield("flags")


def initialize(store_url, world_size, rank_id, device_id=0, config=None):
    cfg = config or ShmConfig()
    return _L.smem_shm_init(_b(store_url), int(world_size), int(rank_id), int(device_id), ctypes.byref(cfg._c))


def uninitialize(flags=0):
    _L.smem_shm_uninit(flags)


def create(id, rank_size, rank_id, local_mem_size, data_op_type=ShmDataOpType.MTE, flags=0):
    _sizes(id=id, rank_size=rank_size, rank_id=rank_id, local_mem_size=local_mem_size)
    gva = ctypes.c_void_p()
    h = _L.smem_shm_create(int(id), int(rank_size), int(rank_id), int(local_mem_size), int(data_op_type), int(flags),
                           ctypes.byref(gva))
    if not h:
        raise RuntimeError("smem_shm_create: " + (_L.smem_get_and_clear_last_err_msg() or b"").decode())
    return ShareMemory(h, gva.value, rank_id, rank_size, local_mem_size)


class ShareMemory:
    def __init__(self, handle, gva, rank, size, block):
        self._h, self._gva, self._rank, self._size, self.block_size = handle, gva, rank, size, block

    @property
    def local_rank(self):
        return self._rank

    @property
    def rank_size(self):
        return self._size

    @property
    def gva(self):
        return self._gva

    def set_context(self, context):
        data = bytes(context)
        buf = ctypes.create_string_buffer(data, len(data))
        return _L.smem_shm_set_extra_context(self._h, buf, len(data))

    def query_support_data_operation(self):
        return _L.smem_shm_query_support_data_operation()

    def barrier(self):
        return _L.smem_shm_control_barrier(self._h)

    def all_gather(self, local_data):
        """Every rank's bytes (all the same length), in rank order; RuntimeError on failure
        (upstream drops the error)."""
        data = bytes(local_data)
        out = ctypes.create_string_buffer(len(data) * self._size)
        rc = _L.smem_shm_control_allgather(self._h, data, len(data), out, len(out))
        if rc != 0:
            raise RuntimeError("all_gather: " + (_L.smem_get_and_clear_last_err_msg() or b"").decode())
        return out.raw

    def topology_can_reach(self, remote_rank, reach_info=None):
        """The ShmDataOpType mask that reaches remote_rank (upstream's binding returns only a
        status and loses the mask); -1 on failure."""
        info = ctypes.c_uint32()
        if _L.smem_shm_topology_can_reach(self._h, int(remote_rank), ctypes.byref(info)) != 0:
            return -1
        return info.value

    def destroy(self, flags=0):
        if self._h:
            h, self._h = self._h, None
            return _L.smem_shm_destroy(h, flags)
        return 0
