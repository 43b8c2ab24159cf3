"""Two Python processes on loopback exchange bytes, NumPy arrays and torch tensors through HMC-Go."""
import os
import subprocess
import sys

import numpy as np
import pytest

import hmc

sys.path.insert(0, os.path.dirname(__file__))
from peer import CHECK, EXIT, FILL, STREAM, pattern  # noqa: E402

try:
    import torch
except ImportError:  # the torch test says so
    torch = None


def spawn_peer(tmp_path, secret=None):
    """Starts peer.py (a host-buffer session in another process); returns it and its ports."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    if secret is not None:
        env["HMC_TEST_SECRET"] = secret
    p = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "peer.py"), str(tmp_path)],
                         stdout=subprocess.PIPE, env=env, text=True)
    line = p.stdout.readline().split()
    assert line and line[0] == "READY", line
    return p, int(line[1]), int(line[2])


def start_peer(conn, tmp_path, mem_type=hmc.MemoryType.CPU, secret=None):
    """Starts peer.py and connects a session to it."""
    p, data_port, ctrl_port = spawn_peer(tmp_path, secret)
    s = hmc.create_session(buffer_size=32 << 20, mem_type=mem_type, num_chs=2, local_ip="127.0.0.1",
                           secret=secret)
    s.connect(peer_id=0, self_id=1, peer_ip="127.0.0.1", data_port=data_port, ctrl_tcp_port=ctrl_port,
              uds_dir=str(tmp_path), conn=conn)
    s.conn, s.peer_port = conn, data_port
    return s, p


def stop_peer(s, p):
    try:
        s.ctrl_send(0, EXIT)
    finally:
        s.close()
        assert p.wait(timeout=30) == 0


@pytest.fixture(params=[hmc.ConnType.TCP, hmc.ConnType.SHM, hmc.ConnType.AUTO], ids=lambda c: c.name)
def peer(request, tmp_path):
    s, p = start_peer(request.param, tmp_path)
    yield s
    stop_peer(s, p)


def ask(s, cmd, n, seed):
    s.ctrl_send(0, cmd)
    s.ctrl_send(0, n)
    s.ctrl_send(0, seed)
    return s.ctrl_recv(0) == 1


def test_bytes_put_then_tag(peer):
    for i, n in enumerate([1, 9, 4097, 3 << 20]):
        data = pattern(n, i)
        assert peer.put("127.0.0.1", peer.peer_port, data, conn=peer.conn) == n
        assert ask(peer, CHECK, n, i), f"{n} bytes not visible at the target"


def test_numpy_and_get_into(peer):
    x = np.frombuffer(pattern(4096 * 4, 3), dtype=np.int32).copy()
    peer.put("127.0.0.1", peer.peer_port, x, conn=peer.conn)
    assert ask(peer, CHECK, x.nbytes, 3)
    # Non-contiguous source: made contiguous, one copy.
    nc = np.frombuffer(pattern(2 * 4096, 4), dtype=np.uint8).reshape(2, 4096)[:, ::1].T.copy().T
    assert not nc.flags.c_contiguous
    n = peer.buf.put(nc)
    assert n == nc.nbytes and bytes(peer.buf.get(n)) == np.ascontiguousarray(nc).tobytes()
    # The target fills; we get into a NumPy array.
    assert ask(peer, FILL, 1 << 20, 5)
    y = np.empty(1 << 18, dtype=np.float32)
    peer.get_into("127.0.0.1", peer.peer_port, y, conn=peer.conn)
    assert y.tobytes() == pattern(1 << 20, 5)
    assert bytes(peer.get("127.0.0.1", peer.peer_port, 100, conn=peer.conn)) == pattern(100, 5)


@pytest.mark.skipif(torch is None, reason="torch (python3-torch) is not installed")
def test_torch_tensor(peer):
    t = torch.frombuffer(bytearray(pattern(8192, 6)), dtype=torch.int32)
    peer.put("127.0.0.1", peer.peer_port, t, conn=peer.conn)
    assert ask(peer, CHECK, 8192, 6)
    assert ask(peer, FILL, 8192, 7)
    out = torch.empty(2048, dtype=torch.int32)
    peer.get_into("127.0.0.1", peer.peer_port, out, conn=peer.conn)
    assert out.numpy().tobytes() == pattern(8192, 7)
    with pytest.raises(ValueError):
        peer.buf.get_into(torch.empty(4, 4).t())  # non-contiguous destination


def test_nb_wait_and_stream(peer):
    data = pattern(2 << 20, 8)
    peer.buf.put(data)
    ids = [peer.put_nb("127.0.0.1", peer.peer_port, off, off, 1 << 19, peer.conn) for off in range(0, 2 << 20, 1 << 19)]
    peer.wait(list(reversed(ids)))
    assert ask(peer, CHECK, 2 << 20, 8)
    big = pattern(40 << 20, 9)  # larger than both buffers
    peer.ctrl_send(0, STREAM)
    peer.ctrl_send(0, len(big))
    peer.ctrl_send(0, 9)
    assert peer.send_data("127.0.0.1", peer.peer_port, big, conn=peer.conn) == len(big)
    assert peer.ctrl_recv(0) == 1


def test_debug_stacks(peer):
    """The Go core's goroutines, for a watchdog: the session's own servers are among them."""
    text = hmc.debug_stacks()
    assert text.startswith("goroutine ") and "hmc-go/hmc" in text


def test_errors(peer):
    with pytest.raises(hmc.HMCStatusError) as e:
        peer.buf.put(b"x" * 100, offset=(32 << 20) - 10)  # buffer overflow
    assert e.value.status == hmc.Status.INVALID_CONFIG
    with pytest.raises(ValueError):
        peer.buf.get_into(b"read-only")
    a = np.zeros(10)
    a.flags.writeable = False
    with pytest.raises(ValueError):
        peer.buf.get_into(a)
    with pytest.raises(hmc.HMCStatusError) as e:
        peer.put_remote("127.0.0.1", 1, 0, 0, 8, peer.conn)  # not connected
    assert e.value.status == hmc.Status.NOT_FOUND
    with pytest.raises(hmc.HMCStatusError) as e:
        peer.wait(424242)
    assert e.value.status == hmc.Status.NOT_FOUND
    with pytest.raises(hmc.HMCStatusError) as e:
        peer.put_remote("127.0.0.1", peer.peer_port, 0, 0, 8, hmc.ConnType.UCX)
    assert e.value.status == hmc.Status.UNSUPPORT
    assert not hmc.memory_supported(hmc.MemoryType.MOORE_GPU)


cuda = pytest.mark.skipif(torch is None or not torch.cuda.is_available(), reason="no CUDA device (torch.cuda.is_available() is False)")


@cuda
def test_cuda_tensors_through_a_host_buffer(peer):
    """CUDA tensors go through their device pointer: D2H into the host buffer, then the put."""
    src = torch.frombuffer(bytearray(pattern(1 << 20, 21)), dtype=torch.uint8).cuda()
    peer.put("127.0.0.1", peer.peer_port, src, conn=peer.conn)
    assert ask(peer, CHECK, 1 << 20, 21)
    assert ask(peer, FILL, 1 << 20, 22)
    out = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    peer.get_into("127.0.0.1", peer.peer_port, out, conn=peer.conn)
    assert out.cpu().numpy().tobytes() == pattern(1 << 20, 22)
    big = torch.frombuffer(bytearray(pattern(40 << 20, 23)), dtype=torch.uint8).cuda()
    peer.ctrl_send(0, STREAM)
    peer.ctrl_send(0, 40 << 20)
    peer.ctrl_send(0, 23)
    peer.send_data("127.0.0.1", peer.peer_port, big, conn=peer.conn)
    assert peer.ctrl_recv(0) == 1


@cuda
def test_gpu_buffer_device_to_device():
    s = hmc.create_session(buffer_size=8 << 20, mem_type=hmc.MemoryType.NVIDIA_GPU)
    try:
        assert s.buf.size == 8 << 20
        t = torch.arange(1 << 16, dtype=torch.int32, device="cuda")
        n = s.buf.put(t, offset=4096)
        out = torch.empty_like(t)
        s.buf.get_into(out, offset=4096)
        assert torch.equal(out, t)
        host = np.arange(1000, dtype=np.int64)
        s.buf.put(host, offset=n + 8192)
        back = np.empty_like(host)
        s.buf.get_into(back, offset=n + 8192)
        assert (back == host).all()
    finally:
        s.close()


@cuda
@pytest.mark.parametrize("conn", [hmc.ConnType.TCP, hmc.ConnType.SHM], ids=lambda c: c.name)
def test_gpu_buffer_to_a_remote_host_buffer(conn, tmp_path):
    """A session whose ConnBuffer is GPU memory puts to and gets from a peer's host buffer: the
    transport moves device memory itself (TCP through its pinned staging ring, SHM by one device
    copy into the peer's mapping)."""
    s, p = start_peer(conn, tmp_path, hmc.MemoryType.NVIDIA_GPU)
    try:
        n = (5 << 20) + 3
        src = torch.frombuffer(bytearray(pattern(n, 31)), dtype=torch.uint8).cuda()
        s.buf.put(src, offset=0)
        s.put_remote("127.0.0.1", s.peer_port, 0, 0, n, conn)
        assert ask(s, CHECK, n, 31)
        assert ask(s, FILL, n, 32)
        s.get_remote("127.0.0.1", s.peer_port, 0, 0, n, conn)
        out = torch.empty(n, dtype=torch.uint8, device="cuda")
        s.buf.get_into(out, n, 0)
        assert out.cpu().numpy().tobytes() == pattern(n, 32)
    finally:
        stop_peer(s, p)


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_readme_snippet_pairs_with_server_example(tmp_path):
    """The README's Python snippet, run against python/examples/server.py, is what the server
    waits for: the server prints the tag and the bytes and exits cleanly."""
    import re
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    readme = open(os.path.join(root, "README.md")).read()
    snippet = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    data_port, ctrl_port = _free_port(), _free_port()
    snippet = snippet.replace("2025", str(data_port)).replace("5001", str(ctrl_port)).replace('"/tmp"', repr(str(tmp_path)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), HMC_DATA_PORT=str(data_port),
               HMC_CTRL_PORT=str(ctrl_port), HMC_UDS_DIR=str(tmp_path))
    srv = subprocess.Popen([sys.executable, os.path.join(root, "python", "examples", "server.py")],
                           stdout=subprocess.PIPE, env=env, text=True)
    try:
        assert srv.stdout.readline().strip() == "server ready"
        subprocess.run([sys.executable, "-c", snippet], env=env, check=True, timeout=60)
        out = srv.stdout.read()
        assert srv.wait(timeout=30) == 0
    finally:
        srv.kill()
    assert out.startswith("tag 1 received"), out[:200]
    want = np.arange(1024, dtype=np.int32).tobytes()
    assert repr(want)[:60] in out


@pytest.mark.parametrize("conn", [hmc.ConnType.TCP, hmc.ConnType.SHM], ids=lambda c: c.name)
def test_shared_secret(conn, tmp_path):
    """A peer demanding a secret serves a session holding it, and refuses one without it or
    with another (permission denied) before a byte moves."""
    p, data_port, ctrl_port = spawn_peer(tmp_path, secret="job-7 secret")
    try:
        for bad in (None, "a guess"):
            s = hmc.create_session(buffer_size=1 << 20, local_ip="127.0.0.1", secret=bad)
            with pytest.raises(hmc.HMCError, match="permission denied"):
                s.connect(peer_id=0, self_id=1, peer_ip="127.0.0.1", data_port=data_port,
                          ctrl_tcp_port=ctrl_port, uds_dir=str(tmp_path), conn=conn, timeout=10)
            s.close()
        s = hmc.create_session(buffer_size=1 << 20, local_ip="127.0.0.1", secret=b"job-7 secret")
        s.connect(peer_id=0, self_id=1, peer_ip="127.0.0.1", data_port=data_port,
                  ctrl_tcp_port=ctrl_port, uds_dir=str(tmp_path), conn=conn, timeout=10)
        data = pattern(100000, 3)
        s.put("127.0.0.1", data_port, data, conn=conn)
        assert ask(s, CHECK, len(data), 3)
        s.ctrl_send(0, EXIT)
        s.close()
        assert p.wait(timeout=30) == 0
    finally:
        if p.poll() is None:
            p.kill()
