"""A serving instance for test_kv_serving.py, written the way SGLang's HiCache Mooncake backend
(mem_cache/storage/mooncake_store/mooncake_store.py) and vLLM's store connector call Mooncake
Store: ``from mooncake.store import MooncakeDistributedStore`` (the compat package), setup with
the engine argument, a warm-up put/get, a host KV pool registered with register_buffer, then
batch_is_exist for the prefix hit and batch_get_into / batch_get_into_multi_buffers straight into
the pool. argv: master address. Each stdin line is a JSON command; each answer one JSON line."""
import json
import sys
import uuid

import torch


def page(seed, i, n):
    """Page i's bytes for seed: what the writer stored."""
    g = torch.Generator().manual_seed(seed * 100003 + i)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)


def main():
    from mooncake.store import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", 64 << 20, 16 << 20, "tcp", "", sys.argv[1], None)
    key = "warmup_" + uuid.uuid4().hex
    val = bytes(4096)
    ok = rc == 0 and s.put(key, val) == 0 and s.is_exist(key) == 1 and s.get(key) == val
    print(json.dumps({"ready": ok, "rc": rc, "err": s.last_error}), flush=True)
    pool = None
    for line in sys.stdin:
        q = json.loads(line)
        op, r = q["op"], {}
        if op == "hicache_get":  # MHA page-first: a _k and a _v object per page
            n, pb, seed = q["pages"], q["page_bytes"], q["seed"]
            pool = torch.zeros((n, 2, pb), dtype=torch.uint8)
            r["register"] = s.register_buffer(pool.data_ptr(), pool.numel())
            keys, ptrs, sizes = [], [], []
            for i in range(n):
                for j, kv in enumerate("kv"):
                    keys.append(f"{q['prefix']}{i}_0_{kv}")
                    ptrs.append(pool[i, j].data_ptr())
                    sizes.append(pb)
            ex = s.batch_is_exist(keys)
            hit = next((i for i, e in enumerate(ex) if e != 1), len(ex)) // 2
            got = s.batch_get_into(keys[:2 * hit], ptrs[:2 * hit], sizes[:2 * hit])
            bad = [i for i in range(hit) for j in range(2) if not torch.equal(pool[i, j], page(seed, 2 * i + j, pb))]
            r.update(hit=hit, got=sorted(set(got)), bad=bad, unregister=s.unregister_buffer(pool.data_ptr()))
        elif op == "mla_get":  # layer-first MLA: one object per page from one buffer per layer
            n, layers, lb, seed = q["pages"], q["layers"], q["layer_bytes"], q["seed"]
            pool = torch.zeros((layers, n, lb), dtype=torch.uint8)
            keys = [f"{q['prefix']}{i}_k" for i in range(n)]
            ptrs = [[pool[l, i].data_ptr() for l in range(layers)] for i in range(n)]
            sizes = [[lb] * layers for _ in range(n)]
            got = s.batch_get_into_multi_buffers(keys, ptrs, sizes)
            bad = [i for i in range(n) if not torch.equal(pool[:, i].reshape(-1), page(seed, i, layers * lb))]
            r.update(got=sorted(set(got)), bad=bad)
        elif op == "get":
            v = s.get(q["key"])
            r.update(hex=v.hex(), err=s.last_error)
        elif op == "tensor":
            t = s.get_tensor(q["key"])
            r.update(dtype=str(t.dtype), shape=list(t.shape), values=t.float().flatten().tolist()) if t is not None else r.update(none=True)
        elif op == "exit":
            break
        print(json.dumps(r), flush=True)
    print(json.dumps({"close": s.close()}), flush=True)


if __name__ == "__main__":
    main()
