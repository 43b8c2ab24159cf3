"""Every face checks sizes, offsets, ids and ports in Python: a negative or oversized value
raises ValueError naming the argument (ctypes would wrap -1 to 2**64 - 1 and Go would report a
range nobody passed)."""
import pytest

import hmc
import memfabric_hybrid.bm as bm
import memfabric_hybrid.shm as shm
from memfabric_hybrid import TransferEngine as MfEngine


@pytest.fixture(scope="module")
def sess():
    s = hmc.create_session(buffer_size=1 << 20, local_ip="127.0.0.1")
    yield s
    s.close()


@pytest.mark.parametrize("call,arg", [
    (lambda s: s.buf.get(-1), "nbytes"),
    (lambda s: s.buf.put(b"abc", offset=-5), "offset"),
    (lambda s: s.buf.copy_within(0, -1, 4), "src_offset"),
    (lambda s: s.put_remote("127.0.0.1", 70000, 0, 0, 8), "port"),
    (lambda s: s.get_remote("127.0.0.1", 2025, 0, -8, 8), "remote_off"),
    (lambda s: s.put("127.0.0.1", 2025, b"x", remote_off=1 << 64), "remote_off"),
    (lambda s: s.get("127.0.0.1", 2025, -3), "nbytes"),
    (lambda s: s.put_pipeline("127.0.0.1", 2025, 0, 0, 64, chunk=-1), "chunk"),
    (lambda s: s.connect(peer_id=0, self_id=1, peer_ip="127.0.0.1", data_port=-1), "data_port"),
    (lambda s: s.ctrl_send(-1, 5), "peer"),
    (lambda s: hmc.create_session(buffer_size=-1), "buffer_size"),
    (lambda s: bm.create(0, -4), "local_dram_size"),
    (lambda s: shm.create(0, 1, 0, -1), "local_mem_size"),
    (lambda s: MfEngine().transfer_sync_write("127.0.0.1:1", 0, 0, -1), "length"),
    (lambda s: MfEngine().batch_transfer_sync_read("127.0.0.1:1", [0], [-2], [8]), "peer_buffers[0]"),
])
def test_bad_values_name_the_argument(sess, call, arg):
    with pytest.raises(ValueError) as e:
        call(sess)
    assert str(e.value).startswith(arg + " must be in"), e.value


def test_wrong_types(sess):
    with pytest.raises(TypeError, match="offset must be an int"):
        sess.buf.put(b"abc", offset="3")
    with pytest.raises(TypeError, match="length must be an int"):
        MfEngine().transfer_sync_write("127.0.0.1:1", 0, 0, 1.5)
