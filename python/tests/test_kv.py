"""The KV-cache pool through Mooncake Store's Python contract: a master and two clients, the
second in another process, byte-checked; Mooncake's return conventions; a client killed."""
import os
import subprocess
import sys
import time

from conftest import HERE
from kv_peer import pattern


def test_two_clients():
    from hmc.kv import Master, MooncakeDistributedStore
    with Master(lease_ttl_ms=300, client_ttl_ms=500) as m:
        env = dict(os.environ, PYTHONPATH=os.path.join(HERE, ".."))
        p = subprocess.Popen([sys.executable, os.path.join(HERE, "kv_peer.py"), m.addr], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, env=env, text=True)
        try:
            ready = p.stdout.readline().split()
            assert ready[:2] == ["READY", "0"], ready
            ask = lambda line: (p.stdin.write(line + "\n"), p.stdin.flush(), p.stdout.readline().strip())[2]

            s = MooncakeDistributedStore()
            assert s.setup("127.0.0.1", "P2PHANDSHAKE", 32 << 20, 16 << 20, "tcp", "", m.addr) == 0, s.last_error
            assert s.get_hostname().startswith("127.0.0.1:")
            # This process's object, two replicas; the other process reads it.
            v1 = pattern(1, (1 << 20) + 3)
            assert s.put("k1", v1, 2) == 0, s.last_error
            assert ask(f"get k1 1 {len(v1)}") == "ok"
            # The other process's object, one replica in its segment; read here over the pool.
            assert ask("put k2 2 3145733 1") == "0"
            v2 = pattern(2, 3145733)  # before the get: building it took 0.3-0.5 s on a slow VM, past the lease
            assert s.get("k2") == v2
            assert s.get_size("k2") == 3145733
            assert s.is_exist("k2") == 1 and s.is_exist("nope") == 0
            # Mooncake's codes: a leased object refuses removal, a second put of a key, a missing key.
            assert s.remove("k2") == -706, s.last_error
            assert s.put("k1", b"again") == -705
            assert s.get("nope") == b"" and s.get_size("nope") == -704 and s.last_error
            assert s.put("p/1", b"x" * 100) == 0 and s.put("p/2", b"y" * 100) == 0
            time.sleep(0.4)  # the gets' leases end
            assert s.remove_by_regex("^p/") == 2
            assert s.remove("k2") == 0 and s.is_exist("k2") == 0
            assert ask("put k3 3 4096 1") == "0"
            # The other process is killed: k1 keeps the replica here; k3 only it held is gone.
            p.kill()
            p.wait()
            assert s.get("k1") == v1
            deadline = time.time() + 10
            while s.is_exist("k3") == 1 and time.time() < deadline:
                time.sleep(0.05)
            assert s.is_exist("k3") == 0 and s.get("k3") == b""
            assert s.remove_all() == 1  # k1
            assert s.close() == 0
            assert MooncakeDistributedStore().put("k", b"v") == -600  # not set up
        finally:
            p.kill()
            p.wait()
