"""hmc.trans.TransferEngine with Mooncake's API, against a peer process (trans_peer.py)."""
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from hmc.trans import TransferEngine

torch = pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))


def pattern(n, seed):
    return ((np.arange(n, dtype=np.uint64) * 7 + seed) % 256).astype(np.uint8)


@pytest.fixture
def peer():
    p = subprocess.Popen([sys.executable, os.path.join(HERE, "trans_peer.py"), "P2PHANDSHAKE"],
                         stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=os.path.join(HERE, "..")))
    line = p.stdout.readline().split()
    assert line and line[0] == "READY", line
    yield line[1], int(line[2])
    p.kill()
    p.wait()


def wait_notify(te, want, timeout=20):
    end = time.time() + timeout
    while time.time() < end:
        for _, msg in te.get_notifies():
            return msg
        time.sleep(0.001)
    raise AssertionError("no notification")


def test_mooncake_api(peer):
    target, remote = peer
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, te.last_error
    assert te.get_rpc_port() > 0
    assert te.get_first_buffer_address(target) == remote

    # transfer_sync_write from a NumPy array, checked by the peer.
    src = pattern(1 << 20, 3)
    assert te.register_memory(src.ctypes.data, src.nbytes) == 0
    assert te.transfer_sync_write(target, src.ctypes.data, remote, src.nbytes) == 0, te.last_error
    assert te.send_notify(target, "check 3 %d" % src.nbytes) == 0
    assert wait_notify(te, "ok") == "ok"

    # A torch tensor as the local buffer (its data_ptr), batch write of 4 pieces, read back.
    t = torch.arange(4 << 16, dtype=torch.int32)
    n = t.numel() * 4
    piece = n // 4
    bufs = [t.data_ptr() + i * piece for i in range(4)]
    peers = [remote + (3 - i) * piece for i in range(4)]  # reversed on the peer
    assert te.batch_transfer_sync_write(target, bufs, peers, [piece] * 4) == 0, te.last_error
    back = torch.zeros_like(t)
    assert te.batch_transfer_sync_read(target, [back.data_ptr() + i * piece for i in range(4)], peers, [piece] * 4) == 0
    assert torch.equal(back, t)

    # Async: submit, poll the status until done (1), Mooncake's convention.
    dst = np.zeros(1 << 20, dtype=np.uint8)
    bid = te.transfer_submit_write(target, src.ctypes.data, remote, src.nbytes)
    assert bid >= 0, te.last_error
    st = 0
    while st == 0:
        st = te.transfer_check_status(bid)
    assert st == 1
    assert te.transfer_sync_read(target, dst, remote, dst.nbytes) == 0  # a NumPy array as buffer
    assert np.array_equal(dst, src)

    # Errors are negative returns with the text in last_error, never exceptions.
    assert te.transfer_sync_write(target, src.ctypes.data, 4096, 8) < 0
    assert "no such region" in te.last_error or "not found" in te.last_error.lower()
    assert te.transfer_sync_write("127.0.0.1:1", src.ctypes.data, remote, 8) < 0

    # Managed buffers and batch registration.
    m = te.allocate_managed_buffer(1 << 20)
    assert m != 0
    assert te.free_managed_buffer(m, 1 << 20) == 0
    arrs = [np.zeros(4096, dtype=np.uint8) for _ in range(100)]
    assert te.batch_register_memory([a.ctypes.data for a in arrs], [a.nbytes for a in arrs]) == 0
    assert te.batch_unregister_memory([a.ctypes.data for a in arrs]) == 0
    assert te.unregister_memory(src.ctypes.data) == 0

    assert te.send_notify(target, "exit") == 0
    assert te.destroy() == 0
