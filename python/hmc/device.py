"""hmc.device: device memory from Python without a framework, and what the faces accept as it.

Every face (``hmc``, ``hmc.trans``, ``memfabric_hybrid``, the Mooncake shims) takes device memory
as an int address (``tensor.data_ptr()``), a ``torch.cuda`` tensor, or any object with
``__cuda_array_interface__`` (CuPy, Numba, ``DeviceArray`` below): the library asks the driver
where each address lives (``locate``), so a device address is never used as host memory.

``DeviceArray`` and ``Stream`` allocate device memory and streams through the library itself (the
CUDA driver, or the GPU emulation under ``HMC_EMULATE_GPU=1``), for scripts and tests that have no
CuPy or CUDA build of torch.

Ordering: the library's device copies run on the device's legacy default stream and are complete
when a call returns, so work queued before on that stream (PyTorch's default stream) or on a
blocking stream is seen. Work on non-blocking streams (``torch.cuda.Stream()``, CuPy's streams) is
not: synchronize the stream first, or pass it as ``stream_ptr`` to the Mooncake ``*_on_cuda`` forms
(or as ``stream`` to memfabric's ``*_submit`` forms), which wait for it before moving a byte.
"""

import ctypes
from enum import IntEnum

from ._lib import LIB as _L


class Kind(IntEnum):
    HOST = 0
    PINNED_HOST = 1
    DEVICE = 2
    MANAGED = 3


def _err(what):
    msg = _L.hmc_last_error()
    return RuntimeError(f"{what}: {msg.decode() if msg else 'failed'}")


def locate(addr):
    """(Kind, device ordinal, memory type) of the memory at addr, as its driver says."""
    k, d, v = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    if _L.hmc_memory_locate(int(addr), ctypes.byref(k), ctypes.byref(d), ctypes.byref(v)) != 0:
        raise _err(f"locate {int(addr):#x}")
    from . import MemoryType
    return Kind(k.value), d.value, MemoryType(v.value)


def cuda_array(obj):
    """(address, nbytes) of an object with __cuda_array_interface__ (C-contiguous), else None."""
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is None:
        return None
    shape = tuple(cai["shape"])
    typestr = cai["typestr"]
    itemsize = int(typestr[2:])
    n = itemsize
    for s in shape:
        n *= s
    strides = cai.get("strides")
    if strides is not None:  # C-contiguous strides are allowed, anything else is not
        want, expect = [], itemsize
        for s in reversed(shape):
            want.append(expect)
            expect *= s
        if tuple(reversed(want)) != tuple(strides) and n:
            raise ValueError("a device array must be C-contiguous")
    return int(cai["data"][0]), n


def address_of(obj):
    """(address, nbytes or None) of a device or host object: an int address (nbytes None), a
    torch tensor, an object with __cuda_array_interface__, a NumPy array."""
    if isinstance(obj, bool):
        raise TypeError("an address must be an int, not bool")
    if isinstance(obj, int):
        return obj, None
    if hasattr(obj, "data_ptr") and hasattr(obj, "element_size"):  # torch
        if not obj.is_contiguous():
            raise ValueError("a tensor must be contiguous")
        return int(obj.data_ptr()), obj.numel() * obj.element_size()
    c = cuda_array(obj)
    if c is not None:
        return c
    if hasattr(obj, "ctypes") and hasattr(obj.ctypes, "data"):  # numpy
        return int(obj.ctypes.data), int(obj.nbytes)
    if hasattr(obj, "__index__"):
        return obj.__index__(), None
    raise TypeError(f"an address must be an int, a tensor or an array, not {type(obj).__name__}")


class Stream:
    """A non-blocking device stream (an emulated one under HMC_EMULATE_GPU=1)."""

    def __init__(self, device=0, mem_type=None):
        from . import MemoryType
        out = ctypes.c_uint64()
        if _L.hmc_stream_create(int(mem_type or MemoryType.NVIDIA_GPU), int(device), ctypes.byref(out)) != 0:
            raise _err("stream create")
        self.ptr = out.value

    def synchronize(self):
        if _L.hmc_stream_sync(self.ptr, 0) != 0:
            raise _err("stream synchronize")

    def close(self):
        if self.ptr:
            p, self.ptr = self.ptr, 0
            if _L.hmc_stream_destroy(p, 0) != 0:
                raise _err("stream destroy")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class DeviceArray:
    """nbytes of device memory on device (NVIDIA_GPU by default), with __cuda_array_interface__
    (a byte vector), so every face takes it as CuPy's arrays are taken."""

    def __init__(self, nbytes, device=0, mem_type=None):
        from . import MemoryType
        if int(nbytes) <= 0:
            raise ValueError(f"nbytes must be positive, got {nbytes}")
        h = ctypes.c_uint64()
        if _L.hmc_memory_open(int(device), int(mem_type or MemoryType.NVIDIA_GPU), ctypes.byref(h)) != 0:
            raise _err("device memory open")
        self._mem = h.value
        p = ctypes.c_uint64()
        if _L.hmc_memory_alloc(self._mem, int(nbytes), ctypes.byref(p)) != 0:
            e = _err(f"device alloc of {nbytes} bytes")
            _L.hmc_memory_close(self._mem)
            raise e
        self.ptr, self.nbytes, self.device = p.value, int(nbytes), int(device)

    @property
    def __cuda_array_interface__(self):
        return {"shape": (self.nbytes,), "typestr": "|u1", "data": (self.ptr, False), "version": 3, "strides": None}

    def data_ptr(self):
        return self.ptr

    def copy_from(self, data, offset=0):
        """Copies host bytes (bytes, bytearray, NumPy array) into the array at offset."""
        mv = memoryview(data).cast("B")
        if offset < 0 or offset + mv.nbytes > self.nbytes:
            raise ValueError(f"{mv.nbytes} bytes at offset {offset} do not fit {self.nbytes}")
        buf = (ctypes.c_char * mv.nbytes).from_buffer_copy(mv) if mv.nbytes else None
        if buf is not None and _L.hmc_memory_copy(self.ptr + offset, ctypes.addressof(buf), mv.nbytes) != 0:
            raise _err("copy to device")

    def to_bytes(self, nbytes=None, offset=0):
        """A copy of nbytes (default: all from offset) of the array."""
        n = self.nbytes - offset if nbytes is None else int(nbytes)
        if offset < 0 or n < 0 or offset + n > self.nbytes:
            raise ValueError(f"{n} bytes at offset {offset} do not fit {self.nbytes}")
        out = (ctypes.c_char * n)()
        if n and _L.hmc_memory_copy(ctypes.addressof(out), self.ptr + offset, n) != 0:
            raise _err("copy from device")
        return bytes(out)

    def memset_async(self, value, stream, nbytes=None, offset=0):
        """Queues setting nbytes at offset to value on stream (a Stream or a stream handle)."""
        n = self.nbytes - offset if nbytes is None else int(nbytes)
        s = stream.ptr if isinstance(stream, Stream) else int(stream)
        if _L.hmc_memory_memset_async(self.ptr + offset, int(value), n, s) != 0:
            raise _err("memset")

    def close(self):
        if self._mem:
            m, self._mem = self._mem, 0
            _L.hmc_memory_free(m, self.ptr)
            _L.hmc_memory_close(m)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
