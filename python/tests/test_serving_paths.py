"""The call sequences of the serving stacks' transfer paths, prefill here and decode in a child
(serving_peer.py), bytes checked by the decode side: SGLang's MooncakeTransferEngine against
vLLM's Mooncake connector worker, and SGLang's Ascend path (mf_adapter). Read from their code,
written here."""
import os
import subprocess
import sys

import pytest

from conftest import HERE, free_port

torch = pytest.importorskip("torch")
LAYERS, NBYTES = 4, 1 << 20


def expected(seed):
    return [((torch.arange(NBYTES, dtype=torch.int64) * (7 + i) + seed) % 251).to(torch.uint8) for i in range(LAYERS)]


def decode(compat_dir, *args):
    env = dict(os.environ, MC_FORCE_TCP="1", PYTHONPATH=os.pathsep.join([compat_dir, os.path.join(HERE, "..")]))
    p = subprocess.Popen([sys.executable, os.path.join(HERE, "serving_peer.py"), *args], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=env)
    line = p.stdout.readline().split()
    assert line[:1] == ["READY"], line
    return p, line[1], [int(a) for a in line[2:]]


def check(p, seed):
    p.stdin.write(f"check {seed}\n")
    p.stdin.flush()
    return p.stdout.readline().strip()


def blocks(bases, locals_, block=64 << 10):
    """Every other 64 KiB block of each layer (scattered KV blocks)."""
    src, dst, lens = [], [], []
    n = NBYTES // block
    for lb, rb in zip(locals_, bases):
        for j in range(0, n, 2):
            src.append(lb + j * block)
            dst.append(rb + j * block)
            lens.append(block)
    return src, dst, lens


def test_sglang_to_vllm_mooncake(compat_dir, monkeypatch):
    monkeypatch.setenv("MC_FORCE_TCP", "1")
    p, session, bases = decode(compat_dir, "vllm")
    try:
        # SGLang's MooncakeTransferEngine: initialize(hostname, "P2PHANDSHAKE", protocol, device)
        # with MOONCAKE_PROTOCOL's default "rdma", session id hostname:get_rpc_port().
        from mooncake.engine import TransferEngine
        engine = TransferEngine()
        assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "") == 0, engine.last_error
        session_id = f"127.0.0.1:{engine.get_rpc_port()}"
        assert engine.get_engine() is not None
        # The layers are views of one allocation (adjacent ranges), as a KV cache's often are:
        # registered in one batch, each is unregistered on its own below.
        kv = list(torch.cat(expected(3)).split(NBYTES))
        ptrs, lens = [t.data_ptr() for t in kv], [t.numel() for t in kv]
        assert ptrs[1] == ptrs[0] + NBYTES
        assert engine.batch_register_memory(ptrs, lens) == 0, engine.last_error  # batch_register
        assert engine.send_probe(session) == 0, engine.last_error
        # transfer_sync: one layer whole; batch_transfer_sync: the scattered blocks of the rest.
        assert engine.transfer_sync_write(session, ptrs[0], bases[0], lens[0]) == 0, engine.last_error
        src, dst, ln = blocks(bases[1:], ptrs[1:])
        assert engine.batch_transfer_sync_write(session, src, dst, ln) == 0, engine.last_error
        assert check(p, 3) == "bad"  # half of each of layers 1..3 is still zero
        src, dst, ln = blocks([b + (64 << 10) for b in bases[1:]], [a + (64 << 10) for a in ptrs[1:]])  # the odd blocks
        assert engine.batch_transfer_sync_write(session, src, dst, ln) == 0, engine.last_error
        assert check(p, 3) == "ok"
        assert session_id != session
        for a in ptrs:
            assert engine.unregister_memory(a) == 0
        assert engine.destroy() == 0
    finally:
        p.stdin.close()
        p.wait(20)


def test_sglang_ascend_mf_adapter(compat_dir):
    import mf_adapter
    from mf_adapter import TransferEngine
    url = f"tcp://127.0.0.1:{free_port()}"
    assert mf_adapter.create_config_store(url) == 0  # launch_ascend_mf_store.py's part
    engine = TransferEngine()
    session_id = f"127.0.0.1:{engine.get_rpc_port()}"  # before initialize, as SGLang does
    assert engine.initialize(url, session_id, "Prefill", 0, TransferEngine.TransDataOpType.SDMA) == 0
    p, session, bases = decode(compat_dir, "ascend", url)
    try:
        kv = expected(11)
        ptrs, lens = [t.data_ptr() for t in kv], [t.numel() for t in kv]
        assert engine.batch_register_memory(ptrs, lens) == 0
        assert engine.transfer_sync_write(session, ptrs[0], bases[0], lens[0]) == 0
        assert engine.batch_transfer_sync_write(session, ptrs[1:3], bases[1:3], lens[1:3]) == 0
        # A submit form given no stream runs at once; given a stream, which in a process without a
        # device driver cannot be one, it is refused with the reason.
        import memfabric_hybrid as mf
        assert engine.transfer_async_write_submit(session, ptrs[3], bases[3], lens[3], 0x1234) != 0
        assert "stream" in mf.get_and_clear_last_err_msg()
        assert engine.batch_transfer_async_write_submit(session, [ptrs[3]], [bases[3]], [lens[3]], 0) == 0
        assert check(p, 11) == "ok"
        back = torch.zeros(NBYTES, dtype=torch.uint8)
        assert engine.register_memory(back.data_ptr(), NBYTES) == 0
        assert engine.transfer_async_read_submit(session, back.data_ptr(), bases[2], NBYTES, None) == 0
        assert torch.equal(back, kv[2])
        with pytest.raises(ValueError, match="length"):
            engine.transfer_sync_write(session, ptrs[0], bases[0], -1)
        engine.unInitialize()
    finally:
        p.stdin.close()
        p.wait(20)
