"""Four Python processes on loopback run hmc.collective.alltoall (direct, ring, auto)."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
WORLD = 4


def run_workers(argv_per_rank, members_from_ports=False):
    """Starts one coll_worker.py per argv, optionally hands them the member list built from the
    ports they print, and checks that every one reports OK and exits cleanly."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(HERE, "..")] + sys.path))
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "coll_worker.py")] + argv,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
             for argv in argv_per_rank]
    try:
        if members_from_ports:
            members = []
            for r, p in enumerate(procs):
                tag, dport, cport = p.stdout.readline().split()
                assert tag == "PORTS"
                members.append({"rank": r, "world": len(procs), "ip": "127.0.0.1",
                                "port_data": int(dport), "port_ctrl": int(cport)})
            for p in procs:
                p.stdin.write(json.dumps(members) + "\n")
                p.stdin.flush()
        results = [p.stdout.readline().strip() for p in procs]
        assert results == ["OK"] * len(procs), results
        for p in procs:  # let everyone go only when all are done
            p.stdin.write("\n")
            p.stdin.flush()
        for p in procs:
            assert p.wait(timeout=60) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


@pytest.mark.parametrize("conn", ["TCP", "AUTO"])
def test_alltoall_four_processes(conn):
    run_workers([[str(WORLD), conn] for _ in range(WORLD)], members_from_ports=True)


def test_alltoall_rendezvous_through_torch_distributed(tmp_path):
    pytest.importorskip("torch")
    import torch.distributed as dist
    if not dist.is_available():
        pytest.skip("this torch has no torch.distributed")
    store = str(tmp_path / "rendezvous")
    run_workers([[str(WORLD), "AUTO", str(r), store] for r in range(WORLD)])


def _free_port():
    import socket
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return sk.getsockname()[1]


def test_alltoall_rendezvous_through_the_config_store():
    # No member list, no torch.distributed: the first worker to bind the address serves the
    # embedded store, everyone takes the lowest free rank and all-gathers its address.
    url = f"tcp://127.0.0.1:{_free_port()}"
    run_workers([[str(WORLD), "AUTO", "store", url] for _ in range(WORLD)])
