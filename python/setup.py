"""Builds libhmc.so from this checkout when the package is installed and the library is not
there yet (a Python user needs one command: pip install ./python); metadata is pyproject.toml."""

import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        # memfabric_hybrid.get_include_path(): the C headers go inside the package.
        inc = os.path.abspath(os.path.join(self.build_lib, "memfabric_hybrid", "include"))
        shutil.rmtree(inc, ignore_errors=True)
        shutil.copytree(os.path.join(HERE, "..", "capi", "include"), inc)
        lib = os.path.join(HERE, "hmc", "libhmc.so")
        out = os.path.abspath(os.path.join(self.build_lib, "hmc", "libhmc.so"))
        if os.path.exists(lib):
            shutil.copy(lib, out)
            return
        go = shutil.which("go")
        if go is None:
            raise RuntimeError("hmc: libhmc.so is not built and go is not on PATH: build it with "
                               "go build -buildmode=c-shared -o python/hmc/libhmc.so ./capi")
        tags = os.environ.get("HMC_GO_TAGS", "")
        cmd = [go, "build", "-buildmode=c-shared", "-o", out]
        if tags:
            cmd += ["-tags", tags]
        subprocess.check_call(cmd + ["./capi"], cwd=os.path.join(HERE, ".."))


setup(cmdclass={"build_py": BuildWithLibrary})
