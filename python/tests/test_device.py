"""Device memory through the Python faces: two processes, each with device memory (a real GPU's,
or the GPU emulation's where none is present), byte-checked by the process that owns it."""
import os
import subprocess
import sys

import pytest

from conftest import HERE, free_port


def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = os.path.join(HERE, "..") + os.pathsep + e.get("PYTHONPATH", "")
    if not os.path.exists("/dev/nvidia0"):
        e["HMC_EMULATE_GPU"] = "1"
    return e


def test_mooncake_device_memory():
    peer = os.path.join(HERE, "dev_peer.py")
    tgt = subprocess.Popen([sys.executable, peer, "target"], stdout=subprocess.PIPE, stdin=subprocess.PIPE,
                           env=env(), text=True)
    try:
        line = tgt.stdout.readline().split()
        assert line and line[0] == "READY", line
        out = subprocess.run([sys.executable, peer, "initiator", line[1], line[2]], env=env(), capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0 and "PASS" in out.stdout, out.stdout + out.stderr
    finally:
        tgt.kill()
        tgt.wait()


def test_memfabric_device_memory():
    import memfabric_hybrid as mf
    url = f"tcp://127.0.0.1:{free_port()}"
    assert mf.create_config_store(url) == 0
    peer = os.path.join(HERE, "dev_peer.py")
    tgt = subprocess.Popen([sys.executable, peer, "mftarget", url], stdout=subprocess.PIPE, stdin=subprocess.PIPE,
                           env=env(), text=True)
    try:
        line = tgt.stdout.readline().split()
        assert line and line[0] == "READY", line
        out = subprocess.run([sys.executable, peer, "mfinit", url, line[1], line[2]], env=env(), capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0 and "PASS" in out.stdout, out.stdout + out.stderr
    finally:
        tgt.kill()
        tgt.wait()


def test_kv_device_memory():
    """The KV-cache pool's Mooncake Store face with device memory as the local side: puts from
    it (staged by the transfer engine to the other process's segment), gets into it there and
    here (a device copy from the own segment)."""
    peer = os.path.join(HERE, "kv_dev_peer.py")
    srv = subprocess.Popen([sys.executable, peer, "serve"], stdout=subprocess.PIPE, stdin=subprocess.PIPE,
                           env=env(), text=True)
    try:
        line = srv.stdout.readline().split()
        assert line and line[0] == "READY", line
        cl = subprocess.Popen([sys.executable, peer, "client", line[1]], stdout=subprocess.PIPE, stdin=subprocess.PIPE,
                              env=env(), text=True)
        try:
            while True:
                out = cl.stdout.readline().strip()
                if not out.startswith("check "):
                    break
                srv.stdin.write(out + "\n")
                srv.stdin.flush()
                cl.stdin.write(srv.stdout.readline())
                cl.stdin.flush()
            assert out == "PASS", out
            assert cl.wait(timeout=60) == 0
        finally:
            cl.kill()
            cl.wait()
    finally:
        srv.kill()
        srv.wait()
