"""The transfer engine (Go package fabric/trans) with Mooncake's Python API, whole.

``from hmc.trans import TransferEngine`` is ``from mooncake.engine import TransferEngine``
(and ``python3 -m hmc.compat install`` makes that very import load this module): the method
names, positional order, keyword names, defaults and return values are those of Mooncake's
``transfer_engine_py.cpp``, failure sentinels included: 0 on success and -1 on failure for
calls that return a status; 0 for a failed async submit (callers check ``batch_id != 0``);
``transfer_check_status`` 1 done, 0 in progress, -1 failed, -2 timed out. Buffers are
addresses (ints), as in Mooncake; NumPy arrays and torch tensors are also accepted where a local
buffer is expected, and stand for their data pointer.

Beyond Mooncake, and listed in docs/mooncake.md: arguments are checked before the library sees
them (a negative or oversized size, address or port raises ValueError naming the argument);
``last_error`` holds the reason of the last failure and is cleared by a success;
``write_bytes_to_buffer``/``read_bytes_from_buffer`` refuse memory this engine did not
register or allocate (Mooncake copies to any address, and crashes on a bad one); peers on
this host use shared memory whatever the protocol; ``send_notify`` and ``destroy`` exist.

The library loads at the first call that needs it (``TransferEngine()`` does not): a script
may import this module and then fork workers. A child forked after the library loaded gets
``hmc.ForkError`` from every call.
"""

import array
import bisect
import ctypes
import glob
import json
import logging
import os
import socket
import threading
from enum import IntEnum

from . import Status, _b, _seq, _u64, _u64s
from . import device as _device
from ._lib import LIB as _L
from ._lib import batch_lists as _batch_lists
from ._lib import transfer_batch as _transfer_batch
from ._lib import u64_addr as _u64_addr
from ._lib import u64_lists as _u64_lists

__all__ = ["TransferEngine", "TransferOpcode", "TransferNotify", "TransferStatus", "InnerTransferEngine",
           "Read", "Write", "SUPPORT_CUDA", "SUPPORT_HIP", "SUPPORT_EFA", "SUPPORT_MNNVL", "SUPPORT_MUSA",
           "SUPPORT_INTRA_NVLINK"]

log = logging.getLogger("hmc.trans")

# What this build moves (Mooncake's module attributes of the same names). CUDA device memory is
# classified and moved through the driver loaded at run time (no CUDA build needed); HIP is
# classified and copied too, but has not run on an AMD device, so it is not claimed.
SUPPORT_CUDA = True
SUPPORT_HIP = False
SUPPORT_EFA = False
SUPPORT_MNNVL = False
SUPPORT_MUSA = False
SUPPORT_INTRA_NVLINK = False

P2PHANDSHAKE = "P2PHANDSHAKE"
_U64 = 1 << 64
_MAX_BATCH = 1 << 20  # entries in one batch call (memfabric's bound; far above KV use)
# Mooncake's transport_hint names (TENT's parseTransportType); any of them is accepted and the
# engine picks the transport per peer, as Mooncake's classic engine does.
_HINTS = {"", "unspec", "rdma", "mnnvl", "shm", "nvlink", "gds", "io_uring", "tcp", "ascend", "sunrise_link"}
_WILDCARD = "*"


class TransferOpcode(IntEnum):
    Read = 0
    Write = 1
    READ = 0
    WRITE = 1


Read = TransferOpcode.Read  # Mooncake exports the values into the module
Write = TransferOpcode.Write


class TransferStatus(IntEnum):
    """Mooncake's TransferStatusEnum."""
    WAITING = 0
    PENDING = 1
    INVALID = 2
    CANCELED = 3
    COMPLETED = 4
    TIMEOUT = 5
    FAILED = 6


class TransferNotify:
    """A notification: the sender's name and a message (Mooncake's TransferNotify)."""

    __slots__ = ("name", "msg")

    def __init__(self, name="", msg=""):
        self.name = name
        self.msg = msg

    def __repr__(self):
        return f"TransferNotify(name={self.name!r}, msg={self.msg!r})"

    def __eq__(self, other):
        return isinstance(other, TransferNotify) and (self.name, self.msg) == (other.name, other.msg)

    def __hash__(self):
        return hash((self.name, self.msg))


class InnerTransferEngine:
    """What ``get_engine()`` returns (Mooncake's InnerTransferEngine, a shared_ptr to the C++
    engine): the engine itself, to hand to other parts of HMC-Go (its ``handle`` is the C
    API's engine handle)."""

    def __init__(self, outer):
        self._outer = outer

    @property
    def handle(self):
        return self._outer._h or 0

    def get_local_hostname(self):
        return self._outer.get_local_hostname()

    def __repr__(self):
        return f"<hmc.trans.InnerTransferEngine {self.get_local_hostname() or 'uninitialized'}>"


def _addr(name, buf):
    """An int address, or the data pointer of a NumPy array / torch tensor (CPU or CUDA) / object
    with __cuda_array_interface__ (CuPy, hmc.device.DeviceArray) / ctypes object."""
    if hasattr(buf, "data_ptr"):  # torch
        return int(buf.data_ptr())
    cai = _device.cuda_array(buf)
    if cai is not None:
        return cai[0]
    if hasattr(buf, "ctypes") and hasattr(buf.ctypes, "data"):  # numpy
        return int(buf.ctypes.data)
    if isinstance(buf, (ctypes.Array, ctypes.Structure)):
        return ctypes.addressof(buf)
    return _u64(name, buf)


def _list(name, vals):
    if len(_seq(name, vals)) > _MAX_BATCH:
        raise ValueError(f"{name} has {len(vals)} entries (at most {_MAX_BATCH})")
    return vals


def _arr(vals):
    """A uint64* for the library, as an int where the array has one (array.array('Q') or a NumPy
    uint64 array: its own memory, no copy), else a ctypes array of vals."""
    if isinstance(vals, array.array):
        return vals.buffer_info()[0] if len(vals) else None
    if isinstance(vals, ctypes.Array):  # _lib.u64_lists's
        return vals
    if type(vals).__module__ == "numpy":
        return vals.ctypes.data if len(vals) else None
    return (ctypes.c_uint64 * len(vals))(*vals)


def _vec(name, vals, conv=None):
    """vals as a contiguous array of uint64 in one pass: a list of plain ints in range filled by
    the library's C loop (_lib.u64_lists: 1.7 µs for 1,024 entries), array.array('Q') of other
    sequences (its C loop checks every entry's type and range: 14-17 µs), a NumPy array of an
    integer dtype as uint64 (no copy for uint64; negatives refused). An entry it refuses, or
    one that needs conv (a tensor as an address), goes through the per-entry checker, which
    names it."""
    if type(vals).__module__ == "numpy" and getattr(vals, "dtype", None) is not None and vals.dtype.kind in "iu":
        import numpy as np
        if vals.ndim != 1:
            raise ValueError(f"{name} must be one-dimensional, not of shape {vals.shape}")
        if vals.dtype.kind == "i" and len(vals) and vals.min() < 0:
            i = int(np.argmax(vals < 0))
            raise ValueError(f"{name}[{i}] must be in 0..{_U64 - 1}, got {int(vals[i])}")
        return np.ascontiguousarray(vals, dtype=np.uint64)
    fast = _u64_lists(vals)
    if fast is not None:
        return fast
    _seq(name, vals)
    try:
        return array.array("Q", vals)
    except (TypeError, OverflowError):
        return array.array("Q", _u64s(name, vals, conv))


class _Mismatch(ValueError):
    """Lists of different lengths: Mooncake's calls return their failure value for it."""


def _fast_batch(buffers, peer_buffer_addresses, lengths):
    """(n, three addresses) for three such arrays of one length within the batch limit, else
    None (the checked path, which also names what is wrong)."""
    c = _u64_addr(lengths)
    if c is None:
        return None
    a, b = _u64_addr(buffers), _u64_addr(peer_buffer_addresses)
    n = len(lengths)
    if a is None or b is None or n > _MAX_BATCH or len(buffers) != n or len(peer_buffer_addresses) != n:
        return None
    return n, a, b, c


def _batch(buffers, peer_buffer_addresses, lengths):
    """Checked (n, locals, remotes, sizes, keep) for the library: three uint64* (ints or ctypes
    arrays) and what must live until the call returns; or ValueError."""
    _list("buffers", buffers)
    _list("peer_buffer_addresses", peer_buffer_addresses)
    _list("lengths", lengths)
    n = len(lengths)
    if not (len(buffers) == len(peer_buffer_addresses) == n):
        raise _Mismatch(f"buffers, peer_buffer_addresses and lengths have different lengths "
                        f"({len(buffers)}, {len(peer_buffer_addresses)}, {n})")
    fast = _batch_lists(buffers, peer_buffer_addresses, lengths)  # three lists of plain ints: one C call
    if fast is not None:
        return fast
    locs = _vec("buffers", buffers, _addr)
    rems = _vec("peer_buffer_addresses", peer_buffer_addresses)
    lens = _same(lengths)
    if lens is None:
        lens = _vec("lengths", lengths)
    # a range past the address space: the library refuses the batch
    return n, _arr(locs), _arr(rems), _arr(lens), (locs, rems, lens)


def _converted(buffers, peer_buffer_addresses, lengths):
    """(n, locals, remotes, sizes, keep) as _batch gives them, the quick ways first: three
    lists of plain ints in one C pass, three uint64 NumPy arrays by address (the caller's
    arrays, alive for the call: keep None); anything else _batch's checked conversion, which
    names what is wrong (_Mismatch)."""
    if type(lengths) is list and 0 < len(lengths) <= _MAX_BATCH:
        fast = _batch_lists(buffers, peer_buffer_addresses, lengths)
        if fast is not None:
            return fast
    fast = _fast_batch(buffers, peer_buffer_addresses, lengths)
    if fast is not None:
        return (*fast, None)
    return _batch(buffers, peer_buffer_addresses, lengths)


def _same(vals):
    """array.array('Q') of a list whose entries all equal its first, an int in range (a KV
    batch's lengths mostly are): one C-level comparison pass, not a conversion per entry
    (0.5 µs against 14 for 1,024 entries); else None."""
    if type(vals) is not list or not vals:
        return None
    v = vals[0]
    if type(v) is not int or not 0 <= v < _U64 or vals.count(v) != len(vals):
        return None
    return array.array("Q", [v]) * len(vals)


def _hint(transport_hint):
    h = transport_hint or ""
    if not isinstance(h, str) or h.lower() not in _HINTS:
        raise ValueError(f"Unknown transport_hint {transport_hint!r} (valid: {', '.join(sorted(_HINTS - {''}))}, "
                         "or empty string for no hint)")
    return h


def _hostname(local_hostname):
    """Mooncake's local_hostname ("ip", "ip:port", "host", "[v6]:port", "v6") as our unique id
    "ip:port" (port 0: pick one)."""
    if not isinstance(local_hostname, str) or not local_hostname.strip():
        raise ValueError(f"local_hostname must be a non-empty string, got {local_hostname!r}")
    h = local_hostname.strip()
    if h.startswith("["):
        host, _, rest = h[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else "0"
    elif h.count(":") == 1:
        host, port = h.split(":")
    elif h.count(":") > 1:  # a bare IPv6 address
        host, port = h, "0"
    else:
        host, port = h, "0"
    try:
        p = int(port)
    except ValueError:
        raise ValueError(f"local_hostname {local_hostname!r}: port {port!r} is not a number") from None
    _u64("the port of local_hostname", p, 0, 65535)
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
        ip = host
    except OSError:
        try:  # a host name: its address (Mooncake advertises names; peers here need the IP)
            ip = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)[0][4][0]
        except OSError as e:
            raise ValueError(f"local_hostname {local_hostname!r}: cannot resolve {host!r}: {e}") from None
    return f"[{ip}]:{p}" if ":" in ip else f"{ip}:{p}"


def _protocols(protocol):
    """Mooncake's protocol name as the engine's transports (hmc_trans_create's list); peers on
    this host use shared memory whatever the protocol. MC_FORCE_TCP is read here, at the call:
    the library's Go runtime keeps the environment it found when it loaded, and a script may set
    the variable after that."""
    p = (protocol or "tcp").strip().lower()
    if p == "rdma" and os.environ.get("MC_FORCE_TCP") == "1":
        p = "tcp"
    if p in ("tcp", "shm"):
        return "shm,tcp"
    if p == "rdma":
        return "rdma"
    if p == "ucx":
        return "shm,ucx"
    raise ValueError(f"protocol {protocol!r} is not served here (tcp, rdma (UCX's RDMA; MC_FORCE_TCP=1 makes it tcp), "
                     "ucx); peers on one host use shared memory whatever the protocol")


def _metadata(metadata_server, metadata_type=None):
    """Mooncake's metadata server forms as the engine takes them."""
    m = (metadata_server or "").strip()
    if not m or m == P2PHANDSHAKE:
        return P2PHANDSHAKE
    if "://" not in m and metadata_type:
        m = f"{metadata_type}://{m}"
    return m


def _timeout_ms():
    """Mooncake's MC_TRANSFER_TIMEOUT (seconds, at least 5), default 30 s."""
    v = os.environ.get("MC_TRANSFER_TIMEOUT")
    try:
        return max(5, int(v)) * 1000 if v else 30000
    except ValueError:
        return 30000


def _numa_nodes():
    nodes = sorted(int(os.path.basename(p)[4:]) for p in glob.glob("/sys/devices/system/node/node[0-9]*"))
    return nodes or [0]


def _rdma_devices():
    out = {}
    for dev in sorted(glob.glob("/sys/class/infiniband/*")):
        try:
            with open(os.path.join(dev, "device", "numa_node")) as f:
                numa = max(0, int(f.read().strip()))
        except (OSError, ValueError):
            numa = 0
        out[os.path.basename(dev)] = numa
    return out


def _gpus():
    """(index, numa node) of NVIDIA GPUs the driver lists, in bus order."""
    out = []
    for i, d in enumerate(sorted(glob.glob("/proc/driver/nvidia/gpus/*"))):
        bus = os.path.basename(d).lower()
        try:
            with open(f"/sys/bus/pci/devices/{bus}/numa_node") as f:
                numa = max(0, int(f.read().strip()))
        except (OSError, ValueError):
            numa = 0
        out.append((i, numa))
    return out


def local_topology(device_name=None):
    """This host's topology in Mooncake's form, {"cpu:N": [[preferred NICs], [other NICs]],
    "cuda:N": ...}: RDMA devices on the same NUMA node are preferred. device_name, a
    comma-separated list, keeps only those NICs."""
    nics = _rdma_devices()
    if device_name:
        keep = {d.strip() for d in device_name.split(",") if d.strip()}
        nics = {n: numa for n, numa in nics.items() if n in keep}
    def entry(numa):
        return [[n for n, m in nics.items() if m == numa], [n for n, m in nics.items() if m != numa]]
    topo = {f"cpu:{n}": entry(n) for n in _numa_nodes()}
    for i, numa in _gpus():
        topo[f"cuda:{i}"] = entry(numa)
    return json.dumps(topo)


class TransferEngine:
    """Mooncake's TransferEngine over HMC-Go's transfer engine."""

    TransferOpcode = TransferOpcode

    def __init__(self):
        self._h = None
        self._name = ""
        self._mu = threading.Lock()
        self._starts = []   # sorted start addresses of memory registered or allocated here
        self._sizes = {}    # start -> size
        self._managed = {}  # allocate_managed_buffer's, start -> size
        self.last_error = ""
        self.timeout_ms = _timeout_ms()

    # ---- results ----------------------------------------------------------------------------

    def _fail(self, why):
        self.last_error = why
        log.warning("TransferEngine: %s", why)

    def _rc(self, rc, what=""):
        """0 for SUCCESS (and last_error cleared), else -1 with last_error set."""
        if rc != Status.SUCCESS:
            err = (_L.hmc_last_error() or b"").decode(errors="replace")
            self.last_error = f"{what}: {err}" if what else err
            return -1
        self.last_error = ""
        return 0

    def _ready(self, what):
        if self._h is None:
            self.last_error = f"{what}: the engine is not initialized (call initialize first)"
            return False
        return True

    # ---- set-up -----------------------------------------------------------------------------

    def initialize(self, local_hostname, metadata_server, protocol, device_name):
        """Starts the engine named local_hostname ("ip" picks a port: get_rpc_port; "ip:port")
        with metadata at metadata_server (P2PHANDSHAKE; "host:port" or etcd://host:port for
        etcd; http://host:port/path for Mooncake's HTTP metadata server; tcp:// for HMC-Go's
        store) over protocol ("tcp", or "rdma": UCX's RDMA where this build and host have it,
        else -1 with the reason, unless MC_FORCE_TCP=1). device_name (NICs) is accepted: the
        transports pick their devices. 0 on success, -1 with last_error set."""
        return self.initialize_ext(local_hostname, metadata_server, protocol, device_name, None)

    def initialize_ext(self, local_hostname, metadata_server, protocol, device_name, metadata_type):
        """initialize with metadata_type ("etcd", "http", "redis", ...) put before a
        metadata_server given without a scheme, as Mooncake's initialize_ext."""
        uid = _hostname(local_hostname)  # a bad address or port: ValueError naming it
        try:
            protos = _protocols(protocol)
        except ValueError as e:
            self._fail(f"initialize: {e}")
            return -1
        if self._h is not None:
            self._fail("initialize: the engine is initialized already")
            return -1
        meta = _metadata(metadata_server, metadata_type)
        h = ctypes.c_uint64()
        rc = _L.hmc_trans_create(_b(meta), _b(uid), 3, _b(protos), self.timeout_ms, ctypes.byref(h))
        if self._rc(rc, "initialize") != 0:
            log.error("TransferEngine.initialize(%r, %r, %r): %s", local_hostname, metadata_server, protocol, self.last_error)
            return -1
        self._h = h.value
        self._name = self.get_local_hostname()
        log.info("TransferEngine: HMC-Go's engine %s up (metadata %s, protocol %s)", self._name, meta, protocol)
        return 0

    def get_local_hostname(self):
        """This engine's name, "ip:port" (our addition; Mooncake callers build it from
        get_rpc_port)."""
        if self._h is None:
            return ""
        buf = ctypes.create_string_buffer(256)
        if self._rc(_L.hmc_trans_unique_id(self._h, buf, 256)) != 0:
            return ""
        return buf.value.decode()

    get_session_id = get_local_hostname

    def get_rpc_port(self):
        """The port peers reach this engine on (its name is "ip:<this port>"); -1 before
        initialize."""
        hp = self._name or self.get_local_hostname()
        return int(hp.rsplit(":", 1)[1]) if hp else -1

    def get_engine(self):
        return InnerTransferEngine(self)

    def get_engine_ptr(self):
        return self._h or 0

    def get_local_topology(self, device_name=None):
        return local_topology(device_name)

    def warmup_efa_segment(self, segment_name):
        """Nothing to warm up without EFA: 0 (as Mooncake on a build without EFA)."""
        return 0

    # ---- memory -----------------------------------------------------------------------------

    def _track(self, addr, size):
        with self._mu:
            if addr not in self._sizes:
                bisect.insort(self._starts, addr)
            self._sizes[addr] = size

    def _untrack(self, addr):
        with self._mu:
            if self._sizes.pop(addr, None) is not None:
                i = bisect.bisect_left(self._starts, addr)
                del self._starts[i]

    def _inside(self, addr, n):
        """Whether [addr, addr+n) lies in one range registered or allocated through this engine."""
        with self._mu:
            for s in self._starts[:bisect.bisect_right(self._starts, addr)]:
                if addr + n <= s + self._sizes[s]:
                    return True
        return False

    def register_memory(self, buffer_addr, capacity, location=_WILDCARD):
        """Registers capacity bytes at buffer_addr (location, Mooncake's NUMA/device hint, is
        accepted: memory is where it is). 0, or -1 with last_error."""
        a, n = _addr("buffer_addr", buffer_addr), _u64("capacity", capacity)
        if not self._ready("register_memory"):
            return -1
        if self._rc(_L.hmc_trans_register(self._h, a, n), "register_memory") != 0:
            return -1
        self._track(a, n)
        return 0

    def unregister_memory(self, buffer_addr):
        a = _addr("buffer_addr", buffer_addr)
        if not self._ready("unregister_memory"):
            return -1
        if self._rc(_L.hmc_trans_deregister(self._h, a, self.timeout_ms), "unregister_memory") != 0:
            return -1
        self._untrack(a)
        return 0

    def batch_register_memory(self, buffer_addresses, capacities, location=_WILDCARD):
        _list("buffer_addresses", buffer_addresses)
        _list("capacities", capacities)
        if len(buffer_addresses) != len(capacities):
            raise ValueError(f"buffer_addresses and capacities have different lengths ({len(buffer_addresses)}, {len(capacities)})")
        addrs = [_addr(f"buffer_addresses[{i}]", a) for i, a in enumerate(buffer_addresses)]
        caps = [_u64(f"capacities[{i}]", c) for i, c in enumerate(capacities)]
        if not self._ready("batch_register_memory"):
            return -1
        if not addrs:
            self.last_error = ""
            return 0
        # One registration per range, as Mooncake's: each is unregistered by its own address
        # (the C batch call coalesces adjacent ranges, memfabric's semantics). All or none.
        for i, (a, n) in enumerate(zip(addrs, caps)):
            if self._rc(_L.hmc_trans_register(self._h, a, n), f"batch_register_memory: entry {i}") != 0:
                err = self.last_error
                for done in addrs[:i]:
                    _L.hmc_trans_deregister(self._h, done, self.timeout_ms)
                    self._untrack(done)
                self.last_error = err
                return -1
            self._track(a, n)
        return 0

    def batch_unregister_memory(self, buffer_addresses):
        """Unregisters each; 0 when all were, else -1 (the others are unregistered still)."""
        _list("buffer_addresses", buffer_addresses)
        addrs = [_addr(f"buffer_addresses[{i}]", a) for i, a in enumerate(buffer_addresses)]
        if not self._ready("batch_unregister_memory"):
            return -1
        return self._each("batch_unregister_memory", addrs, lambda a: _L.hmc_trans_deregister(self._h, a, self.timeout_ms),
                          self._untrack, "{:#x}")

    def _each(self, what, items, call, on_success=None, label="{}"):
        """call(item) for every item; 0 when each returned SUCCESS, else -1 with the failures
        (the first eight) in last_error."""
        failed = []
        for it in items:
            if call(it) != Status.SUCCESS:
                failed.append(label.format(it) + ": " + (_L.hmc_last_error() or b"").decode(errors="replace"))
            elif on_success is not None:
                on_success(it)
        if failed:
            self.last_error = f"{what}: " + "; ".join(failed[:8])
            return -1
        self.last_error = ""
        return 0

    def allocate_managed_buffer(self, length):
        """length bytes of registered, shareable memory; its address, or 0 on failure."""
        n = _u64("length", length)
        if not self._ready("allocate_managed_buffer"):
            return 0
        if n == 0:
            self._fail("allocate_managed_buffer: length 0 (at least 1 byte)")
            return 0
        out = ctypes.c_uint64()
        if self._rc(_L.hmc_trans_malloc(self._h, n, ctypes.byref(out)), "allocate_managed_buffer") != 0:
            return 0
        self._track(out.value, n)
        with self._mu:
            self._managed[out.value] = n
        return out.value

    def free_managed_buffer(self, buffer_addr, length):
        a = _u64("buffer_addr", buffer_addr)
        _u64("length", length)
        if not self._ready("free_managed_buffer"):
            return -1
        if self._rc(_L.hmc_trans_free(self._h, a, self.timeout_ms), "free_managed_buffer") != 0:
            return -1
        self._untrack(a)
        with self._mu:
            self._managed.pop(a, None)
        return 0

    def write_bytes_to_buffer(self, dest_address, src_ptr, length):
        """Copies the first length bytes of src_ptr (bytes) to dest_address, which must lie in
        memory registered or allocated through this engine. 0, or -1 with last_error."""
        a, n = _u64("dest_address", dest_address), _u64("length", length)
        data = memoryview(src_ptr).cast("B") if not isinstance(src_ptr, bytes) else src_ptr
        if n > len(data):
            raise ValueError(f"length {n} is more than the {len(data)} bytes of src_ptr")
        if not self._inside(a, n):
            self._fail(f"write_bytes_to_buffer: {n} bytes at {a:#x} are not in memory registered or allocated through this engine")
            return -1
        src = bytes(data[:n]) if not isinstance(data, bytes) else data
        # Through the library, which asks the driver: dest_address may be device memory.
        if n and _L.hmc_memory_copy(a, ctypes.cast(ctypes.c_char_p(src), ctypes.c_void_p).value, n) != 0:
            self._fail(f"write_bytes_to_buffer: {_L.hmc_last_error().decode()}")
            return -1
        self.last_error = ""
        return 0

    def read_bytes_from_buffer(self, source_address, length):
        """length bytes at source_address (in memory registered or allocated through this
        engine) as bytes; b"" with last_error set when it is not."""
        a, n = _u64("source_address", source_address), _u64("length", length)
        if not self._inside(a, n):
            self._fail(f"read_bytes_from_buffer: {n} bytes at {a:#x} are not in memory registered or allocated through this engine")
            return b""
        out = (ctypes.c_char * n)()
        if n and _L.hmc_memory_copy(ctypes.addressof(out), a, n) != 0:  # a may be device memory
            self._fail(f"read_bytes_from_buffer: {_L.hmc_last_error().decode()}")
            return b""
        self.last_error = ""
        return out.raw

    def get_first_buffer_address(self, segment_name):
        """The address of the first buffer segment_name registered (this engine's own name: its
        own), or 0 when it has none or cannot be asked."""
        if not isinstance(segment_name, str):
            raise TypeError(f"segment_name must be a str, not {type(segment_name).__name__}")
        if not self._ready("get_first_buffer_address"):
            return 0
        bufs = self._json(2 if segment_name == self._name else 1, None if segment_name == self._name else segment_name)
        return bufs[0]["Addr"] if bufs else 0

    def _json(self, what, peer=None):
        cap = 1 << 16
        while True:
            buf = ctypes.create_string_buffer(cap)
            n = ctypes.c_uint64()
            rc = _L.hmc_trans_json(self._h, what, _b(peer) if peer else None, buf, cap, ctypes.byref(n), self.timeout_ms)
            if rc == Status.INVALID_CONFIG and n.value > cap:
                cap = n.value
                continue
            if self._rc(rc) != 0:
                return None
            return json.loads(buf.raw[:n.value] or b"null")

    # ---- notifications and probes -------------------------------------------------------------

    def get_notifies(self):
        """Notifications received since the last call, as TransferNotify objects."""
        if self._h is None:
            return []
        return [TransferNotify(n["name"], n["msg"]) for n in (self._json(0) or [])]

    def send_notify(self, target_hostname, message):
        """Delivers a notification alone (Mooncake C++'s sendNotifyByName; message a str or a
        TransferNotify, whose name is then the sender's name the peer sees)."""
        if not self._ready("send_notify"):
            return -1
        if isinstance(message, TransferNotify):
            return self._rc(_L.hmc_trans_notify_as(self._h, _b(target_hostname), _b(message.name), _b(message.msg),
                                                   self.timeout_ms), "send_notify")
        return self._rc(_L.hmc_trans_notify(self._h, _b(target_hostname), _b(message), self.timeout_ms), "send_notify")

    def send_probe(self, peer_server_name):
        """0 when peer_server_name is published (with a metadata server) and answers now, else
        -1 with last_error."""
        if not self._ready("send_probe"):
            return -1
        return self._rc(_L.hmc_trans_probe(self._h, _b(peer_server_name), self.timeout_ms), "send_probe")

    # ---- transfers ----------------------------------------------------------------------------

    def _sync(self, what, target, op, buffers, peers, lengths, notify=None):
        # What _direct declined, or a batch with a notification.
        try:
            n, pl, pr, ps, keep = _converted(buffers, peers, lengths)  # keep: pl, pr, ps's memory
        except _Mismatch as e:
            self._fail(f"{what}: {e}")
            return -1
        if not self._ready(what):
            return -1
        if not n:
            self.last_error = ""
            return 0
        rc = _L.hmc_trans_transfer(self._h, _b(target), int(op), pl, pr, ps, n, None,
                                   self.timeout_ms)  # the library adds 1 ms per MiB, as Mooncake
        if self._rc(rc, what) != 0:
            return -1
        if notify is not None:
            if not isinstance(notify, TransferNotify):
                raise TypeError(f"notify must be a TransferNotify, not {type(notify).__name__}")
            return self.send_notify(target, notify)
        return 0

    def _direct(self, what, target, op, buffers, peers, lengths):
        """The call's result where its lists of plain ints or uint64 NumPy arrays go to the
        library in one call (_lib.transfer_batch), else None: the caller takes _sync's way."""
        rc = _transfer_batch(self._h, target, op, buffers, peers, lengths, self.timeout_ms)
        if rc == 0:
            self.last_error = ""
            return 0
        return None if rc is None else self._rc(rc, what)

    def _submit(self, what, target, op, buffers, peers, lengths):
        """A batch id, or 0 (Mooncake's failure sentinel) with last_error set."""
        try:
            n, pl, pr, ps, keep = _converted(buffers, peers, lengths)  # keep: pl, pr, ps's memory
        except _Mismatch as e:
            self._fail(f"{what}: {e}")
            return 0
        if not self._ready(what):
            return 0
        if not n:
            self.last_error = f"{what}: an empty batch"
            return 0
        out = ctypes.c_uint64()
        rc = _L.hmc_trans_submit(self._h, _b(target), int(op), pl, pr, ps, n, None, ctypes.byref(out))
        del keep  # the library copied the lists
        if self._rc(rc, what) != 0:
            return 0
        return out.value

    def transfer_sync_write(self, target_hostname, buffer, peer_buffer_address, length, transport_hint=""):
        if self._h is not None and not transport_hint:
            rc = self._direct("transfer_sync_write", target_hostname, 1, [buffer], [peer_buffer_address], [length])
            if rc is not None:
                return rc
        _hint(transport_hint)
        return self._sync("transfer_sync_write", target_hostname, Write, [buffer], [peer_buffer_address], [length])

    def transfer_sync_read(self, target_hostname, buffer, peer_buffer_address, length, transport_hint=""):
        if self._h is not None and not transport_hint:
            rc = self._direct("transfer_sync_read", target_hostname, 0, [buffer], [peer_buffer_address], [length])
            if rc is not None:
                return rc
        _hint(transport_hint)
        return self._sync("transfer_sync_read", target_hostname, Read, [buffer], [peer_buffer_address], [length])

    def transfer_sync(self, target_hostname, buffer, peer_buffer_address, length, opcode, notify=None, transport_hint=""):
        _hint(transport_hint)
        op = TransferOpcode(int(opcode))
        if notify is None and self._h is not None:
            rc = self._direct("transfer_sync", target_hostname, int(op), [buffer], [peer_buffer_address], [length])
            if rc is not None:
                return rc
        return self._sync("transfer_sync", target_hostname, op, [buffer], [peer_buffer_address], [length], notify)

    def batch_transfer_sync_write(self, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint=""):
        if self._h is not None and not transport_hint:
            rc = self._direct("batch_transfer_sync_write", target_hostname, 1, buffers, peer_buffer_addresses, lengths)
            if rc is not None:
                return rc
        _hint(transport_hint)
        return self._sync("batch_transfer_sync_write", target_hostname, Write, buffers, peer_buffer_addresses, lengths)

    def batch_transfer_sync_read(self, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint=""):
        if self._h is not None and not transport_hint:
            rc = self._direct("batch_transfer_sync_read", target_hostname, 0, buffers, peer_buffer_addresses, lengths)
            if rc is not None:
                return rc
        _hint(transport_hint)
        return self._sync("batch_transfer_sync_read", target_hostname, Read, buffers, peer_buffer_addresses, lengths)

    def batch_transfer_sync(self, target_hostname, buffers, peer_buffer_addresses, lengths, opcode, notify=None,
                            transport_hint=""):
        _hint(transport_hint)
        op = TransferOpcode(int(opcode))
        if notify is None and self._h is not None:
            rc = self._direct("batch_transfer_sync", target_hostname, int(op), buffers, peer_buffer_addresses, lengths)
            if rc is not None:
                return rc
        return self._sync("batch_transfer_sync", target_hostname, op, buffers, peer_buffer_addresses, lengths, notify)

    def batch_transfer_async_write(self, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint=""):
        _hint(transport_hint)
        return self._submit("batch_transfer_async_write", target_hostname, Write, buffers, peer_buffer_addresses, lengths)

    def batch_transfer_async_read(self, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint=""):
        _hint(transport_hint)
        return self._submit("batch_transfer_async_read", target_hostname, Read, buffers, peer_buffer_addresses, lengths)

    def batch_transfer_async(self, target_hostname, buffers, peer_buffer_addresses, lengths, opcode, transport_hint=""):
        _hint(transport_hint)
        op = TransferOpcode(int(opcode))
        return self._submit("batch_transfer_async", target_hostname, op, buffers, peer_buffer_addresses, lengths)

    def transfer_submit_write(self, target_hostname, buffer, peer_buffer_address, length, transport_hint=""):
        _hint(transport_hint)
        return self._submit("transfer_submit_write", target_hostname, Write, [buffer], [peer_buffer_address], [length])

    def transfer_check_status(self, batch_id):
        """1 completed, 0 in progress, -1 failed, -2 timed out (Mooncake's convention). A
        finished batch is forgotten once its status has been read."""
        b = _u64("batch_id", batch_id)
        if not self._ready("transfer_check_status"):
            return -1
        st = ctypes.c_int()
        if self._rc(_L.hmc_trans_status(self._h, b, ctypes.byref(st)), "transfer_check_status") != 0:
            return -1
        s = TransferStatus(st.value)
        if s in (TransferStatus.WAITING, TransferStatus.PENDING):
            return 0
        rc = _L.hmc_trans_wait(self._h, b, 1)
        if s == TransferStatus.COMPLETED and rc == Status.SUCCESS:
            self.last_error = ""
            return 1
        self._rc(rc, "transfer_check_status")
        return -2 if s == TransferStatus.TIMEOUT else -1

    def get_batch_transfer_status(self, batch_ids):
        """Waits for every batch; 0 when all completed, else -1 (each is forgotten)."""
        ids = [_u64(f"batch_ids[{i}]", b) for i, b in enumerate(_list("batch_ids", batch_ids))]
        if not self._ready("get_batch_transfer_status"):
            return -1
        return self._each("get_batch_transfer_status", ids, lambda b: _L.hmc_trans_wait(self._h, b, self.timeout_ms),
                          label="batch {}")

    # ---- device memory --------------------------------------------------------------------------

    def _on_cuda(self, what, target, op, buffers, peers, lengths, stream_ptr, transport_hint):
        """Mooncake's stream-ordered forms: the transfer starts once the work queued on stream_ptr
        before the call has finished, and work queued on it after the call starts once the
        transfer has finished. Upstream enqueues a host callback and returns at once (and ends
        the process with _exit(1) if the transfer fails); here the call waits for the stream,
        runs the transfer, and returns when it is done, raising RuntimeError on failure."""
        _hint(transport_hint)
        s = _u64("stream_ptr", stream_ptr)
        n, pl, _, _, keep = _batch(buffers, peers, lengths)
        first = ctypes.c_uint64.from_address(pl if isinstance(pl, int) else ctypes.addressof(pl)).value if n else 0
        del keep
        if not self._ready(what):
            raise RuntimeError(f"{what}: {self.last_error}")
        if _L.hmc_stream_sync(s, first) != 0:
            msg = _L.hmc_last_error()
            raise RuntimeError(f"{what}: waiting for stream {s:#x}: {msg.decode() if msg else 'failed'}")
        if self._sync(what, target, op, buffers, peers, lengths) != 0:
            raise RuntimeError(f"{what}: {self.last_error}")

    def transfer_write_on_cuda(self, target_hostname, buffer, peer_buffer_address, length, stream_ptr=0, transport_hint=""):
        self._on_cuda("transfer_write_on_cuda", target_hostname, Write, [buffer], [peer_buffer_address], [length],
                      stream_ptr, transport_hint)

    def transfer_read_on_cuda(self, target_hostname, buffer, peer_buffer_address, length, stream_ptr=0, transport_hint=""):
        self._on_cuda("transfer_read_on_cuda", target_hostname, Read, [buffer], [peer_buffer_address], [length],
                      stream_ptr, transport_hint)

    def batch_transfer_write_on_cuda(self, target_hostname, buffers, peer_buffer_addresses, lengths, stream_ptr=0,
                                     transport_hint=""):
        self._on_cuda("batch_transfer_write_on_cuda", target_hostname, Write, buffers, peer_buffer_addresses, lengths,
                      stream_ptr, transport_hint)

    def batch_transfer_read_on_cuda(self, target_hostname, buffers, peer_buffer_addresses, lengths, stream_ptr=0,
                                    transport_hint=""):
        self._on_cuda("batch_transfer_read_on_cuda", target_hostname, Read, buffers, peer_buffer_addresses, lengths,
                      stream_ptr, transport_hint)

    # ---- life cycle -----------------------------------------------------------------------------

    def destroy(self):
        """Stops the engine (Mooncake does this in its destructor); memory from
        allocate_managed_buffer is freed."""
        if self._h is not None:
            h, self._h = self._h, None
            with self._mu:
                self._starts, self._sizes, self._managed = [], {}, {}
            return self._rc(_L.hmc_trans_destroy(h), "destroy")
        return 0

    unInitialize = destroy

    def __del__(self):
        try:
            from . import _lib
            if self._h is not None and _lib.is_loaded() and not _lib._forked:
                self.destroy()
        except Exception:
            pass
