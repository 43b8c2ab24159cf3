"""memfabric_hybrid's C API (smem_*) in the library the hmc package loads: one loader, one
library (libhmc.so, which is also libmf_smem.so), one Go runtime per process."""

import ctypes

from hmc import _lib, _u64s
from hmc._lib import LIB as L

_u8, _u16, _u32, _u64, _i32, _int = ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int32, ctypes.c_int
_str, _ptr, _bool, _size = ctypes.c_char_p, ctypes.c_void_p, ctypes.c_bool, ctypes.c_size_t

TLS_PATH = 256


class TlsConfig(ctypes.Structure):
    _fields_ = [("tlsEnable", _bool)] + [(n, ctypes.c_char * TLS_PATH) for n in (
        "caPath", "crlPath", "certPath", "keyPath", "keyPassPath", "packagePath", "decrypterLibPath")]


class BmConfigC(ctypes.Structure):
    _fields_ = [("initTimeout", _u32), ("createTimeout", _u32), ("controlOperationTimeout", _u32),
                ("startConfigStoreServer", _bool), ("startConfigStoreOnly", _bool), ("dynamicWorldSize", _bool),
                ("unifiedAddressSpace", _bool), ("autoRanking", _bool), ("rankId", _u16), ("flags", _u32),
                ("hcomUrl", ctypes.c_char * 64), ("hcomTlsConfig", TlsConfig), ("storeTlsConfig", TlsConfig)]


class CopyParams(ctypes.Structure):
    _fields_ = [("src", _ptr), ("dest", _ptr), ("dataSize", _size)]


class BatchCopyParams(ctypes.Structure):
    _fields_ = [("sources", ctypes.POINTER(_ptr)), ("destinations", ctypes.POINTER(_ptr)),
                ("dataSizes", ctypes.POINTER(_u64)), ("batchSize", _u32)]


class ShmConfigC(ctypes.Structure):
    _fields_ = [("shmInitTimeout", _u32), ("shmCreateTimeout", _u32), ("controlOperationTimeout", _u32),
                ("startConfigStoreServer", _bool), ("flags", _u32)]


class TransConfigC(ctypes.Structure):
    _fields_ = [("role", _int), ("initTimeout", _u32), ("deviceId", _u32), ("flags", _u32), ("dataOpType", _int),
                ("startConfigServer", _bool)]


LOGGER = ctypes.CFUNCTYPE(None, _int, _str)
EXIT = ctypes.CFUNCTYPE(None, _int)

_SIGNATURES = {
    "smem_init": ([_u32], _i32),
    "smem_uninit": ([], None),
    "smem_create_config_store": ([_str], _i32),
    "smem_set_extern_logger": ([LOGGER], _i32),
    "smem_set_log_level": ([_int], _i32),
    "smem_set_conf_store_tls": ([_bool, _str, _u32], _i32),
    "smem_set_config_store_tls_key": ([_str, _u32, _str, _u32, _ptr], _i32),
    "smem_get_last_err_msg": ([], _str),
    "smem_get_and_clear_last_err_msg": ([], _str),
    "smem_bm_config_init": ([ctypes.POINTER(BmConfigC)], _i32),
    "smem_bm_init": ([_str, _u32, _u16, ctypes.POINTER(BmConfigC)], _i32),
    "smem_bm_uninit": ([_u32], None),
    "smem_bm_get_rank_id": ([], _u32),
    "smem_bm_create": ([_u32, _u32, _int, _u64, _u64, _u32], _ptr),
    "smem_bm_destroy": ([_ptr], None),
    "smem_bm_join": ([_ptr, _u32], _i32),
    "smem_bm_leave": ([_ptr, _u32], _i32),
    "smem_bm_get_local_mem_size_by_mem_type": ([_ptr, _int], _u64),
    "smem_bm_ptr_by_mem_type": ([_ptr, _int, _u16], _ptr),
    "smem_bm_get_rank_id_by_gva": ([_ptr, _ptr], _u32),
    "smem_bm_copy": ([_ptr, ctypes.POINTER(CopyParams), _int, _u32], _i32),
    "smem_bm_copy_batch": ([_ptr, ctypes.POINTER(BatchCopyParams), _int, _u32], _i32),
    "smem_bm_wait": ([_ptr], _i32),
    "smem_bm_register_user_mem": ([_ptr, _u64, _u64], _i32),
    "smem_bm_unregister_user_mem": ([_ptr, _u64], _i32),
    "smem_shm_config_init": ([ctypes.POINTER(ShmConfigC)], _i32),
    "smem_shm_init": ([_str, _u32, _u32, _u16, ctypes.POINTER(ShmConfigC)], _i32),
    "smem_shm_uninit": ([_u32], None),
    "smem_shm_query_support_data_operation": ([], _u32),
    "smem_shm_create": ([_u32, _u32, _u32, _u64, _int, _u32, ctypes.POINTER(_ptr)], _ptr),
    "smem_shm_destroy": ([_ptr, _u32], _i32),
    "smem_shm_set_extra_context": ([_ptr, _ptr, _u32], _i32),
    "smem_shm_get_global_rank": ([_ptr], _u32),
    "smem_shm_get_global_rank_size": ([_ptr], _u32),
    "smem_shm_control_barrier": ([_ptr], _i32),
    "smem_shm_control_allgather": ([_ptr, _ptr, _u32, _ptr, _u32], _i32),
    "smem_shm_subgroup_barrier": ([_ptr, _str, _u32, _u32], _i32),
    "smem_shm_subgroup_allgather": ([_ptr, _str, _u32, _u32, _ptr, _u32, _ptr, _u32], _i32),
    "smem_shm_topology_can_reach": ([_ptr, _u32, ctypes.POINTER(_u32)], _i32),
    "smem_shm_atomic_alloc_value": ([_ptr, _u32, ctypes.POINTER(_u32)], _i32),
    "smem_shm_atomic_release_value": ([_ptr, _i32], _i32),
    "smem_shm_register_exit": ([_ptr, EXIT], _i32),
    "smem_shm_global_exit": ([_ptr, _int], None),
    "smem_trans_config_init": ([ctypes.POINTER(TransConfigC)], _i32),
    "smem_trans_init": ([ctypes.POINTER(TransConfigC)], _i32),
    "smem_trans_uninit": ([_u32], None),
    "smem_trans_create": ([_str, _str, ctypes.POINTER(TransConfigC)], _ptr),
    "smem_trans_destroy": ([_ptr, _u32], None),
    "smem_trans_register_mem": ([_ptr, _ptr, _size, _u32], _i32),
    "smem_trans_batch_register_mem": ([_ptr, ctypes.POINTER(_ptr), ctypes.POINTER(_size), _u32, _u32], _i32),
    "smem_trans_deregister_mem": ([_ptr, _ptr], _i32),
    "smem_trans_write": ([_ptr, _ptr, _str, _ptr, _size, _u32], _i32),
    "smem_trans_batch_write": ([_ptr, _ptr, _str, _ptr, _ptr, _u32, _u32], _i32),
    "smem_trans_read": ([_ptr, _ptr, _str, _ptr, _size, _u32], _i32),
    "smem_trans_batch_read": ([_ptr, _ptr, _str, _ptr, _ptr, _u32, _u32], _i32),
    "smem_trans_write_submit": ([_ptr, _ptr, _str, _ptr, _size, _ptr, _u32], _i32),
    "smem_trans_read_submit": ([_ptr, _ptr, _str, _ptr, _size, _ptr, _u32], _i32),
    "smem_trans_batch_write_submit": ([_ptr, _ptr, _str, _ptr, _ptr, _u32, _ptr, _u32], _i32),
    "smem_trans_batch_read_submit": ([_ptr, _ptr, _str, _ptr, _ptr, _u32, _ptr, _u32], _i32),
}

_lib.declare(_SIGNATURES)  # set when the library loads, at the first call


def b(s):
    return s.encode() if isinstance(s, str) else s


def _array(ctype, vals, name, conv):
    """vals as a ctypes array of ctype: a one-dimensional uint64 NumPy array as a view of its
    own memory (hmc._lib.u64_addr: nothing converted; the caller's array lives through the
    call), another non-empty NumPy array as hmc.trans._vec converts it (an integer dtype in
    one pass, negatives refused by index), a list of plain ints in range filled in one C pass
    (hmc._lib.u64_lists: 1.7 µs for 1,024 entries, against about 100 for the checked
    per-entry conversion), anything else checked entry by entry (conv: an entry that is not
    an int, such as a tensor for an address), naming a wrong one."""
    addr = _lib.u64_addr(vals)
    if addr is not None:
        return (ctype * len(vals)).from_address(addr)
    if type(vals).__module__ == "numpy" and vals.size:  # int64 (np.array of ints) and others
        from hmc.trans import _vec
        v = _vec(name, vals, conv)
        return (ctype * len(v)).from_buffer(v)
    fast = _lib.u64_lists(vals)
    if fast is not None:
        return fast if ctype is _u64 else (ctype * len(fast)).from_buffer(fast)
    return (ctype * len(vals))(*_u64s(name, vals, conv))


def ptrs(vals, name="addresses", conv=None):
    return _array(_ptr, vals, name, conv)


def u64s(vals, name="sizes"):
    return _array(_u64, vals, name, None)


def sizes(vals, name="sizes"):
    return _array(_size, vals, name, None)


def cfield(name):
    """A read-write property over field name of the C struct an object keeps in self._c."""
    return property(lambda self: getattr(self._c, name), lambda self, v: setattr(self._c, name, v))
