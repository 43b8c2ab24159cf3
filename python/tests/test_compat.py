"""python3 -m hmc.compat: installs the mooncake.engine and mf_adapter shims, never over a
foreign package silently, says which module an import finds, and removes only its own."""
import os
import subprocess
import sys

from conftest import HERE


def compat(*args, path=()):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*path, os.path.join(HERE, "..")]))
    return subprocess.run([sys.executable, "-m", "hmc.compat", *args], env=env, capture_output=True, text=True)


def test_install_status_uninstall(tmp_path):
    d = str(tmp_path / "site")
    r = compat("install", "--target", d)
    assert r.returncode == 0, r.stdout + r.stderr
    r = compat("status", path=[d])
    assert f"mooncake: {d}/mooncake (HMC-Go's shim)" in r.stdout and "mf_adapter" in r.stdout, r.stdout
    # The import says which engine it is.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([d, os.path.join(HERE, "..")]))
    r = subprocess.run([sys.executable, "-c", "from mooncake.engine import TransferEngine; import mf_adapter; "
                        "from mooncake.store import MooncakeDistributedStore, ReplicateConfig; "
                        "print(TransferEngine.__module__, mf_adapter.TransferEngine.__module__, "
                        "MooncakeDistributedStore.__module__, ReplicateConfig().replica_num)"],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["hmc.trans", "memfabric_hybrid.transfer", "hmc.kv", "1"]
    assert "mooncake.store is HMC-Go's pool client" in r.stderr
    assert "HMC-Go's TransferEngine" in r.stderr and "not Mooncake's" in r.stderr
    assert "mf_adapter is HMC-Go's" in r.stderr
    assert compat("install", "--target", d, path=[d]).returncode == 0  # again over its own: fine
    assert compat("uninstall", "--target", d).returncode == 0
    assert not os.path.exists(os.path.join(d, "mooncake")) and not os.path.exists(os.path.join(d, "mf_adapter"))


def test_never_shadows_a_foreign_package(tmp_path):
    real = tmp_path / "real"
    (real / "mooncake").mkdir(parents=True)
    (real / "mooncake" / "__init__.py").write_text("# Mooncake's own\n")
    d = str(tmp_path / "site")
    r = compat("install", "--target", d, path=[str(real)])
    assert r.returncode == 1
    assert f"mooncake at {real}/mooncake is not HMC-Go's: not shadowing it" in r.stdout, r.stdout
    assert not os.path.exists(d)
    r = compat("install", "--target", d, "--force", path=[str(real)])
    assert r.returncode == 0 and "is shadowed by HMC-Go's" in r.stdout, r.stdout
    # uninstall removes only its own: the foreign package stays.
    assert compat("uninstall", "--target", str(real)).returncode == 0
    assert (real / "mooncake" / "__init__.py").exists()
