"""Loading libhmc.so and declaring its functions (ctypes; the GIL is released during calls).

The library loads at the first call that needs it, not at import: the Go runtime it starts does
not survive fork, so a script may import the packages, fork workers, and use the library in
each. A child forked after the library loaded gets ForkError from every call."""

import ctypes
import os
import threading

_u64, _u32, _u16, _int = ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint16, ctypes.c_int
_str, _ptr = ctypes.c_char_p, ctypes.c_void_p
_pu64 = ctypes.POINTER(ctypes.c_uint64)

# name: (argtypes, restype)
_SIGNATURES = {
    "hmc_last_error": ([], _str),
    "hmc_status_string": ([_int], _str),
    "hmc_debug_stacks": ([_ptr, _u64], _u64),
    "hmc_memory_probe": ([_int], _int),
    "hmc_memory_open": ([_int, _int, _pu64], _int),
    "hmc_memory_alloc": ([_u64, _u64, _pu64], _int),
    "hmc_memory_free": ([_u64, _u64], _int),
    "hmc_memory_close": ([_u64], _int),
    "hmc_memory_locate": ([_u64, ctypes.POINTER(_int), ctypes.POINTER(_int), ctypes.POINTER(_int)], _int),
    "hmc_memory_copy": ([_u64, _u64, _u64], _int),
    "hmc_stream_create": ([_int, _int, _pu64], _int),
    "hmc_stream_sync": ([_u64, _u64], _int),
    "hmc_stream_destroy": ([_u64, _u64], _int),
    "hmc_memory_memset_async": ([_u64, _int, _u64, _u64], _int),
    "hmc_kv_master_start": ([_str, _int, _int, _ptr, _u64, _pu64], ctypes.c_int32),
    "hmc_kv_master_stop": ([_u64], ctypes.c_int32),
    "hmc_kv_client_create": ([_str, _str, _str, _str, _u64, _pu64], ctypes.c_int32),
    "hmc_kv_client_id": ([_u64, _ptr, _u64], ctypes.c_int32),
    "hmc_kv_put": ([_u64, _str, _ptr, _u64, _int], ctypes.c_int32),
    "hmc_kv_get_size": ([_u64, _str], ctypes.c_int64),
    "hmc_kv_get_into": ([_u64, _str, _ptr, _u64], ctypes.c_int64),
    "hmc_kv_exist": ([_u64, _str], ctypes.c_int32),
    "hmc_kv_remove": ([_u64, _str, _int], ctypes.c_int32),
    "hmc_kv_remove_regex": ([_u64, _str, _int], ctypes.c_int64),
    "hmc_kv_ping": ([_u64], ctypes.c_int32),
    "hmc_kv_get": ([_u64, _str, ctypes.POINTER(ctypes.c_void_p), _pu64], ctypes.c_int32),
    "hmc_kv_free": ([_ptr], None),
    "hmc_kv_mount_segment": ([_u64, _u64, _str, _ptr, _u64], ctypes.c_int32),
    "hmc_kv_unmount_segment": ([_u64, _str, ctypes.c_int64], ctypes.c_int32),
    "hmc_kv_register_buffer": ([_u64, _u64, _u64], ctypes.c_int32),
    "hmc_kv_unregister_buffer": ([_u64, _u64], ctypes.c_int32),
    "hmc_kv_batch_put": ([_u64, _u64, _ptr, _u64, _ptr, _ptr, _ptr, _int, _int, _ptr], ctypes.c_int32),
    "hmc_kv_batch_get": ([_u64, _u64, _ptr, _u64, _ptr, _ptr, _ptr, _ptr], ctypes.c_int32),
    "hmc_kv_batch_exist": ([_u64, _u64, _ptr, _u64, _ptr], ctypes.c_int32),
    "hmc_kv_batch_remove": ([_u64, _u64, _ptr, _u64, _int, _ptr], ctypes.c_int32),
    "hmc_kv_client_close": ([_u64], ctypes.c_int32),
    "hmc_session_create": ([_int, _u64, _int, _int, _str, _pu64], _int),
    "hmc_session_create_secure": ([_int, _u64, _int, _int, _str, _ptr, _u64, _str, _str, _str, _pu64], _int),
    "hmc_session_destroy": ([_u64], _int),
    "hmc_session_init_server": ([_u64, _str, _int, _int, _u32, _str, _int], _int),
    "hmc_session_data_port": ([_u64], _int),
    "hmc_session_ctrl_port": ([_u64], _int),
    "hmc_session_connect": ([_u64, _u32, _u32, _str, _int, _int, _str, _int, _int], _int),
    "hmc_session_check_conn": ([_u64, _str, _int, _int], _int),
    "hmc_session_disconnect": ([_u64, _str, _int, _int], _int),
    "hmc_session_close_server": ([_u64], _int),
    "hmc_session_put": ([_u64, _str, _int, _u64, _u64, _u64, _int, _int], _int),
    "hmc_session_get": ([_u64, _str, _int, _u64, _u64, _u64, _int, _int], _int),
    "hmc_session_put_from": ([_u64, _str, _int, _ptr, _u64, _u64, _int, _int], _int),
    "hmc_session_get_to": ([_u64, _str, _int, _ptr, _u64, _u64, _int, _int], _int),
    "hmc_session_put_nb": ([_u64, _str, _int, _u64, _u64, _u64, _int, _pu64], _int),
    "hmc_session_get_nb": ([_u64, _str, _int, _u64, _u64, _u64, _int, _pu64], _int),
    "hmc_session_wait": ([_u64, _pu64, _u64, _int], _int),
    "hmc_session_put_pipeline": ([_u64, _str, _int, _u64, _u64, _u64, _u64, _int, _int, _int], _int),
    "hmc_session_get_pipeline": ([_u64, _str, _int, _u64, _u64, _u64, _u64, _int, _int, _int], _int),
    "hmc_session_send_data": ([_u64, _str, _int, _u64, _u64, _int, _int, _int, _int], _int),
    "hmc_session_recv_data": ([_u64, _str, _int, _u64, _u64, _int, _int, _pu64, _int, _int], _int),
    "hmc_session_ctrl_send": ([_u64, _u32, _u64, _int], _int),
    "hmc_session_ctrl_recv": ([_u64, _u32, _pu64, _int], _int),
    "hmc_group_create": ([_u64, _int, ctypes.POINTER(_str), ctypes.POINTER(_int), ctypes.POINTER(_int), _u32, _int, _int, _pu64], _int),
    "hmc_group_alltoall": ([_u64, _int, _u64, _u64, _u64, _u64, _int], _int),
    "hmc_group_scratch_size": ([_int, _u64], _u64),
    "hmc_group_destroy": ([_u64], _int),
    "hmc_store_open": ([_str, _int, _int, _int, _int, _pu64], _int),
    "hmc_store_open_secure": ([_str, _int, _int, _int, _int, _ptr, _u64, _str, _str, _str, _pu64], _int),
    "hmc_store_rank": ([_u64, ctypes.POINTER(_int), ctypes.POINTER(_int)], _int),
    "hmc_store_set": ([_u64, _str, _ptr, _u64, _int], _int),
    "hmc_store_get": ([_u64, _str, _int, _ptr, _u64, _pu64, _int], _int),
    "hmc_store_add": ([_u64, _str, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64), _int], _int),
    "hmc_store_close": ([_u64], _int),
    "hmc_store_group_open": ([_u64, _str, _int, _int, _pu64], _int),
    "hmc_store_group_barrier": ([_u64, _int], _int),
    "hmc_store_group_allgather": ([_u64, _ptr, _u64, _ptr, _u64, _pu64, _int], _int),
    "hmc_store_group_close": ([_u64], _int),
    "hmc_trans_create": ([_str, _str, _int, _str, _int, _pu64], _int),
    "hmc_trans_destroy": ([_u64], _int),
    "hmc_trans_unique_id": ([_u64, _str, _u64], _int),
    "hmc_trans_register": ([_u64, _u64, _u64], _int),
    "hmc_trans_batch_register": ([_u64, _pu64, _pu64, _u64], _int),
    "hmc_trans_deregister": ([_u64, _u64, _int], _int),
    "hmc_trans_malloc": ([_u64, _u64, _pu64], _int),
    "hmc_trans_free": ([_u64, _u64, _int], _int),
    "hmc_trans_transfer": ([_u64, _str, _int, _ptr, _ptr, _ptr, _u64, _str, _int], _int),
    "hmc_trans_submit": ([_u64, _str, _int, _ptr, _ptr, _ptr, _u64, _str, _pu64], _int),
    "hmc_trans_status": ([_u64, _u64, ctypes.POINTER(_int)], _int),
    "hmc_trans_wait": ([_u64, _u64, _int], _int),
    "hmc_trans_notify": ([_u64, _str, _str, _int], _int),
    "hmc_trans_notify_as": ([_u64, _str, _str, _str, _int], _int),
    "hmc_trans_probe": ([_u64, _str, _int], _int),
    "hmc_trans_json": ([_u64, _int, _str, _ptr, _u64, _pu64, _int], _int),
    "hmc_buffer_size": ([_u64], _u64),
    "hmc_buffer_ptr": ([_u64], _u64),
    "hmc_buffer_write": ([_u64, _ptr, _u64, _u64], _int),
    "hmc_buffer_read": ([_u64, _ptr, _u64, _u64], _int),
    "hmc_buffer_write_gpu": ([_u64, _u64, _u64, _u64], _int),
    "hmc_buffer_read_gpu": ([_u64, _u64, _u64, _u64], _int),
    "hmc_buffer_write_device": ([_u64, _u64, _u64, _u64, _int, _int], _int),
    "hmc_buffer_read_device": ([_u64, _u64, _u64, _u64, _int, _int], _int),
    "hmc_buffer_copy_within": ([_u64, _u64, _u64, _u64], _int),
}


def _find():
    env = os.environ.get("HMC_LIBRARY")
    if env:
        return env
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libhmc.so")
    if os.path.exists(here):
        return here
    return "libhmc.so"  # the dynamic loader's search path


class ForkError(RuntimeError):
    """A call into the library from a child of the process that loaded it: the Go runtime (its
    threads, its network poller) did not survive fork, so nothing the library holds works
    there."""


_extra = {}       # signatures other packages declare (memfabric_hybrid's smem_*)
_lock = threading.Lock()
_loaded = None    # the CDLL, once loaded
_loaded_pid = 0   # the process that loaded it
_forked = False   # set in a child forked after loading


def declare(signatures):
    """Adds name: (argtypes, restype) pairs to set on the library when it loads (at once if
    it has loaded already)."""
    with _lock:
        _extra.update(signatures)
        if _loaded is not None:
            _apply(_loaded, signatures)


def _apply(lib, signatures):
    for name, (args, res) in signatures.items():
        f = getattr(lib, name)
        f.argtypes, f.restype = args, res


def _after_fork_in_child():
    global _forked
    if _loaded is not None:
        _forked = True
        LIB.__dict__.clear()  # every look-up goes through load() again, which raises ForkError


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def fork_error():
    """The error every call raises in a child of the process that loaded the library."""
    return ForkError(f"libhmc.so was loaded in pid {_loaded_pid} before fork (this is pid {os.getpid()}): "
                     "create engines after fork, or use the spawn start method "
                     "(multiprocessing.set_start_method('spawn'))")


def load():
    """The library, loaded on first use (importing the packages does not start the Go
    runtime); in a child forked after loading it raises ForkError."""
    global _loaded, _loaded_pid
    if _forked:
        raise fork_error()
    if _loaded is not None:
        return _loaded
    with _lock:
        if _loaded is None:
            lib = ctypes.CDLL(_find())  # CDLL (not PyDLL): calls release the GIL
            _apply(lib, _SIGNATURES)
            _apply(lib, _extra)
            _loaded_pid = os.getpid()
            _loaded = lib
    return _loaded


def is_loaded():
    """Whether this process has loaded the library (a forked child's inherited copy counts)."""
    return _loaded is not None


# hmc_py_u64s (capi/internal/transapi/pylist.c) reads lists of ints in one C pass; it must know
# this interpreter's object layout, so it is used only where that is known and a probe of known
# values converts right.
_conv = None      # the GIL-holding function once probed, False where it cannot be used
_PROBE = [0, 1, 2**30 - 1, 2**30, 2**47 + 12345, 2**60 - 1, 2**60, 2**63 + 7, 2**64 - 1]


def _layout():
    """hmc_py_u64s's layout code for this interpreter (pylist.c), 0 for none it knows."""
    import sys
    import sysconfig
    if sys.implementation.name != "cpython" or ctypes.sizeof(ctypes.c_void_p) != 8:
        return 0
    if sys.int_info.bits_per_digit != 30 or sys.int_info.sizeof_digit != 4:
        return 0
    if hasattr(sys, "getobjects") or sysconfig.get_config_var("Py_GIL_DISABLED"):  # other headers
        return 0
    v = sys.version_info[:2]
    return 1 if v <= (3, 11) else 2 if v <= (3, 14) else 0


def _probe(lib):
    layout = _layout()
    if not layout:
        return False
    try:
        proto = ctypes.PYFUNCTYPE(ctypes.c_int64, _int, ctypes.py_object, ctypes.py_object, ctypes.py_object,
                                  _ptr, _ptr, _int, _ptr, ctypes.c_int64)
        raw = proto(("hmc_py_u64s", lib))  # PYFUNCTYPE: the GIL stays held while it reads
    except AttributeError:  # an older library
        return False
    lt, it = id(list), id(int)

    def conv(a, b=None, c=None):
        n, k = len(a), 1 if b is None else 2 if c is None else 3
        out = (_u64 * (k * n))()
        return out if raw(k, a, b, c, lt, it, layout, out, n) == n else None

    good = conv(_PROBE, _PROBE[::-1], _PROBE)
    if good is None or list(good) != _PROBE + _PROBE[::-1] + _PROBE:
        return False
    for bad in ([-1], [2**64], [True], [1.0], [2**90]):
        if conv(bad) is not None or conv([1], [2], bad) is not None:
            return False
    _setup_transfer(lib, lt, it, layout)
    return conv


_xfer = None  # hmc_py_trans_transfer (a PYFUNCTYPE), once hmc_py_setup took this interpreter

# hmc_py_trans_transfer's and hmc_py_trans_arrays' prototype: engine, peer, op, the three
# objects, n, timeout_ms. PYFUNCTYPE: the GIL stays held while they read their arguments.
_BATCH_PROTO = ctypes.PYFUNCTYPE(_int, _u64, _str, _int, ctypes.py_object, ctypes.py_object, ctypes.py_object,
                                 ctypes.c_int64, _int)


def _setup_transfer(lib, lt, it, layout):
    """Readies hmc_py_trans_transfer (pylist.c): a batch's three lists read and run in one C
    call, the GIL released by the library for the transfer as ctypes releases it; it needs this
    interpreter's PyEval_SaveThread and PyEval_RestoreThread."""
    global _xfer
    try:
        api = ctypes.pythonapi
        save, restore = (ctypes.cast(getattr(api, f), ctypes.c_void_p).value
                         for f in ("PyEval_SaveThread", "PyEval_RestoreThread"))
        setup = lib.hmc_py_setup
        raw = _BATCH_PROTO(("hmc_py_trans_transfer", lib))
    except (AttributeError, ValueError):  # an older library, an interpreter without them
        return
    setup.argtypes, setup.restype = [_ptr, _ptr, _int, _ptr, _ptr], _int
    if setup(lt, it, layout, save, restore) == 0:
        _xfer = raw


def u64_lists(a, b=None, c=None):
    """Lists a (and b, c, as long as a) of ints in 0..2^64-1 as one ctypes uint64 array (a's
    values, then b's, then c's) filled in one C call (3.5 µs for three lists of 1,024 entries,
    against 14-17 µs a list for array.array('Q')), or None where that cannot be done (not lists
    of one length, an entry that is not a plain int in range, an interpreter whose layout is
    unknown, the library not loaded): the caller converts its usual way, which names a wrong
    entry."""
    global _conv
    if type(a) is not list or _loaded is None or _forked:
        return None
    if _conv is None:
        with _lock:
            if _conv is None:
                _conv = _probe(_loaded)
    return _conv(a, b, c) if _conv else None


def transfer_lists(engine, peer, op, a, b, c, timeout_ms):
    """hmc_trans_transfer of a batch given as three lists of plain ints (a, b, c: locals,
    remotes, sizes; peer as bytes) in one library call that reads the lists and releases the GIL
    while the batch runs; its status, or None where it cannot take them whole (what u64_lists
    declines, an empty batch or one over 2^20 entries, an interpreter without the call): the
    caller converts its checked way."""
    if _xfer is None:
        if u64_lists([0]) is None or _xfer is None:  # probes once; declines where it cannot
            return None
    elif _forked:
        return None
    rc = _xfer(engine, peer, op, a, b, c, len(a), timeout_ms)
    return None if rc < 0 else rc


_np = None  # (numpy.ndarray, hmc_py_trans_arrays) once probed, False where it cannot be used


def _probe_numpy(lib, ndarray):
    """Readies hmc_py_trans_arrays (pylist.c) for NumPy arrays of type ndarray: it reads an
    array's fields as NumPy's headers lay them out, so it is used only where reads of known
    arrays come out right and arrays it must not take are declined."""
    import numpy as np
    if _xfer is None or ndarray is not np.ndarray:
        return False
    try:
        setup, data = lib.hmc_py_setup_numpy, lib.hmc_py_array_data
        raw = _BATCH_PROTO(("hmc_py_trans_arrays", lib))
    except AttributeError:  # an older library
        return False
    u64 = np.dtype(np.uint64)
    setup.argtypes, setup.restype = [_ptr, _ptr], _int
    data.argtypes, data.restype = [ctypes.py_object, ctypes.c_int64], _ptr
    if setup(id(np.ndarray), id(u64)) != 0:
        return False
    good = np.arange(5, dtype=np.uint64)
    if data(good, 5) != good.ctypes.data or data(good[1:], 4) != good[1:].ctypes.data:
        return False

    class Sub(np.ndarray):
        pass

    wide = np.zeros((4, 4), dtype=np.uint64)
    for bad, n in ((good, 4), (good[::2], 3), (wide, 4), (wide[:, 0], 4), (good.astype(np.int64), 5),
                   (good.view(Sub), 5), (good.astype(">u8"), 5), (np.uint64(3), 1), ([0, 1], 2)):
        if data(bad, n):
            return False
    return ndarray, raw


def transfer_arrays(engine, peer, op, a, b, c, timeout_ms):
    """hmc_trans_transfer of a batch given as three one-dimensional NumPy arrays of native
    uint64 (a, b, c: locals, remotes, sizes; what KV connectors build) in one library call that
    reads their addresses and releases the GIL while the batch runs; its status, or None where
    it does not take them (another dtype or shape, a strided view, a subclass, an empty batch,
    an interpreter or NumPy it cannot read): the caller takes its checked way."""
    global _np
    if _np is None:
        t = type(c)
        if t.__name__ != "ndarray" or t.__module__ != "numpy" or u64_lists([0]) is None:
            return None  # not an array (numpy is not imported for it), or no list call to build on
        with _lock:
            if _np is None:
                _np = _probe_numpy(_loaded, t)
    if not _np or type(c) is not _np[0] or _forked:
        return None
    rc = _np[1](engine, peer, op, a, b, c, c.size, timeout_ms)
    return None if rc < 0 else rc


def transfer_batch(engine, peer, op, a, b, c, timeout_ms):
    """transfer_lists or transfer_arrays by the type of c (peer as str or bytes): the batch
    calls' first try, kept to a few look-ups since it runs per call, between copies that leave
    the interpreter's own memory out of the caches. None where neither takes the batch."""
    if type(peer) is str:
        peer = peer.encode()
    if type(c) is list:
        x = _xfer
        if x is None or _forked or type(a) is not list:
            return transfer_lists(engine, peer, op, a, b, c, timeout_ms) if type(a) is list else None
        rc = x(engine, peer, op, a, b, c, len(a), timeout_ms)
    else:
        x = _np
        if not x or type(c) is not x[0] or _forked:
            return transfer_arrays(engine, peer, op, a, b, c, timeout_ms) if x is None else None
        rc = x[1](engine, peer, op, a, b, c, c.size, timeout_ms)
    return None if rc < 0 else rc


_ND = [None, None]  # numpy.ndarray and its native uint64 dtype, once an ndarray was seen


def u64_addr(vals):
    """The address of vals' memory when it is a one-dimensional, C-contiguous, non-empty NumPy
    array of native 8-byte unsigned integers (what the KV connectors build): nothing to check
    or convert, the caller keeps vals alive while the library reads it; else None."""
    t = type(vals)
    if t is not _ND[0]:
        if t.__name__ != "ndarray" or t.__module__ != "numpy":
            return None
        import numpy
        _ND[1], _ND[0] = numpy.dtype(numpy.uint64), t
    # identity with numpy's own uint64 dtype (one check, not kind, size and byte order); an
    # equal dtype that is another object takes the checked path, which accepts it
    if vals.dtype is not _ND[1] or vals.ndim != 1 or not vals.flags.c_contiguous or not len(vals):
        return None
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(vals))  # a third of .ctypes.data's cost
    except (TypeError, ValueError):  # read-only
        return vals.ctypes.data


def batch_lists(a, b, c):
    """A batch's three lists (addresses, addresses, lengths) converted in one C call as
    (n, a's, b's and c's uint64* as ints, the array that holds them, to keep until the library
    returns), or None where u64_lists declines or the batch is empty."""
    fast = u64_lists(a, b, c) if len(a) else None
    if fast is None:
        return None
    n, p = len(a), ctypes.addressof(fast)
    return n, p, p + 8 * n, p + 16 * n, fast


class _Lazy:
    """Stands for the library: the first attribute looked up loads it."""

    def __getattr__(self, name):
        f = getattr(load(), name)
        if name.startswith("hmc_") or name.startswith("smem_"):
            self.__dict__[name] = f  # found directly from now on (0.25 µs a call less) until fork
        return f


def loaded_path():
    """The file the library was loaded from (found in /proc/self/maps: the loader may have
    searched for it), or None."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split(None, 5)[-1].strip()
                if os.path.basename(path) == os.path.basename(_find()) and os.path.exists(path):
                    return path
    except OSError:
        pass
    return None


LIB = _Lazy()
