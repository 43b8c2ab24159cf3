"""Compatibility packages: ``mooncake.engine`` and ``mf_adapter`` served by HMC-Go, so code
written for Mooncake's and memfabric's Python contracts runs unchanged.

    python3 -m hmc.compat install            # into site-packages (or --target DIR)
    python3 -m hmc.compat status             # which mooncake / mf_adapter import resolves to
    python3 -m hmc.compat uninstall

It writes two small packages that import ``hmc.trans``, ``hmc.kv`` and ``memfabric_hybrid``:
after it, ``from mooncake.engine import TransferEngine`` (SGLang, vLLM), ``from mooncake.store
import MooncakeDistributedStore`` (SGLang's HiCache, vLLM's and LMCache's Mooncake store
backends) and ``from mf_adapter import TransferEngine`` (SGLang's Ascend path) load HMC-Go's. It never shadows a real Mooncake
or memfabric silently: install refuses when another ``mooncake`` or ``mf_adapter`` is
importable (``--force`` overrides, saying what it replaces), and importing the shims logs a
warning line that says HMC-Go's engine is the one loaded.
"""

import argparse
import importlib.util
import os
import shutil
import sys
import sysconfig

MARK = "__hmc_compat__"

_MOONCAKE_INIT = f'''"""HMC-Go's compatibility package for Mooncake's Python API (python3 -m hmc.compat install).
mooncake.engine is hmc.trans, mooncake.store is hmc.kv."""
{MARK} = True
'''

_MOONCAKE_ENGINE = f'''"""mooncake.engine served by HMC-Go (hmc.trans): installed by python3 -m hmc.compat install."""
import logging as _logging

from hmc.trans import *  # noqa: F401,F403
from hmc.trans import (InnerTransferEngine, TransferEngine, TransferNotify, TransferOpcode,  # noqa: F401
                       SUPPORT_CUDA, SUPPORT_EFA, SUPPORT_HIP, SUPPORT_INTRA_NVLINK, SUPPORT_MNNVL, SUPPORT_MUSA,
                       Read, Write)

{MARK} = True
_logging.getLogger("hmc.compat").warning(
    "mooncake.engine is HMC-Go's TransferEngine (hmc.trans at %s), not Mooncake's; "
    "python3 -m hmc.compat uninstall removes it", __import__("hmc.trans").trans.__file__)
'''

_MOONCAKE_STORE = f'''"""mooncake.store served by HMC-Go (hmc.kv): installed by python3 -m hmc.compat install."""
import logging as _logging

from hmc.kv import (BufferHandle, MooncakeDistributedStore, MooncakeHostMemAllocator,  # noqa: F401
                    ReplicateConfig)

{MARK} = True
_logging.getLogger("hmc.compat").warning(
    "mooncake.store is HMC-Go's pool client (hmc.kv at %s), not Mooncake's; "
    "python3 -m hmc.compat uninstall removes it", __import__("hmc.kv").kv.__file__)
'''

_MF_ADAPTER = f'''"""mf_adapter served by HMC-Go (memfabric_hybrid's TransferEngine): installed by python3 -m
hmc.compat install."""
import logging as _logging

from memfabric_hybrid.transfer import (TransDataOpType, TransferEngine, TransferOpcode,  # noqa: F401
                                       create_config_store, set_conf_store_tls, set_log_level)

{MARK} = True
__all__ = ["TransferEngine", "set_log_level", "create_config_store", "set_conf_store_tls"]
_logging.getLogger("hmc.compat").warning(
    "mf_adapter is HMC-Go's (memfabric_hybrid at %s), not memfabric's; python3 -m hmc.compat uninstall removes it",
    __import__("memfabric_hybrid").__file__)
'''

FILES = {
    "mooncake": {"__init__.py": _MOONCAKE_INIT, "engine.py": _MOONCAKE_ENGINE, "store.py": _MOONCAKE_STORE},
    "mf_adapter": {"__init__.py": _MF_ADAPTER},
}


def _origin(name, path=None):
    """Where `import name` resolves (in path, when given, else sys.path), or None."""
    if path is not None:
        for d in path:
            if os.path.exists(os.path.join(d, name, "__init__.py")):
                return os.path.join(d, name)
        return None
    spec = importlib.util.find_spec(name)
    if spec is None:
        return None
    return os.path.dirname(spec.origin) if spec.origin else (list(spec.submodule_search_locations or []) or [None])[0]


def _ours(pkgdir):
    try:
        with open(os.path.join(pkgdir, "__init__.py")) as f:
            return MARK in f.read()
    except OSError:
        return False


def install(target=None, force=False, only=None, out=sys.stdout):
    """Writes the shims into target (default: this interpreter's site-packages); returns 0, or 1
    when a foreign package is in the way and force is not set."""
    target = target or sysconfig.get_paths()["purelib"]
    names = only or list(FILES)
    for name in names:
        where = _origin(name)
        if where and not _ours(where) and not force:
            print(f"hmc.compat: {name} at {where} is not HMC-Go's: not shadowing it (--force replaces it in "
                  f"{target}, or uninstall it first)", file=out)
            return 1
    os.makedirs(target, exist_ok=True)
    for name in names:
        where = _origin(name)
        if where and not _ours(where):
            print(f"hmc.compat: --force: {name} at {where} is shadowed by HMC-Go's in {target}", file=out)
        d = os.path.join(target, name)
        if os.path.isdir(d) and not _ours(d):
            shutil.rmtree(d)
        os.makedirs(d, exist_ok=True)
        for fn, text in FILES[name].items():
            with open(os.path.join(d, fn), "w") as f:
                f.write(text)
        print(f"hmc.compat: installed {name} -> HMC-Go in {d}", file=out)
    return 0


def uninstall(target=None, out=sys.stdout):
    target = target or sysconfig.get_paths()["purelib"]
    for name in FILES:
        d = os.path.join(target, name)
        if os.path.isdir(d) and _ours(d):
            shutil.rmtree(d)
            print(f"hmc.compat: removed {d}", file=out)
    return 0


def status(out=sys.stdout):
    for name in FILES:
        where = _origin(name)
        what = "HMC-Go's shim" if where and _ours(where) else ("not HMC-Go's" if where else "not installed")
        print(f"{name}: {where or '-'} ({what})", file=out)
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m hmc.compat", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("install", help="write the mooncake and mf_adapter shims")
    i.add_argument("--target", help="directory to install into (default: site-packages)")
    i.add_argument("--force", action="store_true", help="shadow a foreign mooncake / mf_adapter")
    i.add_argument("--only", choices=sorted(FILES), action="append", help="one package only")
    u = sub.add_parser("uninstall", help="remove the shims")
    u.add_argument("--target")
    sub.add_parser("status", help="which packages the imports resolve to")
    a = p.parse_args(argv)
    if a.cmd == "install":
        return install(a.target, a.force, a.only)
    if a.cmd == "uninstall":
        return uninstall(a.target)
    return status()


if __name__ == "__main__":
    sys.exit(main())
