"""memfabric_hybrid's Python API on HMC-Go, for any Linux host.

``import memfabric_hybrid`` gives upstream's names: ``initialize``, ``uninitialize``,
``set_log_level``, ``set_extern_logger``, ``get_last_err_msg``,
``get_and_clear_last_err_msg``, ``create_config_store``, ``set_conf_store_tls``, the ``bm`` and
``shm`` submodules and ``TransferEngine`` / ``TransferOpcode``. It runs on the library of the
``hmc`` package (libhmc.so, which is also libmf_smem.so): one loader, one Go runtime.
Differences from upstream, where upstream is buggy or needs Ascend hardware, are in
docs/memfabric.md.
"""

from . import _smem
from ._smem import L as _L
from ._smem import b as _b

__all__ = ["initialize", "uninitialize", "set_log_level", "set_extern_logger", "get_last_err_msg",
           "get_and_clear_last_err_msg", "create_config_store", "set_conf_store_tls", "bm", "shm",
           "TransferEngine", "TransferOpcode"]

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


def set_conf_store_tls(enable, tls_info=""):
    info = _b(tls_info or "")
    return _L.smem_set_conf_store_tls(bool(enable), info, len(info))


from . import bm, shm  # noqa: E402
from .transfer import TransferEngine, TransferOpcode  # noqa: E402
