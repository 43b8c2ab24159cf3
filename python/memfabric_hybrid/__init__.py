"""memfabric_hybrid's Python API on HMC-Go, for any Linux host.

``import memfabric_hybrid`` gives upstream's names: ``initialize``, ``uninitialize``,
``set_log_level``, ``set_extern_logger``, ``get_last_err_msg``,
``get_and_clear_last_err_msg``, ``create_config_store``, ``set_conf_store_tls``,
``set_conf_store_tls_key``, ``get_include_path``, ``get_lib_path``, the ``bm`` and ``shm``
submodules and ``TransferEngine`` / ``TransferOpcode``. It runs on the library of the
``hmc`` package (libhmc.so, which is also libmf_smem.so): one loader, one Go runtime.
Differences from upstream, where upstream is buggy or needs Ascend hardware, are in
docs/memfabric.md.
"""

import os

from hmc import _lib

from . import _smem
from ._smem import L as _L
from ._smem import b as _b

__all__ = ["initialize", "uninitialize", "set_log_level", "set_extern_logger", "get_last_err_msg",
           "get_and_clear_last_err_msg", "create_config_store", "set_conf_store_tls",
           "set_conf_store_tls_key", "get_include_path", "get_lib_path", "bm", "shm",
           "TransferEngine", "TransferOpcode", "TransDataOpType"]

_logger_ref = None


def initialize(flags=0):
    return _L.smem_init(flags)


def uninitialize():
    _L.smem_uninit()


def set_log_level(level):
    return _L.smem_set_log_level(int(level))


def set_extern_logger(log_fn):
    """log_fn(level: int, msg: str), or None to stop forwarding."""
    global _logger_ref
    if log_fn is None:
        _logger_ref = _smem.LOGGER(lambda level, msg: None)
    else:
        _logger_ref = _smem.LOGGER(lambda level, msg: log_fn(level, msg.decode(errors="replace")))
    return _L.smem_set_extern_logger(_logger_ref)


def get_last_err_msg():
    return (_L.smem_get_last_err_msg() or b"").decode(errors="replace")


def get_and_clear_last_err_msg():
    return (_L.smem_get_and_clear_last_err_msg() or b"").decode(errors="replace")


def create_config_store(store_url):
    return _L.smem_create_config_store(_b(store_url))


def set_conf_store_tls(enable, tls_info):
    info = _b(tls_info or "")
    return _L.smem_set_conf_store_tls(bool(enable), info, len(info))


def set_conf_store_tls_key(tls_pk, tls_pk_pw="", py_decrypt_func=None):
    """Upstream's store TLS key call (a stub there too): accepted and ignored, as the store's TLS
    key comes from the bm config's storeTlsConfig. An empty key is an error (nonzero);
    py_decrypt_func, when given, must be callable (str -> str)."""
    if py_decrypt_func is not None and not callable(py_decrypt_func):
        raise TypeError("py_decrypt_func must be callable (str -> str) or None")
    pk, pw = _b(tls_pk or ""), _b(tls_pk_pw or "")
    return _L.smem_set_config_store_tls_key(pk, len(pk), pw, len(pw), None)


def get_include_path():
    """The directory holding the C headers (smem/host/smem*.h, hmc.h): the installed package's
    include/, or the checkout's capi/include when run from a checkout."""
    here = os.path.dirname(os.path.abspath(__file__))
    for d in (os.path.join(here, "include"), os.path.join(here, "..", "..", "capi", "include")):
        if os.path.exists(os.path.join(d, "smem", "host", "smem.h")):
            return os.path.abspath(d)
    raise FileNotFoundError("memfabric_hybrid: no C headers next to the package or in the checkout")


def get_lib_path():
    """The directory of the library in use (libhmc.so, which is also libmf_smem.so)."""
    _lib.load()
    path = _lib.loaded_path()
    if path is None:
        raise FileNotFoundError("memfabric_hybrid: cannot tell where libhmc.so was loaded from")
    return os.path.dirname(path)


from . import bm, shm  # noqa: E402
from .transfer import TransDataOpType, TransferEngine, TransferOpcode  # noqa: E402
