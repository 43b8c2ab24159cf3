"""A rank of test_memfabric: `mf_peer.py MODE COORD_URL STORE_URL WORLD RANK [ID0 ID1]`.

COORD_URL is a separate HMC store the test serves for the ranks' own rendezvous (an
unranked hmc.store.Store client), so each mode uses only memfabric_hybrid's API on its own
store. Prints "OK <rank>" or raises."""
import ctypes
import sys

import numpy as np

import memfabric_hybrid as mf
from hmc.store import Store
from memfabric_hybrid import bm, shm

MIB = 1 << 20


def pattern(n, seed):
    return ((np.arange(n, dtype=np.uint64) * 7 + seed) % 256).astype(np.uint8)


def wait_key(st, key):
    return st.get(key, wait=60)


def run_bm(st, url, world, rank):
    cfg = bm.BmConfig()
    cfg.auto_ranking = False
    cfg.rank_id = rank
    cfg.start_store = rank == 0
    assert bm.initialize(url, world, 0, cfg) == 0, mf.get_last_err_msg()
    assert bm.bm_rank_id() == rank
    big = bm.create(0, 32 * MIB, 0, bm.BmDataOpType.HOST_TCP)
    mine = big.peer_rank_ptr(rank, bm.BmMemType.HOST)
    assert big.local_mem_size(bm.BmMemType.HOST) == 32 * MIB
    own = pattern(4096, rank)
    ctypes.memmove(mine, own.ctypes.data, 4096)  # the local slice is plain memory
    assert big.join() == 0, mf.get_last_err_msg()
    st.set("joined/%d" % rank, b"1")
    for r in range(world):
        wait_key(st, "joined/%d" % r)
    nxt = (rank + 1) % world
    theirs = big.peer_rank_ptr(nxt, bm.BmMemType.HOST)
    assert big.get_rank_id_by_gva(theirs + 5) == nxt
    src = pattern(65536, 100 + rank)
    assert big.register(src.ctypes.data, src.nbytes) == 0
    assert big.copy_data(src.ctypes.data, theirs + MIB, src.nbytes, bm.BmCopyType.H2G) == 0, mf.get_last_err_msg()
    back = np.zeros(4096, dtype=np.uint8)
    assert big.copy_data(theirs, back.ctypes.data, 4096, bm.BmCopyType.G2H) == 0
    assert np.array_equal(back, pattern(4096, nxt))
    # a batch, and AUTO
    srcs = [src.ctypes.data + i * 8192 for i in range(4)]
    dsts = [theirs + 2 * MIB + i * 4096 for i in range(4)]
    assert big.copy_data_batch(srcs, dsts, [4096] * 4, 4, bm.BmCopyType.AUTO, 1) == 0
    assert big.wait() == 0
    # the same batch's shape as uint64 NumPy arrays (taken by address), into the next 16 KiB
    asrc = np.array(srcs, dtype=np.uint64) + 4096
    adst = np.array(dsts, dtype=np.uint64) + 4 * 4096
    assert big.copy_data_batch(asrc, adst, np.full(4, 4096, dtype=np.uint64), 4, bm.BmCopyType.H2G) == 0
    assert big.copy_data(src.ctypes.data, theirs + 32 * MIB - 8, 16, bm.BmCopyType.H2G) != 0  # past the slice
    mf.get_and_clear_last_err_msg()
    st.set("wrote/%d" % rank, b"1")
    prev = (rank + world - 1) % world
    wait_key(st, "wrote/%d" % prev)
    got = np.ctypeslib.as_array((ctypes.c_uint8 * 65536).from_address(mine + MIB))
    assert np.array_equal(got, pattern(65536, 100 + prev))
    for i in range(8):  # the list batch's pieces, then the arrays'
        piece = np.ctypeslib.as_array((ctypes.c_uint8 * 4096).from_address(mine + 2 * MIB + i * 4096))
        k = i % 4 * 8192 + (4096 if i >= 4 else 0)
        assert np.array_equal(piece, pattern(65536, 100 + prev)[k:k + 4096]), i
    st.set("checked/%d" % rank, b"1")
    for r in range(world):
        wait_key(st, "checked/%d" % r)
    assert big.unregister(src.ctypes.data) == 0
    if rank == 0:  # rank 0 serves the store: it leaves last
        for r in range(1, world):
            wait_key(st, "left/%d" % r)
    big.destroy()
    bm.uninitialize()
    st.set("left/%d" % rank, b"1")


def run_shm(st, url, world, rank):
    cfg = shm.ShmConfig()
    cfg.start_store = rank == 0
    assert shm.initialize(url, world, rank, 0, cfg) == 0, mf.get_last_err_msg()
    sm = shm.create(0, world, rank, 2 * MIB)
    assert sm.local_rank == rank and sm.rank_size == world and sm.gva != 0
    ctypes.memset(sm.gva + rank * 2 * MIB, 50 + rank, 16)
    assert sm.barrier() == 0
    for r in range(world):  # co-located blocks are plain memory at gva + r * size
        assert ctypes.string_at(sm.gva + r * 2 * MIB, 1)[0] == 50 + r
        assert sm.topology_can_reach(r) & shm.ShmDataOpType.RDMA
    got = sm.all_gather(local_data=bytes([rank, 9]))  # upstream's keyword names
    assert got == b"".join(bytes([r, 9]) for r in range(world)), got
    assert sm.set_context(context=b"kernel args") == 0
    assert sm.query_support_data_operation() & shm.ShmDataOpType.MTE
    assert sm.barrier() == 0
    assert sm.destroy() == 0  # collective
    if rank == 0:  # rank 0 serves the store: it leaves last
        for r in range(1, world):
            wait_key(st, "left/%d" % r)
    shm.uninitialize()
    st.set("left/%d" % rank, b"1")


def run_te(st, url, rank, ids):
    """SGLang's AscendTransferEngine calls: initialize with "host:rpcport" and a role,
    get_rpc_port, batch_register_memory, batch_transfer_sync_write."""
    if rank == 0:  # SGLang's launcher (launch_ascend_mf_store.py) starts the store
        assert mf.create_config_store(url) == 0, mf.get_last_err_msg()
    te = mf.TransferEngine()
    role = "Prefill" if rank == 0 else "Decode"
    assert te.initialize(url, ids[rank], role, 0) == 0, mf.get_last_err_msg()
    assert 15000 <= te.get_rpc_port() < 25000
    if rank == 1:
        kv = np.zeros(1 << 20, dtype=np.uint8)
        # registered as uint64 NumPy arrays: the writes into kv below land only if this took
        assert te.batch_register_memory(np.array([kv.ctypes.data], dtype=np.uint64),
                                        np.array([kv.nbytes], dtype=np.uint64)) == 0
        st.set("kv", str(kv.ctypes.data).encode())
        wait_key(st, "sent")
        assert np.array_equal(kv[:8192], pattern(8192, 3)), kv[:16]
        assert np.array_equal(kv[65536:65536 + 4096], pattern(8192, 3)[4096:])
        for i in range(8):  # the batches of NumPy arrays (uint64, then int64), reversed
            at = 131072 + i % 4 * 8192 + (65536 if i >= 4 else 0)
            assert np.array_equal(kv[at:at + 2048], pattern(8192, 3)[(3 - i % 4) * 2048:(4 - i % 4) * 2048]), i
        st.set("checked", b"1")
    else:
        remote = int(wait_key(st, "kv"))
        src = pattern(8192, 3)
        assert te.batch_register_memory([src.ctypes.data], [src.nbytes]) == 0
        bufs = [src.ctypes.data, src.ctypes.data + 4096]
        peers = [remote, remote + 4096]
        assert te.batch_transfer_sync_write(ids[1], bufs, peers, [4096, 4096]) == 0, mf.get_last_err_msg()
        assert te.transfer_sync_write(ids[1], src.ctypes.data + 4096, remote + 65536, 4096) == 0
        # KV connectors build their batches as uint64 NumPy arrays: taken by address, no
        # per-entry conversion (scattered, the pieces reversed)
        u = np.array([src.ctypes.data + (3 - i) * 2048 for i in range(4)], dtype=np.uint64)
        v = np.array([remote + 131072 + i * 8192 for i in range(4)], dtype=np.uint64)
        n = np.full(4, 2048, dtype=np.uint64)
        assert te.batch_transfer_sync_write(ids[1], u, v, n) == 0, mf.get_last_err_msg()
        # np.array of Python ints (int64, the default dtype): converted in one pass
        assert te.batch_transfer_sync_write(ids[1], u.astype(np.int64), v.astype(np.int64) + 65536,
                                            np.array([2048] * 4)) == 0, mf.get_last_err_msg()
        assert te.batch_transfer_sync_write(ids[1], u, v[:3], n) != 0  # lengths that differ
        mf.get_and_clear_last_err_msg()
        st.set("sent", b"1")
        wait_key(st, "checked")
    te.destroy()


def main():
    import os
    import threading
    if os.environ.get("MF_PEER_WATCHDOG"):
        import hmc

        def dog():
            import time
            time.sleep(float(os.environ["MF_PEER_WATCHDOG"]))
            sys.stderr.write(hmc.debug_stacks())
        threading.Thread(target=dog, daemon=True).start()
    mode, coord, url, world, rank = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    mf.initialize()
    with Store(coord, rank=False) as st:
        if mode == "bm":
            run_bm(st, url, world, rank)
        elif mode == "shm":
            run_shm(st, url, world, rank)
        else:
            run_te(st, url, rank, sys.argv[6:8])
    mf.uninitialize()
    print("OK", rank, flush=True)


if __name__ == "__main__":
    main()
