"""Fork safety: importing the packages does not start the Go runtime, so workers forked after
the import (multiprocessing's default on Linux) each load the library and move bytes; in a child
of a process that has loaded it every call fails at once with ForkError, and the spawn start
method works. Each scenario runs in a fresh interpreter, under a timeout: a hang is a failure."""
import os
import subprocess
import sys
import textwrap

from conftest import HERE

PRELUDE = """
import multiprocessing as mp, os, sys, time
import hmc, hmc.trans, memfabric_hybrid, mooncake.engine
from hmc import _lib
"""


def run(compat_dir, body, timeout=60):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([compat_dir, os.path.join(HERE, "..")]))
    r = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body)], env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_import_loads_nothing(compat_dir):
    out = run(compat_dir, """
        import threading
        maps = open("/proc/self/maps").read()
        print(_lib.is_loaded(), "libhmc" in maps, threading.active_count())
    """)
    assert out.split() == ["False", "False", "1"]


def test_workers_forked_after_import(compat_dir):
    # Two forked workers: a target and an initiator that writes to it; the target checks the
    # bytes. Before the fix both engines started but never answered (the Go runtime inherited
    # from the parent was dead), and the write timed out after 30 s.
    run(compat_dir, """
        from mooncake.engine import TransferEngine

        def target(q, done):
            te = TransferEngine()
            assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, te.last_error
            addr = te.allocate_managed_buffer(1 << 20)
            q.put((te.get_local_hostname(), addr))
            done.wait(30)
            assert te.read_bytes_from_buffer(addr, 4096) == bytes(range(256)) * 16
            te.destroy()

        def initiator(q, done):
            name, addr = q.get(timeout=30)
            te = TransferEngine()
            assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, te.last_error
            src = te.allocate_managed_buffer(1 << 20)
            te.write_bytes_to_buffer(src, bytes(range(256)) * 16, 4096)
            t0 = time.time()
            assert te.transfer_sync_write(name, src, addr, 4096) == 0, te.last_error
            assert time.time() - t0 < 5
            done.set()
            te.destroy()

        ctx = mp.get_context("fork")
        q, done = ctx.Queue(), ctx.Event()
        ps = [ctx.Process(target=target, args=(q, done)), ctx.Process(target=initiator, args=(q, done))]
        for p in ps:
            p.start()
        for p in ps:
            p.join(45)
            assert p.exitcode == 0, p.exitcode
        assert not _lib.is_loaded()
    """)


def test_child_of_a_loaded_parent_fails_at_once(compat_dir):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([compat_dir, os.path.join(HERE, "..")]))
    r = subprocess.run([sys.executable, os.path.join(HERE, "fork_loaded.py")], env=env, capture_output=True, text=True,
                       timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "spawn 0" in r.stdout
