"""memfabric_hybrid (upstream's Python API) across processes: Big Memory, Share Memory's host
side, and the TransferEngine the way SGLang drives it."""
import os
import socket
import subprocess
import sys

import pytest

from hmc.store import Store

HERE = os.path.dirname(os.path.abspath(__file__))


def free_addr():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    a = "127.0.0.1:%d" % s.getsockname()[1]
    s.close()
    return a


def run_ranks(mode, world, extra=()):
    coord_addr = free_addr()
    with Store("tcp://" + coord_addr, rank=False, serve=True):
        url = "tcp://" + free_addr()
        env = dict(os.environ, PYTHONPATH=os.path.join(HERE, ".."))
        procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "mf_peer.py"), mode, "tcp://" + coord_addr, url,
                                   str(world), str(r), *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, env=env) for r in range(world)]
        outs = []
        for p in procs:
            try:
                out, _ = p.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
            outs.append((p.returncode, out))
    bad = [out for rc, out in outs if rc != 0 or "OK" not in out]
    assert not bad, "\n---\n".join(out for _, out in outs)


def test_bm_four_ranks():
    run_ranks("bm", 4)


def test_shm_host_side():
    run_ranks("shm", 2)


def test_transfer_engine_sglang_shape():
    run_ranks("te", 2, (free_addr(), free_addr()))


def test_paths_and_tls_key():
    import memfabric_hybrid as mf
    inc = mf.get_include_path()
    for h in ("smem/host/smem.h", "smem/host/smem_bm.h", "smem/host/smem_shm.h", "smem/host/smem_trans.h"):
        assert os.path.isfile(os.path.join(inc, h)), h
    lib = mf.get_lib_path()
    assert os.path.isfile(os.path.join(lib, "libhmc.so")), lib
    assert mf.set_conf_store_tls_key("-----BEGIN PRIVATE KEY-----", "pw", lambda s: s) == 0
    assert mf.set_conf_store_tls_key("", "pw") != 0
    with pytest.raises(TypeError):
        mf.set_conf_store_tls_key("key", "pw", "not callable")


@pytest.mark.parametrize("face", ["bm", "shm", "trans"])
def test_examples(face):
    # docs/memfabric.md's starting points run as documented: two ranks, each checks what it got.
    ex = os.path.join(HERE, "..", "examples", "memfabric_faces.py")
    r = subprocess.run([sys.executable, ex, face], capture_output=True, text=True, timeout=180,
                       env=dict(os.environ, PYTHONPATH=os.path.join(HERE, "..")))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "rank 0: ok" in r.stdout and "rank 1: ok" in r.stdout, r.stdout
