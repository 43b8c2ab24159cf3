"""`pip install ./python` builds the library itself when Go is on PATH (one command for a
Python user) and installs both packages."""
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.join(HERE, "..")


@pytest.mark.skipif(shutil.which("go") is None, reason="go is not on PATH")
def test_pip_install_builds_the_library(tmp_path):
    src = tmp_path / "src"
    repo = os.path.abspath(os.path.join(PKG, ".."))
    # A copy of the checkout without a built library, so the install has to build it.
    shutil.copytree(repo, src, ignore=shutil.ignore_patterns(".git", "libhmc.so", "*.test", "__pycache__", "build", "*.egg-info"))
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--target", str(target),
                        str(src / "python")], capture_output=True, text=True, timeout=600)
    if r.returncode != 0 and "No module named pip" in r.stderr:
        pytest.skip("pip is not installed")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (target / "hmc" / "libhmc.so").exists()
    assert (target / "memfabric_hybrid" / "include" / "smem" / "host" / "smem_bm.h").exists()
    code = ("import hmc, memfabric_hybrid as mf; print(mf.initialize()); print(mf.get_include_path()); "
            "print(mf.get_lib_path())")
    check = subprocess.run([sys.executable, "-c", code],
                           capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(target)), cwd=str(tmp_path))
    assert check.returncode == 0, check.stdout + check.stderr
    init, inc, libdir = check.stdout.split()
    assert init == "0"
    assert inc == str(target / "memfabric_hybrid" / "include")
    assert libdir == str(target / "hmc")
