"""The Python face's batch call against one target, for bench/compare-pybatch.sh: n blocks of
size bytes, no two adjacent (as `hmc trans bench --pattern scattered`), written with
batch_transfer_sync_write for `seconds`; prints the median batch time in µs. argv: target id,
n, size, seconds, list|numpy|ctypes (ctypes: the C library's hmc_trans_transfer called through
ctypes with NumPy arrays' addresses: the wrapper's cost is numpy's row less this one)."""
import statistics
import sys
import time

import numpy as np

from hmc import _b
from hmc.trans import TransferEngine, Write, _L


def main():
    target, n, size, seconds, kind = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, te.last_error
    local = te.allocate_managed_buffer(n * size)
    remote = te.get_first_buffer_address(target)
    assert local and remote, te.last_error
    offs = [i * size for i in range(n)]
    for i in range(1, n, 2):
        offs[i], offs[i - 1] = offs[i - 1], offs[i]
    srcs, dsts, lens = [local + o for o in offs], [remote + o for o in offs], [size] * n
    if kind in ("numpy", "ctypes"):
        srcs, dsts, lens = np.array(srcs, dtype=np.uint64), np.array(dsts, dtype=np.uint64), np.array(lens, dtype=np.uint64)
    call = lambda: te.batch_transfer_sync_write(target, srcs, dsts, lens)  # noqa: E731
    if kind == "ctypes":
        h, t, p = te._h, _b(target), (srcs.ctypes.data, dsts.ctypes.data, lens.ctypes.data)
        call = lambda: _L.hmc_trans_transfer(h, t, int(Write), *p, n, None, te.timeout_ms)  # noqa: E731
    lat = []
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop:
        t0 = time.perf_counter()
        assert call() == 0, te.last_error
        lat.append(time.perf_counter() - t0)
    print("%.1f" % (statistics.median(lat) * 1e6))


if __name__ == "__main__":
    main()
