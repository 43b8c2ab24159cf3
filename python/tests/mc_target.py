"""A Mooncake-style target, written against Mooncake's Python contract only (`from
mooncake.engine import TransferEngine`, HMC-Go's through hmc.compat): initialize, fall back to a
managed buffer when nothing is registered (as Mooncake's transfer_engine_target.py), print
"READY <name> <buffer address>", then answer notifications: "check <seed> <offset> <n>" is
answered "ok"/"bad" after comparing those bytes of the buffer with the pattern, "exit" (or
stdin closing) ends it.

argv: metadata_server local_hostname protocol
"""
import sys
import threading
import time

from mooncake.engine import TransferEngine, TransferNotify

CAPACITY = 64 << 20


def pattern(n, seed):
    return bytes((i * 7 + seed) % 256 for i in range(n))


def main():
    meta, name, proto = sys.argv[1:4]
    te = TransferEngine()
    assert te.initialize(name, meta, proto, "") == 0, te.last_error
    if meta == "P2PHANDSHAKE":
        name = name.split(":")[0] + ":" + str(te.get_rpc_port())
    addr = te.get_first_buffer_address(name)
    assert addr == 0, addr  # nothing registered yet
    addr = te.allocate_managed_buffer(CAPACITY)
    assert addr != 0, te.last_error
    assert te.get_first_buffer_address(name) == addr
    print("READY", name, addr, flush=True)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    while not stop.is_set():
        for n in te.get_notifies():
            assert isinstance(n, TransferNotify), n
            if n.msg == "exit":
                return
            _, seed, off, size = n.msg.split()
            got = te.read_bytes_from_buffer(addr + int(off), int(size))
            ok = "ok" if got == pattern(int(size), int(seed)) else "bad"
            assert te.send_notify(n.name, f"{ok} {seed}") == 0, te.last_error
        time.sleep(0.0005)


if __name__ == "__main__":
    main()
