"""test_fork's scenario of a parent that has loaded the library: a forked child fails every call
at once with ForkError; a spawned child works. Prints "spawn <initialize's result>"."""
import multiprocessing as mp
import os
import time

import hmc
import memfabric_hybrid
from mooncake.engine import TransferEngine


def child(q, te):
    t0 = time.time()
    errs = []
    for call in (lambda: TransferEngine().initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""),
                 lambda: te.send_probe(te.get_local_hostname()),
                 # calls the parent made before fork (the library's functions are then cached)
                 lambda: te.batch_transfer_sync_write(te.get_local_hostname(), [1 << 40], [1 << 41], [64]),
                 lambda: hmc.memory_supported(1),
                 lambda: memfabric_hybrid.initialize()):
        try:
            call()
            errs.append("no error")
        except hmc.ForkError as e:
            errs.append(str(e))
    q.put((errs, time.time() - t0))


def spawned(q):
    t = TransferEngine()
    q.put(t.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""))
    t.destroy()


def main():
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    te.send_probe(te.get_local_hostname())
    assert te.batch_transfer_sync_write(te.get_local_hostname(), [1 << 40], [1 << 41], [64]) == -1  # unregistered
    parent = os.getpid()
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q, te))
    p.start()
    errs, took = q.get(timeout=30)
    p.join(10)
    for e in errs:
        assert f"loaded in pid {parent} before fork" in e and "spawn" in e, e
    assert took < 1, took
    sctx = mp.get_context("spawn")
    q2 = sctx.Queue()
    p2 = sctx.Process(target=spawned, args=(q2,))
    p2.start()
    print("spawn", q2.get(timeout=60))
    p2.join(10)
    te.destroy()


if __name__ == "__main__":
    main()
