"""The decode side of test_trans: a Mooncake-style TransferEngine that registers a NumPy array,
prints its session id and the array's address, and answers "check <seed> <n>" notifications
with "ok"/"bad" after checking its first n bytes ("exit" ends it)."""
import sys
import time

import numpy as np

from hmc.trans import TransferEngine


def pattern(n, seed):
    return ((np.arange(n, dtype=np.uint64) * 7 + seed) % 256).astype(np.uint8)


def main():
    te = TransferEngine()
    assert te.initialize("127.0.0.1", sys.argv[1], "tcp", "") == 0, te.last_error
    kv = np.zeros(8 << 20, dtype=np.uint8)
    assert te.register_memory(kv.ctypes.data, kv.nbytes) == 0, te.last_error
    print("READY", te.get_local_hostname(), kv.ctypes.data, flush=True)
    while True:
        for sender, msg in te.get_notifies():
            if msg == "exit":
                te.destroy()
                return
            _, seed, n = msg.split()
            ok = "ok" if np.array_equal(kv[:int(n)], pattern(int(n), int(seed))) else "bad"
            assert te.send_notify(sender, ok) == 0, te.last_error
        time.sleep(0.001)


if __name__ == "__main__":
    main()
