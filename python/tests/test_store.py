"""The config store from Python: primitives, errors, a group of two clients."""
import socket
import threading

import pytest

import hmc
from hmc.store import Store


def _url():
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{sk.getsockname()[1]}"


def test_store_primitives_and_errors():
    url = _url()
    with Store(url, rank=0, world=2, serve=True, timeout=10) as a, Store(url, rank=None, world=2, timeout=10) as b:
        assert a.serving and not b.serving
        assert (a.rank, b.rank) == (0, 1)
        a.set("k", b"\x00v\xff")
        assert b.get("k") == b"\x00v\xff"
        big = bytes(range(256)) * 100
        a.set("big", big)
        assert b.get("big") == big  # larger than the first buffer: retried with the right size
        assert a.add("n", 5) == 5 and b.add("n", -2) == 3 and a.add("n", 0) == 3
        with pytest.raises(hmc.HMCStatusError) as e:
            b.get("absent")
        assert e.value.status == hmc.Status.NOT_FOUND
        with pytest.raises(hmc.HMCStatusError) as e:
            b.get("absent", wait=0.1)
        assert e.value.status == hmc.Status.TIMEOUT
        threading.Timer(0.1, lambda: a.set("late", b"here")).start()
        assert b.get("late", wait=5) == b"here"
        with pytest.raises(hmc.HMCStatusError) as e:
            Store(url, rank=1, world=2, timeout=2)  # rank 1 is b's
        assert e.value.status == hmc.Status.ERROR


def test_store_group_allgather():
    url = _url()
    with Store(url, rank=0, world=2, serve=True) as a, Store(url, rank=1, world=2) as b:
        ga, gb = a.group("g", 2), b.group("g", 2)
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("b", gb.allgather(b"from-b")))
        t.start()
        out["a"] = ga.allgather(b"from-a, longer")
        t.join()
        assert out["a"] == out["b"] == [b"from-a, longer", b"from-b"]
        t = threading.Thread(target=gb.barrier)
        t.start()
        ga.barrier()
        t.join()
        ga.close()
        gb.close()


def test_store_secret():
    """A protected store (shared secret) admits clients that know it and refuses the others."""
    url = _url()
    with Store(url, rank=0, world=3, serve=True, timeout=10, secret="s3cret") as a:
        assert a.serving
        with Store(url, rank=1, world=3, timeout=10, secret=b"s3cret") as b:
            b.set("k", b"v")
            assert a.get("k") == b"v"
        for bad in ("wrong", None):
            with pytest.raises(hmc.HMCStatusError):
                Store(url, rank=2, world=3, timeout=2, secret=bad)


def _certs(tmp_path):
    """A CA and a certificate for 127.0.0.1 signed by it (openssl), as PEM files."""
    import shutil
    import subprocess
    if shutil.which("openssl") is None:
        pytest.skip("openssl not found")
    d = str(tmp_path)
    run = lambda *a: subprocess.run(list(a), check=True, capture_output=True, cwd=d)  # noqa: E731
    run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=test ca")
    run("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", "node.key", "-out", "node.csr", "-subj", "/CN=127.0.0.1")
    with open(f"{d}/ext.cnf", "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n")
    run("openssl", "x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "node.pem", "-days", "1", "-extfile", "ext.cnf")
    return f"{d}/node.pem", f"{d}/node.key", f"{d}/ca.pem"


def test_store_mutual_tls(tmp_path):
    """A store served with TLS and a CA admits clients with a certificate from that CA."""
    cert, key, ca = _certs(tmp_path)
    url = _url()
    with Store(url, rank=0, world=2, serve=True, timeout=10, tls_cert=cert, tls_key=key, tls_ca=ca) as a:
        with Store(url, rank=1, world=2, timeout=10, tls_cert=cert, tls_key=key, tls_ca=ca) as b:
            b.set("k", b"tls")
            assert a.get("k") == b"tls"
        with pytest.raises(hmc.HMCStatusError):
            Store(url, rank=1, world=2, timeout=2, tls_ca=ca)  # no client certificate
