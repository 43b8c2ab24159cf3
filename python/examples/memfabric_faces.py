"""memfabric_hybrid's three faces from Python, two ranks on this host: a starting point.

    python3 python/examples/memfabric_faces.py bm      # Big Memory: one global address space
    python3 python/examples/memfabric_faces.py shm     # Share Memory: a symmetric heap
    python3 python/examples/memfabric_faces.py trans   # the transfer engine: prefill -> decode

The launcher serves the config store (create_config_store) and starts both ranks as child
processes of this file; each rank uses only memfabric_hybrid's API. Every rank checks what it
received and prints "rank N: ok"; the launcher exits 0 when both did.
"""
import ctypes
import os
import socket
import subprocess
import sys
import time

import memfabric_hybrid as mf
from memfabric_hybrid import bm, shm

MIB = 1 << 20
MSG = b"hello from rank 0 through "


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(addr, want, timeout=30):
    """Polls local memory at addr until it holds want (a peer writes it one-sidedly)."""
    end = time.time() + timeout
    while ctypes.string_at(addr, len(want)) != want:
        if time.time() > end:
            raise TimeoutError(f"no {want!r} at {addr:#x}")
        time.sleep(0.001)


def rank_bm(url, rank):
    cfg = bm.BmConfig()
    cfg.auto_ranking, cfg.rank_id, cfg.start_store = False, rank, False
    assert bm.initialize(url, 2, 0, cfg) == 0, mf.get_last_err_msg()
    big = bm.create(0, 4 * MIB, 0, bm.BmDataOpType.HOST_TCP)
    assert big.join() == 0, mf.get_last_err_msg()
    mine = big.peer_rank_ptr(rank, bm.BmMemType.HOST)      # this rank's slice: plain memory
    other = big.peer_rank_ptr(1 - rank, bm.BmMemType.HOST)  # the peer's, by global address
    if rank == 0:
        msg = ctypes.create_string_buffer(MSG + b"Big Memory")
        # H2G into rank 1's slice (waits for rank 1 to join if it has not yet)
        assert big.copy_data(ctypes.addressof(msg), other, len(msg), bm.BmCopyType.H2G) == 0, mf.get_last_err_msg()
        wait_for(mine, b"ack")                              # rank 1's answer lands in our slice
    else:
        wait_for(mine, MSG)
        print("rank 1 got:", ctypes.string_at(mine).decode())
        ack = ctypes.create_string_buffer(b"ack")
        assert big.copy_data(ctypes.addressof(ack), other, 3, bm.BmCopyType.H2G) == 0
    big.destroy()
    bm.uninitialize()


def rank_shm(url, rank):
    cfg = shm.ShmConfig()
    cfg.start_store = False
    assert shm.initialize(url, 2, rank, 0, cfg) == 0, mf.get_last_err_msg()
    heap = shm.create(0, 2, rank, 2 * MIB)
    block = heap.gva + rank * 2 * MIB                       # rank r's block sits at gva + r * size
    note = b"rank %d was here" % rank
    ctypes.memmove(block, note, len(note))
    assert heap.barrier() == 0
    peer = ctypes.string_at(heap.gva + (1 - rank) * 2 * MIB, len(note))
    assert peer == b"rank %d was here" % (1 - rank), peer
    assert heap.all_gather(local_data=bytes([rank])) == bytes([0, 1])
    assert heap.destroy() == 0                              # collective
    shm.uninitialize()


def rank_trans(url, rank, ids):
    te = mf.TransferEngine()
    assert te.initialize(url, ids[rank], "Prefill" if rank == 0 else "Decode", 0) == 0, mf.get_last_err_msg()
    buf = ctypes.create_string_buffer(MIB)
    assert te.register_memory(ctypes.addressof(buf), MIB) == 0
    if rank == 1:
        print("KV", ctypes.addressof(buf), flush=True)      # the launcher hands it to rank 0
        wait_for(ctypes.addressof(buf), MSG)
        print("rank 1 got:", buf.value.decode())
    else:
        remote = int(sys.stdin.readline())
        buf.value = MSG + b"the transfer engine"
        assert te.transfer_sync_write(ids[1], ctypes.addressof(buf), remote, len(buf.value) + 1) == 0, mf.get_last_err_msg()
    te.destroy()


def launch(face):
    url = f"tcp://127.0.0.1:{free_port()}"
    assert mf.create_config_store(url) == 0, mf.get_last_err_msg()  # this process serves the store
    ids = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    ranks = [subprocess.Popen([sys.executable, __file__, face, url, str(r), *ids], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for r in range(2)]
    if face == "trans":  # decode's buffer address, to prefill (serving stacks use their own channel)
        line = ranks[1].stdout.readline().split()
        ranks[0].stdin.write(line[1] + "\n")
        ranks[0].stdin.flush()
    ok = True
    for r, p in enumerate(ranks):
        out, _ = p.communicate(timeout=120)
        sys.stdout.write(out)
        ok = ok and p.returncode == 0
    return 0 if ok else 1


def main():
    face = sys.argv[1] if len(sys.argv) > 1 else "bm"
    if face not in ("bm", "shm", "trans"):
        sys.exit("usage: memfabric_faces.py bm|shm|trans")
    if len(sys.argv) <= 2:
        sys.exit(launch(face))
    url, rank, ids = sys.argv[2], int(sys.argv[3]), sys.argv[4:6]
    {"bm": lambda: rank_bm(url, rank), "shm": lambda: rank_shm(url, rank),
     "trans": lambda: rank_trans(url, rank, ids)}[face]()
    print(f"rank {rank}: ok", flush=True)


if __name__ == "__main__":
    main()
