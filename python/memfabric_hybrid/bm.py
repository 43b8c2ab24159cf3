"""memfabric_hybrid.bm: Big Memory (upstream's names and defaults; pointers are ints)."""

import ctypes
from enum import IntEnum

from hmc import _sizes, _u64

from . import _smem
from ._smem import L as _L
from ._smem import b as _b


class BmMemType(IntEnum):
    LOCAL_DEVICE = 0
    LOCAL_HOST = 1
    DEVICE = 2
    HOST = 3


class BmCopyType(IntEnum):
    L2G = 0
    G2L = 1
    G2H = 2
    H2G = 3
    L2GH = 4
    GH2L = 5
    GH2H = 6
    H2GH = 7
    G2G = 8
    AUTO = 9


class BmDataOpType(IntEnum):
    SDMA = 1
    HOST_RDMA = 2
    HOST_TCP = 4
    DEVICE_RDMA = 8
    HOST_URMA = 16
    HOST_SHM = 32  # ours: co-located ranks copy through each other's mapped slices


class BmConfig:
    """smem_bm_config_t's defaults (smem_bm_config_init): 120 s timeouts, start_store and
    auto_ranking on."""

    def __init__(self):
        c = _smem.BmConfigC()
        _L.smem_bm_config_init(ctypes.byref(c))
        self._c = c

    init_timeout = _smem.cfield("initTimeout")
    create_timeout = _smem.cfield("createTimeout")
    operation_timeout = _smem.cfield("controlOperationTimeout")
    start_store = _smem.cfield("startConfigStoreServer")
    start_store_only = _smem.cfield("startConfigStoreOnly")
    dynamic_world_size = _smem.cfield("dynamicWorldSize")
    unified_address_space = _smem.cfield("unifiedAddressSpace")
    auto_ranking = _smem.cfield("autoRanking")
    rank_id = _smem.cfield("rankId")
    flags = _smem.cfield("flags")

    def set_nic(self, url):
        """The data-plane address, "tcp://ip:port" (upstream's hcomUrl)."""
        self._c.hcomUrl = _b(url)[:63]


def initialize(store_url, world_size, device_id=0, config=None):
    cfg = config or BmConfig()
    return _L.smem_bm_init(_b(store_url), int(world_size), int(device_id), ctypes.byref(cfg._c))


def uninitialize(flags=0):
    _L.smem_bm_uninit(flags)


def bm_rank_id():
    return _L.smem_bm_get_rank_id()


def create(id, local_dram_size, local_hbm_size=0, data_op_type=BmDataOpType.HOST_TCP, flags=0):
    _sizes(id=id, local_dram_size=local_dram_size, local_hbm_size=local_hbm_size)
    """A Big Memory object; RuntimeError on failure. (Upstream's default data op is SDMA, which
    needs Ascend hardware; here it is HOST_TCP, with shared memory for co-located ranks.)"""
    h = _L.smem_bm_create(int(id), 0, int(data_op_type), int(local_dram_size), int(local_hbm_size), int(flags))
    if not h:
        raise RuntimeError("smem_bm_create: " + (_L.smem_get_and_clear_last_err_msg() or b"").decode())
    return BigMemory(h)


class BigMemory:
    def __init__(self, handle):
        self._h = handle

    def join(self, flags=0):
        return _L.smem_bm_join(self._h, flags)

    def leave(self, flags=0):
        return _L.smem_bm_leave(self._h, flags)

    def local_mem_size(self, mem_type=BmMemType.DEVICE):
        return _L.smem_bm_get_local_mem_size_by_mem_type(self._h, int(mem_type))

    def peer_rank_ptr(self, peer_rank, mem_type=BmMemType.DEVICE):
        return _L.smem_bm_ptr_by_mem_type(self._h, int(mem_type), int(peer_rank)) or 0

    def get_rank_id_by_gva(self, gva):
        return _L.smem_bm_get_rank_id_by_gva(self._h, int(gva))

    def register(self, addr, size):
        _sizes(addr=addr, size=size)
        return _L.smem_bm_register_user_mem(self._h, int(addr), int(size))

    def unregister(self, addr):
        return _L.smem_bm_unregister_user_mem(self._h, int(addr))

    def copy_data(self, src_ptr, dst_ptr, size, type, flags=0):
        _sizes(src_ptr=src_ptr, dst_ptr=dst_ptr, size=size)
        p = _smem.CopyParams(int(src_ptr), int(dst_ptr), int(size))
        return _L.smem_bm_copy(self._h, ctypes.byref(p), int(type), int(flags))

    def copy_data_batch(self, src_addrs, dst_addrs, sizes, count, type, flags=0):
        count = _u64("count", count, 0, min(len(src_addrs), len(dst_addrs), len(sizes)))
        p = _smem.BatchCopyParams(_smem.ptrs(src_addrs[:count], "src_addrs"), _smem.ptrs(dst_addrs[:count], "dst_addrs"),
                                  _smem.u64s(sizes[:count], "sizes"), count)
        return _L.smem_bm_copy_batch(self._h, ctypes.byref(p), int(type), int(flags))

    def wait(self):
        return _L.smem_bm_wait(self._h)

    def destroy(self):
        if self._h:
            h, self._h = self._h, None
            _L.smem_bm_destroy(h)

    def __del__(self):
        try:
            self.destroy()
        except Exception:
            pass
