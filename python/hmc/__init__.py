"""HMC-Go's Python SDK: one-sided put/get between processes' registered buffers.

The API follows upstream HMC's Python guides: ``create_session``, ``Session.init_server``,
``connect``, ``put_remote``/``get_remote``, ``put_nb``/``get_nb``/``wait``, ``ctrl_send``/
``ctrl_recv``, and the buffer helpers ``sess.buf.put`` / ``sess.buf.get_into``. Payloads are
bytes-like objects, NumPy arrays and PyTorch tensors (CPU, and CUDA through their device
pointer), copied once from the object's own memory into the buffer. Every failure raises
``HMCStatusError`` carrying the status code and the Go error text. The GIL is released during
every call into the library.
"""

import ctypes
from enum import IntEnum

from ._lib import LIB as _L
from ._lib import ForkError

__all__ = [
    "Status", "MemoryType", "ConnType", "HMCError", "HMCStatusError", "IOBuffer", "Session",
    "create_session", "memory_supported", "debug_stacks", "ForkError",
]

DEFAULT_TIMEOUT = 60.0


class Status(IntEnum):
    SUCCESS = 0
    ERROR = 1
    UNSUPPORT = 2
    INVALID_CONFIG = 3
    TIMEOUT = 4
    NOT_FOUND = 5


status_t = Status  # upstream's name


class MemoryType(IntEnum):
    DEFAULT = 0
    CPU = 1
    NVIDIA_GPU = 2
    AMD_GPU = 3
    CAMBRICON_MLU = 4
    MOORE_GPU = 5
    HUAWEI_ASCEND_NPU = 6


class ConnType(IntEnum):
    RDMA = 0
    UCX = 1
    TCP = 2
    SHM = 3
    AUTO = 4


class HMCError(RuntimeError):
    """Base class of the SDK's errors."""


class HMCStatusError(HMCError):
    """A call returned a non-success status; ``.status`` is the Status."""

    def __init__(self, msg, status):
        self.status = Status(status) if status in Status._value2member_map_ else status
        super().__init__(f"{msg} (status={int(status)})")


def _check(rc, what):
    if rc != 0:
        err = _L.hmc_last_error().decode(errors="replace")
        raise HMCStatusError(f"{what}: {err}", rc)


def _ms(timeout):
    if timeout is None:
        return 0
    return max(1, int(timeout * 1000))


def _b(s):
    return s.encode() if isinstance(s, str) else s


_U64_MAX = (1 << 64) - 1


def _u64(name, v, lo=0, hi=_U64_MAX):
    """v as an int in lo..hi: checked here, before the library sees it (ctypes would wrap a
    negative to 2**64 - v), with ValueError / TypeError naming the argument."""
    if isinstance(v, bool) or not isinstance(v, int):
        try:
            v = v.__index__()
        except AttributeError:
            raise TypeError(f"{name} must be an int, not {type(v).__name__}") from None
    if v < lo or v > hi:
        raise ValueError(f"{name} must be in {lo}..{hi}, got {v}")
    return v


def _ptr(name, v):
    """A local address: an int, or the memory of a torch tensor (CPU or CUDA), an object with
    __cuda_array_interface__ (CuPy, hmc.device.DeviceArray) or a NumPy array."""
    if isinstance(v, int) and not isinstance(v, bool):
        return _u64(name, v)
    if hasattr(v, "data_ptr") or hasattr(v, "__cuda_array_interface__") or hasattr(v, "__array_interface__"):
        from . import device
        return device.address_of(v)[0]
    return _u64(name, v)


def _seq(name, vals):
    """vals, refused (TypeError) unless it is a sequence: a list, tuple or array."""
    if isinstance(vals, (str, bytes)) or not hasattr(vals, "__len__"):
        raise TypeError(f"{name} must be a list, not {type(vals).__name__}")
    return vals


def _u64s(name, vals, conv=None):
    """A sequence of addresses or sizes checked as _u64 checks one: plain ints in range are taken
    as they are (one pass each for type, min and max, as batches of thousands want); anything
    else goes through conv (default _u64) entry by entry, which names the bad one
    ("name[i]")."""
    _seq(name, vals)
    if all(type(v) is int for v in vals) and (not len(vals) or (min(vals) >= 0 and max(vals) <= _U64_MAX)):
        return vals
    conv = conv or _u64
    return [conv(f"{name}[{i}]", v) for i, v in enumerate(vals)]


def _sizes(**kw):
    """Checks byte counts and offsets (None passes: a default applies)."""
    for name, v in kw.items():
        if v is not None:
            _u64(name, v)


def _port(name, v):
    return _u64(name, v, 0, 65535)


def debug_stacks():
    """The stacks of every goroutine of the Go core, as text: for a watchdog that finds a call
    stuck (a Go program prints them on SIGQUIT; inside Python it cannot)."""
    n = _L.hmc_debug_stacks(None, 0)
    buf = ctypes.create_string_buffer(n + 4096)  # goroutines may have grown meanwhile
    _L.hmc_debug_stacks(buf, len(buf))
    return buf.value.decode(errors="replace")


def memory_supported(mem_type):
    """True if memory of mem_type can be used on this machine."""
    return _L.hmc_memory_probe(int(mem_type)) == 0


# ---- payloads -------------------------------------------------------------------------------

def _is_torch(x):
    return type(x).__module__.startswith("torch")


def _is_numpy(x):
    return type(x).__module__ == "numpy"


def _torch_device(t):
    """(MemoryType, device index) of a GPU tensor."""
    import torch
    mt = MemoryType.AMD_GPU if getattr(torch.version, "hip", None) else MemoryType.NVIDIA_GPU
    return mt, (t.device.index or 0)


def _device_of(obj, addr):
    """(MemoryType, device index) of device memory at addr, held by obj."""
    if _is_torch(obj):
        return _torch_device(obj)
    from . import device
    _, dev, mt = device.locate(addr)
    return mt, dev


def _cuda_array(obj):
    """(address, nbytes, keepalive, True) of an object with __cuda_array_interface__, else None."""
    if not hasattr(obj, "__cuda_array_interface__"):
        return None
    from . import device
    addr, n = device.cuda_array(obj)
    return addr, n, obj, True


def _source(data):
    """(address, nbytes, keepalive, is_gpu) of a payload, without copying contiguous data."""
    c = _cuda_array(data) if not _is_torch(data) else None
    if c is not None:
        return c
    if _is_torch(data):
        t = data if data.is_contiguous() else data.contiguous()
        return t.data_ptr(), t.numel() * t.element_size(), t, bool(t.is_cuda)
    if _is_numpy(data):
        import numpy as np
        a = np.ascontiguousarray(data)
        return a.ctypes.data, a.nbytes, a, False
    if isinstance(data, bytes):
        return ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value, len(data), data, False
    mv = memoryview(data)
    if not mv.c_contiguous:
        mv = memoryview(mv.tobytes())
    if mv.readonly:
        b = mv.tobytes()  # ctypes cannot take the address of read-only buffers: one copy
        return ctypes.cast(ctypes.c_char_p(b), ctypes.c_void_p).value, len(b), b, False
    n = mv.nbytes
    c = (ctypes.c_char * n).from_buffer(mv.cast("B")) if n else None
    return (ctypes.addressof(c) if c is not None else 0), n, (mv, c), False


def _dest(dst):
    """(address, capacity, keepalive, is_gpu) of a writable, contiguous destination."""
    c = _cuda_array(dst) if not _is_torch(dst) else None
    if c is not None:
        return c
    if _is_torch(dst):
        if not dst.is_contiguous():
            raise ValueError("destination tensor must be contiguous")
        return dst.data_ptr(), dst.numel() * dst.element_size(), dst, bool(dst.is_cuda)
    if _is_numpy(dst):
        if not dst.flags.c_contiguous:
            raise ValueError("destination array must be C-contiguous")
        if not dst.flags.writeable:
            raise ValueError("destination array must be writeable")
        return dst.ctypes.data, dst.nbytes, dst, False
    mv = memoryview(dst)
    if mv.readonly:
        raise ValueError("destination buffer must be writeable")
    if not mv.c_contiguous:
        raise ValueError("destination buffer must be contiguous")
    n = mv.nbytes
    c = (ctypes.c_char * n).from_buffer(mv.cast("B")) if n else None
    return (ctypes.addressof(c) if c is not None else 0), n, (mv, c), False


# ---- buffer ---------------------------------------------------------------------------------

class IOBuffer:
    """The Session's registered buffer (ConnBuffer): ``put`` copies into it, ``get_into`` out."""

    def __init__(self, session):
        self._s = session

    @property
    def size(self):
        return _L.hmc_buffer_size(self._s._h)

    @property
    def ptr(self):
        return _L.hmc_buffer_ptr(self._s._h)

    def put(self, data, offset=0, nbytes=None, device=None):
        """Copies data into the buffer at offset; returns the number of bytes written.

        A CUDA (or ROCm) tensor is copied from its device memory: device to device into a GPU
        buffer, device to host into a CPU buffer. ``device="ptr"`` takes ``data`` as an address
        in the buffer's own device memory (int) and needs ``nbytes``."""
        _sizes(offset=offset, nbytes=nbytes)
        if device == "ptr":
            if nbytes is None:
                raise ValueError("nbytes is required with device='ptr'")
            _check(_L.hmc_buffer_write_gpu(self._s._h, int(data), nbytes, offset), "buffer put")
            return nbytes
        addr, n, keep, gpu = _source(data)
        if nbytes is not None:
            if nbytes > n:
                raise ValueError(f"nbytes {nbytes} exceeds the source's {n} bytes")
            n = nbytes
        if gpu:
            mt, dev = _device_of(keep, addr)
            _check(_L.hmc_buffer_write_device(self._s._h, addr, n, offset, int(mt), dev), "buffer put (gpu)")
        else:
            _check(_L.hmc_buffer_write(self._s._h, addr, n, offset), "buffer put")
        del keep
        return n

    def get_into(self, dst, nbytes=None, offset=0, device=None):
        """Copies nbytes (default: all of dst) at offset out of the buffer into dst."""
        _sizes(offset=offset, nbytes=nbytes)
        if device == "ptr":
            if nbytes is None:
                raise ValueError("nbytes is required with device='ptr'")
            _check(_L.hmc_buffer_read_gpu(self._s._h, int(dst), nbytes, offset), "buffer get")
            return nbytes
        addr, cap, keep, gpu = _dest(dst)
        n = cap if nbytes is None else nbytes
        if n > cap:
            raise ValueError(f"nbytes {n} exceeds the destination's {cap} bytes")
        if gpu:
            mt, dev = _device_of(keep, addr)
            _check(_L.hmc_buffer_read_device(self._s._h, addr, n, offset, int(mt), dev), "buffer get (gpu)")
        else:
            _check(_L.hmc_buffer_read(self._s._h, addr, n, offset), "buffer get")
        del keep
        return n

    def get(self, nbytes, offset=0):
        """Returns nbytes at offset as a new bytearray."""
        _sizes(nbytes=nbytes, offset=offset)
        out = bytearray(nbytes)
        self.get_into(out, nbytes, offset)
        return out

    def copy_within(self, dst_offset, src_offset, nbytes):
        _sizes(dst_offset=dst_offset, src_offset=src_offset, nbytes=nbytes)
        _check(_L.hmc_buffer_copy_within(self._s._h, dst_offset, src_offset, nbytes), "copy within")


# ---- session --------------------------------------------------------------------------------

class Session:
    """A registered buffer and a communicator over it (upstream's Session)."""

    def __init__(self, device_id=0, buffer_size=128 * 1024 * 1024, mem_type=MemoryType.CPU,
                 num_chs=1, local_ip="", *, secret=None, tls_cert=None, tls_key=None,
                 tls_ca=None):
        """secret (bytes or str) and tls_cert / tls_key / tls_ca (PEM file paths, mutual TLS)
        authenticate every link of the session; peers need the same or are refused (HMCError,
        permission denied). Default: none."""
        _sizes(device_id=device_id, buffer_size=buffer_size, num_chs=num_chs)
        h = ctypes.c_uint64()
        if secret is None and tls_cert is None and tls_key is None and tls_ca is None:
            _check(_L.hmc_session_create(device_id, buffer_size, int(mem_type), num_chs,
                                         _b(local_ip or ""), ctypes.byref(h)), "create session")
        else:
            key = secret.encode() if isinstance(secret, str) else bytes(secret or b"")
            _check(_L.hmc_session_create_secure(device_id, buffer_size, int(mem_type), num_chs,
                                                _b(local_ip or ""), key or None, len(key),
                                                _b(tls_cert), _b(tls_key), _b(tls_ca),
                                                ctypes.byref(h)), "create session")
        self._h = h.value
        self.buf = IOBuffer(self)
        self.local_ip = local_ip
        self.id = None

    # lifecycle
    def init_server(self, *, bind_ip, data_port=None, ucx_port=None, rdma_port=None,
                    ctrl_tcp_port=0, self_id=0, ctrl_uds_dir="/tmp", conn=ConnType.AUTO):
        """Starts the control plane (TCP ctrl_tcp_port, and UDS in ctrl_uds_dir) and the data
        server(s) on data_port (upstream's ucx_port / rdma_port are accepted as aliases)."""
        port = _port("data_port", next((p for p in (data_port, ucx_port, rdma_port) if p is not None), 0))
        _port("ctrl_tcp_port", ctrl_tcp_port)
        _sizes(self_id=self_id)
        _check(_L.hmc_session_init_server(self._h, _b(bind_ip), port, ctrl_tcp_port, self_id,
                                          _b(ctrl_uds_dir or ""), int(conn)), "init server")
        self.id = self_id
        if bind_ip and bind_ip != "0.0.0.0" and not self.local_ip:
            self.local_ip = bind_ip

    @property
    def data_port(self):
        return _L.hmc_session_data_port(self._h)

    @property
    def ctrl_port(self):
        return _L.hmc_session_ctrl_port(self._h)

    def connect(self, *, peer_id, self_id, peer_ip, data_port, ctrl_tcp_port=0, uds_dir=None,
                conn=ConnType.AUTO, timeout=DEFAULT_TIMEOUT):
        _port("data_port", data_port)
        _port("ctrl_tcp_port", ctrl_tcp_port)
        _sizes(peer_id=peer_id, self_id=self_id)
        _check(_L.hmc_session_connect(self._h, peer_id, self_id, _b(peer_ip), data_port,
                                      ctrl_tcp_port, _b(uds_dir or ""), int(conn), _ms(timeout)),
               "connect")

    def check_conn(self, ip, port, conn=ConnType.AUTO):
        return _L.hmc_session_check_conn(self._h, _b(ip), port, int(conn)) == 0

    def disconnect(self, ip, port, conn=ConnType.AUTO):
        _check(_L.hmc_session_disconnect(self._h, _b(ip), port, int(conn)), "disconnect")

    def close_server(self):
        _check(_L.hmc_session_close_server(self._h), "close server")

    def close(self):
        if self._h:
            _check(_L.hmc_session_destroy(self._h), "close")
            self._h = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # one-sided transfers
    def put_remote(self, ip, port, local_off, remote_off, nbytes, conn=ConnType.AUTO,
                   timeout=DEFAULT_TIMEOUT):
        _port("port", port)
        _sizes(local_off=local_off, remote_off=remote_off, nbytes=nbytes)
        _check(_L.hmc_session_put(self._h, _b(ip), port, local_off, remote_off, nbytes,
                                  int(conn), _ms(timeout)), "put")

    def get_remote(self, ip, port, local_off, remote_off, nbytes, conn=ConnType.AUTO,
                   timeout=DEFAULT_TIMEOUT):
        _port("port", port)
        _sizes(local_off=local_off, remote_off=remote_off, nbytes=nbytes)
        _check(_L.hmc_session_get(self._h, _b(ip), port, local_off, remote_off, nbytes,
                                  int(conn), _ms(timeout)), "get")

    def put_nb(self, ip, port, local_off, remote_off, nbytes, conn=ConnType.AUTO):
        i = ctypes.c_uint64()
        _port("port", port)
        _sizes(local_off=local_off, remote_off=remote_off, nbytes=nbytes)
        _check(_L.hmc_session_put_nb(self._h, _b(ip), port, local_off, remote_off, nbytes,
                                     int(conn), ctypes.byref(i)), "put_nb")
        return i.value

    def get_nb(self, ip, port, local_off, remote_off, nbytes, conn=ConnType.AUTO):
        i = ctypes.c_uint64()
        _port("port", port)
        _sizes(local_off=local_off, remote_off=remote_off, nbytes=nbytes)
        _check(_L.hmc_session_get_nb(self._h, _b(ip), port, local_off, remote_off, nbytes,
                                     int(conn), ctypes.byref(i)), "get_nb")
        return i.value

    def wait(self, ids, timeout=DEFAULT_TIMEOUT):
        ids = [ids] if isinstance(ids, int) else list(ids)
        arr = (ctypes.c_uint64 * len(ids))(*ids)
        _check(_L.hmc_session_wait(self._h, arr, len(ids), _ms(timeout)), "wait")

    def put_pipeline(self, ip, port, local_off, remote_off, nbytes, chunk=0, max_inflight=0,
                     conn=ConnType.AUTO, timeout=DEFAULT_TIMEOUT):
        _port("port", port)
        _sizes(local_off=local_off, remote_off=remote_off, nbytes=nbytes, chunk=chunk, max_inflight=max_inflight)
        _check(_L.hmc_session_put_pipeline(self._h, _b(ip), port, local_off, remote_off, nbytes,
                                           chunk, max_inflight, int(conn), _ms(timeout)), "put pipeline")

    def get_pipeline(self, ip, port, local_off, remote_off, nbytes, chunk=0, max_inflight=0,
                     conn=ConnType.AUTO, timeout=DEFAULT_TIMEOUT):
        _port("port", port)
        _sizes(local_off=local_off, remote_off=remote_off, nbytes=nbytes, chunk=chunk, max_inflight=max_inflight)
        _check(_L.hmc_session_get_pipeline(self._h, _b(ip), port, local_off, remote_off, nbytes,
                                           chunk, max_inflight, int(conn), _ms(timeout)), "get pipeline")

    # one call: stage + transfer
    def put(self, ip, port, data, *, local_off=0, remote_off=0, nbytes=None, conn=ConnType.AUTO,
            device=None, timeout=DEFAULT_TIMEOUT):
        """Puts data to the peer's buffer at remote_off; returns the number of bytes.

        Host data (bytes-likes, NumPy arrays, CPU tensors) goes straight from its own memory to
        the peer, read in place by the transport (zero-copy; local_off is not used). GPU tensors
        and ``device="ptr"`` addresses are staged into the local buffer at local_off first."""
        _port("port", port)
        _sizes(local_off=local_off, remote_off=remote_off, nbytes=nbytes)
        if device is None:
            addr, n, keep, gpu = _source(data)
            if not gpu:
                if nbytes is not None:
                    if nbytes > n:
                        raise ValueError(f"nbytes {nbytes} exceeds the source's {n} bytes")
                    n = nbytes
                _check(_L.hmc_session_put_from(self._h, _b(ip), port, addr, n, remote_off, int(conn),
                                               _ms(timeout)), "put")
                del keep
                return n
        n = self.buf.put(data, local_off, nbytes, device)
        self.put_remote(ip, port, local_off, remote_off, n, conn, timeout)
        return n

    def get_into(self, ip, port, dest, *, local_off=0, remote_off=0, nbytes=None,
                 conn=ConnType.AUTO, device=None, timeout=DEFAULT_TIMEOUT):
        """Gets the peer's bytes into dest: straight into host memory (zero-copy), through the
        local buffer at local_off for GPU tensors and ``device="ptr"``."""
        _port("port", port)
        _sizes(local_off=local_off, remote_off=remote_off, nbytes=nbytes)
        if device is None:
            addr, cap, keep, gpu = _dest(dest)
            if not gpu:  # straight into dest, zero-copy (local_off is not used)
                if nbytes is None:
                    nbytes = cap
                if nbytes > cap:
                    raise ValueError(f"nbytes {nbytes} exceeds the destination's {cap} bytes")
                _check(_L.hmc_session_get_to(self._h, _b(ip), port, addr, nbytes, remote_off, int(conn),
                                             _ms(timeout)), "get")
                del keep
                return nbytes
        if nbytes is None:
            nbytes = _dest(dest)[1]
        self.get_remote(ip, port, local_off, remote_off, nbytes, conn, timeout)
        return self.buf.get_into(dest, nbytes, local_off, device)

    def get(self, ip, port, nbytes, *, local_off=0, remote_off=0, conn=ConnType.AUTO,
            timeout=DEFAULT_TIMEOUT):
        _sizes(nbytes=nbytes)
        out = bytearray(nbytes)
        self.get_into(ip, port, out, local_off=local_off, remote_off=remote_off, nbytes=nbytes,
                      conn=conn, timeout=timeout)
        return out

    # streams of any size
    def send_data(self, ip, port, data, conn=ConnType.AUTO, timeout=DEFAULT_TIMEOUT):
        addr, n, keep, gpu = _source(data)
        mt, dev = _device_of(keep, addr) if gpu else (MemoryType.CPU, 0)
        _check(_L.hmc_session_send_data(self._h, _b(ip), port, addr, n, int(mt), dev, int(conn),
                                        _ms(timeout)), "send data")
        del keep
        return n

    def recv_data_into(self, ip, port, dest, conn=ConnType.AUTO, timeout=DEFAULT_TIMEOUT):
        addr, cap, keep, gpu = _dest(dest)
        mt, dev = _device_of(keep, addr) if gpu else (MemoryType.CPU, 0)
        got = ctypes.c_uint64()
        _check(_L.hmc_session_recv_data(self._h, _b(ip), port, addr, cap, int(mt), dev,
                                        ctypes.byref(got), int(conn), _ms(timeout)), "recv data")
        del keep
        return got.value

    # control plane
    def ctrl_send(self, peer, tag, timeout=DEFAULT_TIMEOUT):
        _sizes(peer=peer, tag=tag)
        _check(_L.hmc_session_ctrl_send(self._h, peer, tag, _ms(timeout)), "ctrl send")

    def ctrl_recv(self, peer, timeout=DEFAULT_TIMEOUT):
        _sizes(peer=peer)
        v = ctypes.c_uint64()
        _check(_L.hmc_session_ctrl_recv(self._h, peer, ctypes.byref(v), _ms(timeout)), "ctrl recv")
        return v.value

    def buffer_copy_within(self, dst_offset, src_offset, nbytes):
        self.buf.copy_within(dst_offset, src_offset, nbytes)


def create_session(*, device_id=0, buffer_size=128 * 1024 * 1024, mem_type=MemoryType.CPU,
                   num_chs=1, local_ip="", secret=None, tls_cert=None, tls_key=None, tls_ca=None):
    """Creates a Session (upstream's keyword signature and defaults; secret and tls_* as
    Session's)."""
    return Session(device_id, buffer_size, mem_type, num_chs, local_ip, secret=secret,
                   tls_cert=tls_cert, tls_key=tls_key, tls_ca=tls_ca)
