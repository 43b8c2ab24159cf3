"""Four Python processes on loopback run hmc.collective.alltoall (direct, ring, auto)."""
import json
import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("conn", ["TCP", "AUTO"])
def test_alltoall_four_processes(conn):
    world = 4
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(here, "..")] + sys.path))
    procs = [subprocess.Popen([sys.executable, os.path.join(here, "coll_worker.py"), str(world), conn],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
             for _ in range(world)]
    try:
        members = []
        for r, p in enumerate(procs):
            tag, dport, cport = p.stdout.readline().split()
            assert tag == "PORTS"
            members.append({"rank": r, "world": world, "ip": "127.0.0.1", "port_data": int(dport), "port_ctrl": int(cport)})
        for p in procs:
            p.stdin.write(json.dumps(members) + "\n")
            p.stdin.flush()
        results = [p.stdout.readline().strip() for p in procs]
        assert results == ["OK"] * world, results
        for p in procs:
            p.stdin.write("\n")
            p.stdin.flush()
        for p in procs:
            assert p.wait(timeout=60) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def test_alltoall_rendezvous_through_torch_distributed(tmp_path):
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    if not dist.is_available():
        pytest.skip("this torch has no torch.distributed")
    world = 4
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(here, "..")] + sys.path))
    store = str(tmp_path / "rendezvous")
    procs = [subprocess.Popen([sys.executable, os.path.join(here, "coll_worker.py"), str(world), "AUTO", str(r), store],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
             for r in range(world)]
    try:
        results = [p.stdout.readline().strip() for p in procs]
        assert results == ["OK"] * world, results
        for p in procs:
            p.stdin.write("\n")
            p.stdin.flush()
        for p in procs:
            assert p.wait(timeout=60) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
