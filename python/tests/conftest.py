import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))

# Import the package from this checkout (python/hmc), whatever the working directory.
sys.path.insert(0, os.path.join(HERE, ".."))


def free_port():
    """A free loopback port below the ephemeral range (where outgoing connections and port-0
    listeners of parallel tests do not take it)."""
    lo = 20000
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo = int(f.read().split()[0])
    except (OSError, ValueError):
        pass
    import random
    for _ in range(200):
        p = random.randrange(10000, max(10001, lo - 1))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p))
            except OSError:
                continue
            return p
    raise RuntimeError("no free port")


def need(binary, require_env, package):
    """The path of binary; a skip without it, or a failure where require_env=1 (CI)."""
    path = shutil.which(binary)
    if path is None:
        if os.environ.get(require_env) == "1":
            pytest.fail(f"{require_env}=1 but there is no {binary} (apt-get install {package})")
        pytest.skip(f"no {binary} (apt-get install {package})")
    return path


def daemon(argv, port, what):
    """Runs argv until the session ends, once it listens on port."""
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, p, what)
        yield
    finally:
        p.terminate()
        p.wait()


def wait_port(port, proc, what, timeout=30):
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not come up on port {port}")


@pytest.fixture(scope="session")
def compat_dir(tmp_path_factory):
    """The compatibility packages (mooncake.engine, mf_adapter) installed into a directory of
    their own, as `python3 -m hmc.compat install --target DIR` does; on sys.path."""
    d = str(tmp_path_factory.mktemp("compat"))
    env = dict(os.environ, PYTHONPATH=os.path.join(HERE, ".."))
    r = subprocess.run([sys.executable, "-m", "hmc.compat", "install", "--target", d], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    sys.path.insert(0, d)
    return d


@pytest.fixture(scope="session")
def hmc_bin(tmp_path_factory):
    """The hmc command: $HMC_BIN (scripts/gpu-check's prebuilt one), else built from this checkout."""
    if os.environ.get("HMC_BIN"):
        return os.environ["HMC_BIN"]
    if shutil.which("go") is None:
        pytest.skip("go is not on PATH")
    out = str(tmp_path_factory.mktemp("bin") / "hmc")
    subprocess.check_call(["go", "build", "-o", out, "./cmd/hmc"], cwd=REPO)
    return out


@pytest.fixture(scope="session")
def http_meta(hmc_bin):
    """Mooncake's HTTP metadata server, served by `hmc store serve --http`."""
    p = subprocess.Popen([hmc_bin, "store", "serve", "--http", f"127.0.0.1:{free_port()}"], stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline().split()
    assert line[:1] == ["serving"] and line[1].startswith("http://"), line
    yield line[1]
    p.terminate()
    p.wait()


@pytest.fixture(scope="session")
def redis_meta():
    """Debian's redis-server as Mooncake's redis:// metadata server."""
    port = free_port()
    for _ in daemon([need("redis-server", "HMC_REQUIRE_REDIS", "redis-server"), "--bind", "127.0.0.1", "--port", str(port),
                     "--save", "", "--appendonly", "no"], port, "redis-server"):
        yield f"redis://127.0.0.1:{port}"


@pytest.fixture(scope="session")
def etcd_meta():
    """An etcd of its own (Debian's etcd-server), as Mooncake's metadata server: its address in
    Mooncake's bare host:port form."""
    etcd = need("etcd", "HMC_REQUIRE_ETCD", "etcd-server")
    d = tempfile.mkdtemp(prefix="hmc-etcd-")
    client, peer = free_port(), free_port()
    try:
        for _ in daemon([etcd, "--data-dir", d, "--listen-client-urls", f"http://127.0.0.1:{client}",
                         "--advertise-client-urls", f"http://127.0.0.1:{client}",
                         "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                         "--initial-cluster", f"default=http://127.0.0.1:{peer}"], client, "etcd"):
            yield f"127.0.0.1:{client}"
    finally:
        shutil.rmtree(d, ignore_errors=True)
