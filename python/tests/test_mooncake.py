"""Mooncake's TransferEngine contract, as Mooncake's own wheel tests and its users exercise it:
`from mooncake.engine import TransferEngine` (HMC-Go's, through hmc.compat) in this process
against a target process (mc_target.py), under P2PHANDSHAKE, etcd (bare host:port, Mooncake's
form), Mooncake's HTTP metadata server (`hmc store serve --http`) and Redis. Written here from what
those tests do, not copied."""
import os
import random
import string
import subprocess
import sys
import time

import pytest

from conftest import HERE, free_port

METAS = ["p2p", "etcd", "http", "redis"]


def pattern(n, seed):
    return bytes((i * 7 + seed) % 256 for i in range(n))


def rand_bytes(n):
    return "".join(random.choices(string.ascii_letters + string.digits + string.punctuation, k=n)).encode()


class Side:
    """The initiator (this process) and a target process on one metadata server."""

    def __init__(self, kind, request):
        from mooncake.engine import TransferEngine
        self.kind = kind
        if kind == "p2p":
            self.meta, tname, iname = "P2PHANDSHAKE", "127.0.0.1", "127.0.0.1"
        else:
            self.meta = request.getfixturevalue(kind + "_meta")
            tname, iname = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([request.getfixturevalue("compat_dir"), os.path.join(HERE, "..")]))
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "mc_target.py"), self.meta, tname, "tcp"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        line = self.proc.stdout.readline().split()
        assert line[:1] == ["READY"], line
        self.target, self.remote = line[1], int(line[2])
        self.te = TransferEngine()
        assert self.te.initialize(iname, self.meta, "tcp", "") == 0, self.te.last_error
        self.name = iname if kind != "p2p" else f"127.0.0.1:{self.te.get_rpc_port()}"
        # Mooncake's initiator test: its own first buffer, else a managed one.
        self.local = self.te.get_first_buffer_address(self.name)
        if self.local == 0:
            self.local = self.te.allocate_managed_buffer(64 << 20)
        assert self.local != 0, self.te.last_error

    def wait_notify(self, want, timeout=20):
        end = time.time() + timeout
        while time.time() < end:
            for n in self.te.get_notifies():
                assert n.name == self.target, n
                return n.msg
            time.sleep(0.001)
        raise AssertionError(f"no notification ({want})")

    def close(self):
        self.te.send_notify(self.target, "exit")
        try:
            self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        assert self.te.destroy() == 0


@pytest.fixture(scope="module", params=METAS)
def side(request, compat_dir):
    s = Side(request.param, request)
    yield s
    s.close()


def test_random_write_read_round_trips(side):
    te, target, src, dst = side.te, side.target, side.local, side.remote
    for i in range(300):
        data = rand_bytes(random.randint(16, 256))
        assert te.write_bytes_to_buffer(src, data, len(data)) == 0, te.last_error
        assert te.transfer_sync_write(target, src, dst, len(data)) == 0, (i, te.last_error)
        assert te.write_bytes_to_buffer(src, bytes(len(data)), len(data)) == 0
        assert te.transfer_sync_read(target, src, dst, len(data)) == 0, (i, te.last_error)
        assert te.read_bytes_from_buffer(src, len(data)) == data, i


def _pieces(side, n=100, step=1024):
    return ([side.local + i * step for i in range(n)], [side.remote + i * step for i in range(n)])


def _fill(te, srcs):
    """Random bytes (32..128 each) written at srcs; returns them and their lengths."""
    data = [rand_bytes(random.randint(32, 128)) for _ in srcs]
    for a, d in zip(srcs, data):
        assert te.write_bytes_to_buffer(a, d, len(d)) == 0, te.last_error
    return data, [len(d) for d in data]


def _clear(te, srcs, lens):
    for a, n in zip(srcs, lens):
        assert te.write_bytes_to_buffer(a, bytes(n), n) == 0


def _round_trip(te, target, srcs, dsts, lens, arg=lambda v: v):
    """Random bytes of lens at srcs written to dsts with one batch, cleared here and read back
    with another; arg turns each of the three lists into what the calls are given."""
    data = [rand_bytes(k) for k in lens]
    for a, d in zip(srcs, data):
        assert te.write_bytes_to_buffer(a, d, len(d)) == 0, te.last_error
    assert te.batch_transfer_sync_write(target, arg(srcs), arg(dsts), arg(lens)) == 0, te.last_error
    _clear(te, srcs, lens)
    assert te.batch_transfer_sync_read(target, arg(srcs), arg(dsts), arg(lens)) == 0, te.last_error
    assert [te.read_bytes_from_buffer(a, k) for a, k in zip(srcs, lens)] == data


def test_batch_sync_write_read(side):
    te, target = side.te, side.target
    srcs, dsts = _pieces(side)
    for r in range(3):
        data, lens = _fill(te, srcs)
        assert te.batch_transfer_sync_write(target, srcs, dsts, lens) == 0, te.last_error
        _clear(te, srcs, lens)
        assert te.batch_transfer_sync_read(target, srcs, dsts, lens) == 0, te.last_error
        assert [te.read_bytes_from_buffer(a, n) for a, n in zip(srcs, lens)] == data, r


def test_batch_numpy_lists(side):
    # NumPy arrays of addresses and lengths are taken as they are (no per-entry conversion), as
    # KV connectors build them; a negative entry is refused naming it.
    import numpy as np
    te, target = side.te, side.target
    srcs, dsts = _pieces(side)
    data, lens = _fill(te, srcs)
    assert te.batch_transfer_sync_write(target, np.array(srcs, dtype=np.uint64), np.array(dsts, dtype=np.int64),
                                        np.array(lens, dtype=np.uint64)) == 0, te.last_error
    _clear(te, srcs, lens)
    assert te.batch_transfer_sync_read(target, np.array(srcs), dsts, np.array(lens)) == 0, te.last_error
    assert [te.read_bytes_from_buffer(a, n) for a, n in zip(srcs, lens)] == data
    bad = np.array(dsts, dtype=np.int64)
    bad[3] = -8
    with pytest.raises(ValueError, match=r"peer_buffer_addresses\[3\]"):
        te.batch_transfer_sync_write(target, srcs, bad, lens)
    # A range that runs past the address space: the library refuses the batch, naming the entry.
    wrap = np.array(dsts, dtype=np.uint64)
    wrap[5] = (1 << 64) - 16
    assert te.batch_transfer_sync_write(target, np.array(srcs, dtype=np.uint64), wrap, np.array(lens)) == -1
    assert "entry 5" in te.last_error and "address space" in te.last_error, te.last_error


def test_batch_numpy_uint64_fast_path(side):
    # Three one-dimensional uint64 arrays go to the library by address, unchecked in Python:
    # the bytes land and read back; a read-only array, a strided view and arrays of different
    # lengths take the checked path and behave as there.
    import numpy as np
    te, target = side.te, side.target
    srcs, dsts = _pieces(side)
    u = lambda v: np.array(v, dtype=np.uint64)  # noqa: E731
    data, lens = _fill(te, srcs)
    assert te.batch_transfer_sync_write(target, u(srcs), u(dsts), u(lens)) == 0, te.last_error
    _clear(te, srcs, lens)
    ro = u(dsts)
    ro.flags.writeable = False
    assert te.batch_transfer_sync_read(target, u(srcs), ro, u(lens)) == 0, te.last_error
    assert [te.read_bytes_from_buffer(a, n) for a, n in zip(srcs, lens)] == data
    _clear(te, srcs, lens)
    every = np.empty(2 * len(dsts), dtype=np.uint64)
    every[::2] = dsts
    assert te.batch_transfer_sync_read(target, u(srcs), every[::2], u(lens)) == 0, te.last_error
    assert [te.read_bytes_from_buffer(a, n) for a, n in zip(srcs, lens)] == data
    assert te.batch_transfer_sync_write(target, u(srcs), u(dsts)[:-1], u(lens)) == -1
    assert "different lengths" in te.last_error, te.last_error
    wrap = u(dsts)
    wrap[5] = (1 << 64) - 16
    assert te.batch_transfer_sync_write(target, u(srcs), wrap, u(lens)) == -1
    assert "entry 5" in te.last_error and "address space" in te.last_error, te.last_error


def test_batch_async_write_read(side):
    te, target = side.te, side.target
    srcs, dsts = _pieces(side)
    for r in range(3):
        data, lens = _fill(te, srcs)
        bid = te.batch_transfer_async_write(target, srcs, dsts, lens)
        assert bid != 0, te.last_error
        assert te.get_batch_transfer_status([bid]) == 0, te.last_error
        _clear(te, srcs, lens)
        bid = te.batch_transfer_async(target, srcs, dsts, lens, te.TransferOpcode.Read)
        assert bid != 0, te.last_error
        assert te.get_batch_transfer_status([bid]) == 0
        assert [te.read_bytes_from_buffer(a, n) for a, n in zip(srcs, lens)] == data, r
    # The same batches as uint64 NumPy arrays, which go to the library by address; a wrapped
    # range is refused whole with the entry named, as from lists.
    import numpy as np
    u = lambda v: np.array(v, dtype=np.uint64)  # noqa: E731
    data, lens = _fill(te, srcs)
    bid = te.batch_transfer_async_write(target, u(srcs), u(dsts), u(lens))
    assert bid != 0, te.last_error
    assert te.get_batch_transfer_status([bid]) == 0, te.last_error
    _clear(te, srcs, lens)
    bid = te.batch_transfer_async_read(target, u(srcs), u(dsts), u(lens))
    assert bid != 0, te.last_error
    assert te.get_batch_transfer_status([bid]) == 0, te.last_error
    assert [te.read_bytes_from_buffer(a, n) for a, n in zip(srcs, lens)] == data
    wrap = u(dsts)
    wrap[3] = (1 << 64) - 16
    assert te.batch_transfer_async_write(target, u(srcs), wrap, u(lens)) == 0
    assert "entry 3" in te.last_error and "address space" in te.last_error, te.last_error
    # One write submitted, polled to completion (1), checked by the target.
    data = pattern(4096, 5)
    te.write_bytes_to_buffer(side.local, data, len(data))
    bid = te.transfer_submit_write(target, side.local, side.remote, len(data))
    assert bid != 0, te.last_error
    st = 0
    while st == 0:
        st = te.transfer_check_status(bid)
    assert st == 1, te.last_error
    assert te.send_notify(target, f"check 5 0 {len(data)}") == 0
    assert side.wait_notify("ok") == "ok 5"


def test_notify_with_transfer(side):
    from mooncake.engine import TransferNotify
    te = side.te
    data = pattern(1 << 16, 9)
    te.write_bytes_to_buffer(side.local, data, len(data))
    # transfer_sync with a notification: delivered after the bytes, with the sender's name.
    n = TransferNotify(side.name, f"check 9 4096 {len(data)}")
    assert te.transfer_sync(side.target, side.local, side.remote + 4096, len(data), te.TransferOpcode.Write, n) == 0
    assert side.wait_notify("ok") == "ok 9"
    n = TransferNotify(side.name, "check 9 0 8192")
    assert te.batch_transfer_sync(side.target, [side.local, side.local + 4096], [side.remote, side.remote + 4096],
                                  [4096, 4096], te.TransferOpcode.Write, notify=n) == 0
    assert side.wait_notify("ok") == "ok 9"


def test_unknown_peer(side):
    te = side.te
    # Mooncake's own check: async submits to an unknown peer return 0, the failure sentinel.
    assert te.batch_transfer_async_write("unreachable_peer:9", [0], [0], [16]) == 0
    assert te.transfer_submit_write("unreachable_peer:9", 0, 0, 16) == 0
    gone = f"127.0.0.1:{free_port()}"  # well formed; not published, nothing listens
    assert te.batch_transfer_async_write(gone, [side.local], [side.remote], [16]) == 0
    assert te.transfer_sync_write(gone, side.local, side.remote, 16) == -1
    assert te.last_error
    # send_probe: 0 for the live target, non-zero for unknown peers, never a crash.
    assert te.send_probe(side.target) == 0, te.last_error
    assert te.last_error == ""  # a success clears it
    assert te.send_probe("unreachable_peer:9") != 0
    assert te.send_probe(gone) != 0
    if side.kind != "p2p":
        assert "not published" in te.last_error


def test_surface_and_argument_checks(side):
    import mooncake.engine as me
    te = side.te
    assert me.TransferOpcode.Read == 0 and me.TransferOpcode.Write == 1 and me.Read == 0 and me.Write == 1
    assert te.TransferOpcode is me.TransferOpcode
    assert me.SUPPORT_CUDA is True
    assert te.get_engine() is not None and te.get_engine_ptr() != 0
    import json
    topo = json.loads(te.get_local_topology())
    assert "cpu:0" in topo and all(len(v) == 2 for v in topo.values())
    assert te.warmup_efa_segment(side.target) == 0
    assert te.get_first_buffer_address(side.target) == side.remote
    # Bad values raise ValueError naming the argument, before the library sees them.
    for call, arg in [(lambda: te.transfer_sync_write(side.target, side.local, side.remote, -1), "length"),
                      (lambda: te.transfer_sync_read(side.target, -5, side.remote, 8), "buffers[0]"),
                      (lambda: te.register_memory(side.local, 1 << 64), "capacity"),
                      (lambda: te.batch_transfer_sync_write(side.target, [side.local], [-1], [8]), "peer_buffer_addresses[0]"),
                      (lambda: te.transfer_sync_write(side.target, side.local, side.remote, 8, transport_hint="carrier-pigeon"), "transport_hint")]:
        with pytest.raises(ValueError) as e:
            call()
        assert arg in str(e.value), e.value
        assert "{" not in str(e.value)  # a reason, not a struct dump
    # Mismatched lists: Mooncake's failure values.
    assert te.batch_transfer_sync_write(side.target, [side.local], [side.remote, side.remote], [8]) == -1
    assert te.batch_transfer_async_write(side.target, [side.local], [], [8]) == 0
    # A write to memory the target did not register fails; a success clears last_error.
    assert te.transfer_sync_write(side.target, side.local, 4096, 8) == -1
    assert te.last_error and "{" not in te.last_error
    assert te.transfer_sync_write(side.target, side.local, side.remote, 8) == 0 and te.last_error == ""
    assert te.allocate_managed_buffer(0) == 0 and "length 0" in te.last_error
    # Bytes helpers refuse memory the engine does not know (Mooncake would copy, or crash).
    assert te.write_bytes_to_buffer(8, b"x", 1) == -1
    # The stream-ordered forms: stream 0 (nothing queued in a process without CUDA) runs at once;
    # a stream handle in a process with no device driver is refused, typed, before a byte moves.
    assert te.transfer_write_on_cuda(side.target, side.local, side.remote, 8) is None
    with pytest.raises(RuntimeError, match="no device driver"):
        te.transfer_write_on_cuda(side.target, side.local, side.remote, 8, stream_ptr=0x1234)


def test_initialize_contract(compat_dir, monkeypatch):
    from mooncake.engine import TransferEngine
    te = TransferEngine()
    with pytest.raises(ValueError, match="port"):
        te.initialize("127.0.0.1:70000", "P2PHANDSHAKE", "tcp", "")
    for proto in ("efa", "nvlink", "ascend"):
        assert te.initialize("127.0.0.1", "P2PHANDSHAKE", proto, "") == -1
        assert "tcp" in te.last_error
    monkeypatch.delenv("MC_FORCE_TCP", raising=False)
    # "rdma" (SGLang's and vLLM's default) needs UCX's RDMA and a device; without them it fails
    # with the way out, and MC_FORCE_TCP=1 (Mooncake's switch) selects tcp.
    if te.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "") == 0:
        te.destroy()
        pytest.skip("this host has RDMA through UCX")
    assert "MC_FORCE_TCP=1" in te.last_error, te.last_error
    monkeypatch.setenv("MC_FORCE_TCP", "1")
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "mlx5_0") == 0, te.last_error
    assert te.get_rpc_port() > 0 and te.last_error == ""
    assert te.destroy() == 0
    # A metadata server given as Mooncake's initialize_ext takes it.
    te = TransferEngine()
    assert te.initialize_ext("127.0.0.1", "P2PHANDSHAKE", "tcp", "", "etcd") == 0
    te.destroy()
    assert TransferEngine().initialize("127.0.0.1", "zookeeper://127.0.0.1:1", "tcp", "") == -1


def test_concurrent_batches(side):
    # vLLM's sender pool: several threads call batch_transfer_sync_write on one engine at once,
    # each on its own blocks; every block read back equals what its thread wrote.
    import threading
    te, target = side.te, side.target
    n, block, per = 8, 4096, 16
    errors = []

    def worker(w):
        base = w * per * block
        data = [bytes([(w * 31 + j) % 256]) * block for j in range(per)]
        for j, d in enumerate(data):
            te.write_bytes_to_buffer(side.local + base + j * block, d, block)
        for r in range(5):
            srcs = [side.local + base + j * block for j in range(per)]
            dsts = [side.remote + base + j * block for j in range(per)]
            if te.batch_transfer_sync_write(target, srcs, dsts, [block] * per) != 0:
                errors.append((w, r, "write"))

    ts = [threading.Thread(target=worker, args=(w,)) for w in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors, errors
    # Read everything back in one batch and compare.
    scratch = side.local + n * per * block
    total = n * per * block
    assert te.batch_transfer_sync_read(target, [scratch], [side.remote], [total]) == 0, te.last_error
    got = te.read_bytes_from_buffer(scratch, total)
    want = b"".join(bytes([(w * 31 + j) % 256]) * block for w in range(n) for j in range(per))
    assert got == want


def test_metadata_server_not_there(compat_dir):
    # An etcd that is not there: initialize says so on stderr within a second, then every few
    # seconds, and returns -1 at MC_TRANSFER_TIMEOUT naming the address and the dial error.
    code = ("import time; from mooncake.engine import TransferEngine; te = TransferEngine(); t = time.time(); "
            "rc = te.initialize('127.0.0.1', '127.0.0.1:%d', 'tcp', ''); print(rc, round(time.time() - t, 1)); "
            "print(te.last_error)" % free_port())
    env = dict(os.environ, MC_TRANSFER_TIMEOUT="5", PYTHONPATH=os.pathsep.join([compat_dir, os.path.join(HERE, "..")]))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rc, took = r.stdout.split("\n")[0].split()
    assert rc == "-1" and float(took) < 10, r.stdout
    assert "connection refused" in r.stdout and "etcd at [127.0.0.1:" in r.stdout, r.stdout
    assert r.stderr.count("store: not reachable yet") >= 2, r.stderr


def test_device_memory_registered(compat_dir):
    # A GPU pointer registered with the engine is device memory (it used to be taken as host
    # memory: a crash or garbage): transfers from and into it move its bytes through device
    # copies, and the bytes helpers reach it too. The GPU is the library's emulation here
    # (HMC_EMULATE_GPU=1) where no CUDA device exists, whose device addresses the host cannot touch.
    code = ("import hmc\nfrom mooncake.engine import TransferEngine\n"
            "s = hmc.create_session(buffer_size=1 << 20, mem_type=hmc.MemoryType.NVIDIA_GPU, local_ip='127.0.0.1')\n"
            "te = TransferEngine(); assert te.initialize('127.0.0.1', 'P2PHANDSHAKE', 'tcp', '') == 0\n"
            "me = te.get_local_hostname()\n"
            "assert te.register_memory(s.buf.ptr, 1 << 20) == 0, te.last_error\n"
            "data = bytes(range(256)) * 16\n"
            "s.buf.put(data, offset=8192)\n"
            "dst = te.allocate_managed_buffer(1 << 16)\n"
            "assert te.transfer_sync_write(me, s.buf.ptr + 8192, dst + 5, 4096) == 0, te.last_error\n"
            "assert te.read_bytes_from_buffer(dst + 5, 4096) == data\n"
            "assert te.write_bytes_to_buffer(s.buf.ptr + 100, b'device', 6) == 0, te.last_error\n"
            "assert te.read_bytes_from_buffer(s.buf.ptr + 100, 6) == b'device'\n"
            "assert te.transfer_sync_read(me, s.buf.ptr, dst + 5, 4096) == 0, te.last_error\n"
            "assert bytes(s.buf.get(4096)) == data\n"
            "assert te.transfer_sync_write(me, s.buf.ptr + (1 << 20) - 8, dst, 4096) == -1\n"
            "print('ok', te.last_error)\n")
    env = dict(os.environ, HMC_EMULATE_GPU="1", PYTHONPATH=os.pathsep.join([compat_dir, os.path.join(HERE, "..")]))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    # What follows the allocation: host memory under the emulation, anything on a real device.
    assert r.stdout.startswith("ok ") and "ends in" in r.stdout, r.stdout


def test_batch_uniform_lengths(side):
    # A list of equal lengths is converted in one pass; one that differs anywhere, or holds a
    # non-int, takes the per-entry path (the bytes land either way; a bad entry is named).
    te, target = side.te, side.target
    srcs, dsts = _pieces(side)
    n = min(len(srcs), 8)
    srcs, dsts = srcs[:n], dsts[:n]
    for lens in ([100] * n, [100] * (n - 1) + [99]):
        _round_trip(te, target, srcs, dsts, lens)
    with pytest.raises(TypeError, match=r"lengths\[2\]"):
        te.batch_transfer_sync_write(target, srcs, dsts, [100, 100, "x"] + [100] * (n - 3))


def test_batch_one_call_paths(side, monkeypatch):
    # Three lists of plain ints, and three one-dimensional uint64 NumPy arrays, each go to the
    # library in one call (pylist.c reads them and runs the batch, the GIL released meanwhile):
    # the bytes land and read back. Lengths that repeat one object (a KV batch's [size] * n)
    # are read once per run of it: runs of two values alternate here. What that call declines
    # (a range past the address space, a float) takes the checked path, which names the entry.
    import numpy as np
    from hmc import _lib
    te, target = side.te, side.target
    x, y, x2 = 1000, 700, int("1000")  # x2: x's value, another object
    calls = []

    def counted(f):
        def call(*args):
            calls.append(f)
            return f(*args)
        return call

    assert _lib.u64_lists([0]) is not None and _lib._xfer is not None, "CPython's list layout is known here"
    monkeypatch.setattr(_lib, "_xfer", counted(_lib._xfer))
    for n in (300, 64):  # past the library's stack array (256 requests), and within it
        srcs, dsts = _pieces(side, n=n)
        lens = ([x, x, y, y, y, x2] * n)[:n - 4] + [y, x2, x, y]
        _round_trip(te, target, srcs, dsts, lens)
    assert len(calls) == 4, calls
    # The opcode forms without a notification take the same call.
    data = [rand_bytes(k) for k in lens]
    for a, d in zip(srcs, data):
        assert te.write_bytes_to_buffer(a, d, len(d)) == 0, te.last_error
    assert te.batch_transfer_sync(target, srcs, dsts, lens, te.TransferOpcode.Write) == 0, te.last_error
    _clear(te, srcs, lens)
    assert te.batch_transfer_sync(target, srcs, dsts, lens, te.TransferOpcode.Read) == 0, te.last_error
    assert te.transfer_sync(target, srcs[0], dsts[0], lens[0], te.TransferOpcode.Read) == 0, te.last_error
    assert [te.read_bytes_from_buffer(a, k) for a, k in zip(srcs, lens)] == data
    assert len(calls) == 7, calls
    wrap = list(dsts)
    wrap[5] = (1 << 64) - 16
    assert te.batch_transfer_sync_write(target, srcs, wrap, lens) == -1
    assert "entry 5" in te.last_error and "address space" in te.last_error, te.last_error
    with pytest.raises(TypeError, match=r"lengths\[3\]"):
        te.batch_transfer_sync_write(target, srcs, dsts, lens[:3] + [1.0] + lens[4:])

    u = lambda v: np.array(v, dtype=np.uint64)  # noqa: E731
    assert te.batch_transfer_sync_write(target, u(srcs), u(dsts), u(lens)) == 0, te.last_error
    assert _lib._np, "NumPy's array layout is read right here"
    monkeypatch.setattr(_lib, "_np", (_lib._np[0], counted(_lib._np[1])))
    del calls[:]
    _round_trip(te, target, srcs, dsts, lens, u)
    assert len(calls) == 2, calls
    assert te.batch_transfer_sync_write(target, u(srcs), u(dsts)[:-1], u(lens)) == -1  # declined, then named
    assert "different lengths" in te.last_error, te.last_error
