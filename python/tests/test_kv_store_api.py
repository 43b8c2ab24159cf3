"""What Mooncake's own store tests (mooncake-wheel/tests/test_distributed_object_store.py)
exercise, written here from the API's documented behaviour against HMC-Go's pool: setup from a
config dict with human-readable sizes (a percentage refused), close and set up again on the
same object (the client's objects go with its segment), put/get/exist/remove, batch_is_exist,
the zero-copy forms on a registered buffer, batch_get_into / batch_put_from, batch_get_buffer,
ReplicateConfig, and eight threads putting and getting at once on one store."""
import ctypes
import os
import threading
import time

import pytest

from hmc.kv import Master, MooncakeDistributedStore, ReplicateConfig

LEASE_MS = 200


@pytest.fixture(scope="module")
def master():
    with Master(lease_ttl_ms=LEASE_MS) as m:
        yield m


def config(m, seg="16MB", buf="16 MB"):
    return {"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE", "global_segment_size": seg,
            "local_buffer_size": buf, "protocol": "tcp", "master_server_addr": m.addr}


@pytest.fixture
def store(master):
    s = MooncakeDistributedStore()
    assert s.setup(config(master, "64MB")) == 0, s.last_error
    yield s
    s.close()


def test_config_dict_sizes(master):
    s = MooncakeDistributedStore()
    assert s.setup(config(master)) == 0, s.last_error
    key = f"cfg_{os.getpid()}"
    assert s.put(key, b"human-readable sizes") == 0 and s.get(key) == b"human-readable sizes"
    assert s.close() == 0
    bad = MooncakeDistributedStore()
    assert bad.setup(config(master, "50%")) != 0 and "50%" in bad.last_error


def test_close_and_set_up_again(master):
    s = MooncakeDistributedStore()
    assert s.setup(config(master)) == 0
    assert s.put("teardown_key", b"Hello, World!") == 0
    assert s.close() == 0
    assert s.setup(config(master)) == 0, s.last_error  # the same object, again
    assert s.get("teardown_key") == b""  # its only replica left with the old segment
    assert s.put("teardown_key", b"Hello, World!") == 0 and s.get("teardown_key") == b"Hello, World!"
    assert s.close() == 0


def test_put_get_exist_remove(store):
    data = os.urandom(100_000)
    assert store.put("basic", data) == 0
    assert store.is_exist("basic") == 1 and store.get_size("basic") == len(data)
    assert store.get("basic") == data
    assert store.put("basic", b"other") == -705
    time.sleep(LEASE_MS / 1000 + 0.05)
    assert store.remove("basic") == 0
    assert store.is_exist("basic") == 0 and store.get("basic") == b"" and store.get_size("basic") < 0


def test_batch_is_exist(store):
    keys = [f"bx_{i}" for i in range(10)]
    for k in keys[::2]:
        assert store.put(k, k.encode()) == 0
    assert store.batch_is_exist(keys) == [1, 0] * 5
    assert store.batch_is_exist([]) == []


def test_zero_copy(store):
    n = 1 << 20
    buf = (ctypes.c_ubyte * (2 * n))()
    addr = ctypes.addressof(buf)
    assert store.register_buffer(addr, 2 * n) == 0
    src = os.urandom(n)
    ctypes.memmove(addr, src, n)
    assert store.put_from("zc", addr, n) == 0
    assert store.get_into("zc", addr + n, n) == n
    assert ctypes.string_at(addr + n, n) == src
    assert store.get_into("zc", addr + n, n - 1) == -600  # the buffer must hold the object
    assert store.unregister_buffer(addr) == 0


def test_batch_put_from_and_get_into(store):
    count, n = 16, 64 << 10
    src = (ctypes.c_ubyte * (count * n))()
    dst = (ctypes.c_ubyte * (count * n))()
    base, out = ctypes.addressof(src), ctypes.addressof(dst)
    vals = [os.urandom(n) for _ in range(count)]
    for i, v in enumerate(vals):
        ctypes.memmove(base + i * n, v, n)
    keys = [f"bp_{i}" for i in range(count)]
    assert store.batch_put_from(keys, [base + i * n for i in range(count)], [n] * count) == [0] * count
    got = store.batch_get_into(keys + ["missing"], [out + i * n for i in range(count)] + [out], [n] * (count + 1))
    assert got == [n] * count + [-704]
    assert [ctypes.string_at(out + i * n, n) for i in range(count)] == vals
    hs = store.batch_get_buffer(keys[:3] + ["missing"])
    assert [bytes(h) for h in hs[:3]] == vals[:3] and hs[3] is None


def test_replicate_config(store):
    c = ReplicateConfig()
    assert c.replica_num == 1 and not c.with_soft_pin and "replica_num" in str(c)
    c.replica_num = 1
    assert store.put("rc", b"with a config", c) == 0 and store.get("rc") == b"with a config"


def test_threads_put_and_get_at_once(store):
    threads, per, n = 8, 12, 256 << 10
    errors = []
    start = threading.Barrier(threads)

    def worker(t):
        try:
            data = os.urandom(n)
            keys = [f"th_{t}_{i}" for i in range(per)]
            start.wait()
            for k in keys:
                assert store.put(k, data) == 0, store.last_error
            for k in keys:
                assert store.get(k) == data
        except Exception as e:  # reported below
            errors.append(f"thread {t}: {e!r}")

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors, errors
    time.sleep(LEASE_MS / 1000 + 0.05)
    assert store.remove_by_regex("^th_") == threads * per


def test_allocate_and_mount_segment(master):
    # A client lending nothing at setup mounts a segment later, another client's objects land
    # in it, and unmount_and_free_segment takes them out with it.
    s = MooncakeDistributedStore()
    assert s.setup(config(master, "0")) == 0, s.last_error
    r = s.allocate_and_mount_segment(8 << 20, "tcp", "cpu")
    assert r["ret"] == 0 and len(r["segment_ids"]) == 1 and r["allocated_size"] == 8 << 20, (r, s.last_error)
    assert s.allocate_and_mount_segment(8 << 20, "tcp", "tpu:0")["ret"] == -600
    assert s.mount_segment("/dev/shm/x", 1 << 20)["ret"] == -600 and "allocate_and_mount_segment" in s.last_error
    other = MooncakeDistributedStore()
    assert other.setup(config(master, "0")) == 0
    assert other.put("in_mounted", b"lent later") == 0 and s.get("in_mounted") == b"lent later"
    time.sleep(LEASE_MS / 1000 + 0.05)
    assert s.unmount_and_free_segment(r["segment_ids"]) == 0
    assert other.is_exist("in_mounted") == 0
    assert s.unmount_and_free_segment(r["segment_ids"]) == -101  # SEGMENT_NOT_FOUND
    assert other.close() == 0 and s.close() == 0


def test_protocols(master, monkeypatch):
    # "rdma" is UCX's RDMA, as the transfer engine's: refused with the reason where there is none
    # (or MC_FORCE_TCP=1 makes it tcp); an unknown protocol is refused.
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "carrier-pigeon", "", master.addr) == -600
    monkeypatch.delenv("MC_FORCE_TCP", raising=False)
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "rdma", "", master.addr)
    if rc == 0:  # a UCX build on a host with an RDMA device
        assert s.close() == 0
    else:
        assert rc == -600 and s.last_error, s.last_error
    monkeypatch.setenv("MC_FORCE_TCP", "1")
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 1 << 20, 0, "rdma", "", master.addr) == 0, s.last_error
    assert s.put("forced", b"over tcp") == 0 and s.get("forced") == b"over tcp", s.last_error
    assert s.close() == 0
