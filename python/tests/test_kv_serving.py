"""Serving stacks' call sequences on the KV-cache pool, through ``mooncake.store`` (the compat
package, as SGLang and vLLM import it), two instances in two processes, byte-checked: SGLang
HiCache's page-first MHA backup (batch_is_exist, then batch_put_from of the missing _k/_v pages
from a registered host pool) and prefetch (prefix hit, batch_get_into into the other instance's
pool), the layer-first MLA form (batch_put_from_multi_buffers / batch_get_into_multi_buffers),
tensors, upsert, put_parts, buffers, removal with force, health_check and the setup dict."""
import json
import os
import subprocess
import sys
import time

import pytest
import torch

from conftest import HERE
from kv_serving_peer import page


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("site"))
    env = dict(os.environ, PYTHONPATH=os.path.join(HERE, ".."))
    r = subprocess.run([sys.executable, "-m", "hmc.compat", "install", "--target", d], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    sys.path.insert(0, d)
    yield d
    sys.path.remove(d)
    for m in [m for m in sys.modules if m == "mooncake" or m.startswith("mooncake.")]:
        del sys.modules[m]


def test_hicache_and_vllm_paths(shim):
    from hmc.kv import Master
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig
    with Master(lease_ttl_ms=200, client_ttl_ms=1000) as m:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([shim, os.path.join(HERE, ".."), HERE]))
        p = subprocess.Popen([sys.executable, os.path.join(HERE, "kv_serving_peer.py"), m.addr], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, env=env, text=True)
        try:
            ready = json.loads(p.stdout.readline())
            assert ready["ready"], ready

            def ask(**q):
                p.stdin.write(json.dumps(q) + "\n")
                p.stdin.flush()
                return json.loads(p.stdout.readline())

            s = MooncakeDistributedStore()
            cfg = {"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE", "global_segment_size": 64 << 20,
                   "protocol": "tcp", "master_server_addr": m.addr}
            assert s.setup(cfg) == 0, s.last_error
            assert s.health_check() == 0
            assert s.setup(cfg) == -600  # once

            # HiCache backup, page-first MHA: 48 pages of 16 KiB, K and V per page.
            n, pb, seed = 48, 16 << 10, 7
            pool = torch.stack([torch.stack([page(seed, 2 * i, pb), page(seed, 2 * i + 1, pb)]) for i in range(n)])
            assert s.register_buffer(pool.data_ptr(), pool.numel()) == 0, s.last_error
            keys = [f"h{i}_0_{kv}" for i in range(n) for kv in "kv"]
            ptrs = [pool[i, j].data_ptr() for i in range(n) for j in range(2)]
            sizes = [pb] * len(keys)
            half = len(keys) // 2
            assert s.batch_put_from(keys[:half], ptrs[:half], sizes[:half]) == [0] * half, s.last_error
            ex = s.batch_is_exist(keys)
            assert ex == [1] * half + [0] * (len(keys) - half)
            missing = [i for i, e in enumerate(ex) if e != 1]
            assert s.batch_put_from([keys[i] for i in missing], [ptrs[i] for i in missing], [sizes[i] for i in missing],
                                    ReplicateConfig()) == [0] * len(missing)
            assert s.batch_put_from(keys[:2], ptrs[:2], sizes[:2]) == [-705, -705]  # exist: Mooncake's code
            # The other instance prefetches the whole prefix into its own pool.
            r = ask(op="hicache_get", prefix="h", pages=n, page_bytes=pb, seed=seed)
            assert r == {"register": 0, "hit": n, "got": [pb], "bad": [], "unregister": 0}, r
            # Reads here too: into a buffer too small (Mooncake: INVALID_PARAMS), a missing key.
            small = torch.zeros(pb - 1, dtype=torch.uint8)
            dst = torch.zeros(pb, dtype=torch.uint8)
            got = s.batch_get_into([keys[5], keys[6], "nothing"], [small.data_ptr(), dst.data_ptr(), dst.data_ptr()],
                                   [pb - 1, pb, pb])
            assert got == [-600, pb, -704], got
            assert torch.equal(dst, pool[3, 0])
            assert s.get_into(keys[7], dst.data_ptr(), pb) == pb and torch.equal(dst, pool[3, 1])

            # Layer-first MLA: each page's object gathered from one buffer per layer.
            layers, lb = 8, 2 << 10
            mla = torch.stack([page(seed + 1, i, layers * lb).reshape(layers, lb) for i in range(16)]).transpose(0, 1).contiguous()
            mkeys = [f"m{i}_k" for i in range(16)]
            res = s.batch_put_from_multi_buffers(mkeys, [[mla[l, i].data_ptr() for l in range(layers)] for i in range(16)],
                                                 [[lb] * layers for _ in range(16)], ReplicateConfig())
            assert res == [0] * 16, s.last_error
            r = ask(op="mla_get", prefix="m", pages=16, layers=layers, layer_bytes=lb, seed=seed + 1)
            assert r == {"got": [layers * lb], "bad": []}, r

            # Tensors, with dtype and shape.
            t = torch.arange(24, dtype=torch.float16).reshape(2, 3, 4) / 8
            assert s.put_tensor("t1", t) == 0
            r = ask(op="tensor", key="t1")
            assert r["dtype"] == "torch.float16" and r["shape"] == [2, 3, 4] and r["values"] == t.float().flatten().tolist()
            assert torch.equal(s.get_tensor("t1"), t) and s.get_tensor("nothing") is None
            assert s.batch_put_tensor(["t2", "t3"], [torch.ones(3), torch.zeros(0, 2)]) == [0, 0]
            got = s.batch_get_tensor(["t2", "t3"])
            assert torch.equal(got[0], torch.ones(3)) and got[1].shape == (0, 2)

            # put_parts, put_batch, get_batch, get_buffer, upsert forms.
            assert s.put_parts("pp", b"head-", bytearray(b"middle-"), memoryview(b"tail")) == 0
            assert ask(op="get", key="pp")["hex"] == b"head-middle-tail".hex()
            assert s.put_batch(["b1", "b2"], [b"one", b"two"]) == 0
            assert s.get_batch(["b1", "nothing", "b2"]) == [b"one", b"", b"two"]
            h = s.get_buffer("b2")
            assert len(h) == 3 and h.size() == 3 and bytes(h) == b"two" and h.ptr() != 0
            assert s.get_buffer("nothing") is None
            time.sleep(0.3)  # the gets' leases end
            assert s.upsert("b1", b"ONE!") == 0 and ask(op="get", key="b1")["hex"] == b"ONE!".hex()
            assert s.upsert("new", b"fresh") == 0 and s.get("new") == b"fresh"
            time.sleep(0.3)
            assert s.upsert_parts("b2", b"T", b"WO") == 0 and s.get("b2") == b"TWO"
            src = torch.full((100,), 9, dtype=torch.uint8)
            time.sleep(0.3)
            assert s.batch_upsert_from(["b1", "u2"], [src.data_ptr()] * 2, [100, 50]) == [0, 0]
            assert s.upsert_from("u3", src.data_ptr(), 10) == 0 and s.put_from("u4", src.data_ptr(), 10) == 0
            assert s.get("b1") == bytes([9] * 100) and s.get_size("u2") == 50
            assert s.upsert("b1", b"x") == -714  # a reader's lease holds it: OBJECT_REPLICA_BUSY

            # Removal: a leased key refuses unless force; batch_remove's codes; remove_all.
            assert s.remove("b1") == -706 and s.remove("b1", force=True) == 0
            assert s.batch_remove(["b2", "nothing"], force=True) == [0, -704]
            assert s.remove_by_regex("^u", force=True) == 3
            assert s.remove_all(force=True) > 0 and s.batch_is_exist(keys[:3]) == [0, 0, 0]
            assert s.unregister_buffer(pool.data_ptr()) == 0 and s.unregister_buffer(pool.data_ptr()) == -600
            # Bad input: clear codes, never a crash.
            assert s.batch_put_from(["a", "b"], [ptrs[0]], [pb]) == [-600, -600] and "2 keys" in s.last_error
            assert s.put_from("z", 0, 10) == -600
            assert s.put("", b"x") == -400
            assert s.close() == 0 and s.health_check() == 1
            assert ask(op="exit")["close"] == 0
        finally:
            p.kill()
            p.wait()
