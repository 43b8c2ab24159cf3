"""A pool client for test_kv.py, written against Mooncake Store's Python contract
(hmc.kv.MooncakeDistributedStore): setup against argv[1] (the master), lending 32 MiB, then
for each stdin line "put <key> <seed> <n> <replicas>" or "get <key> <seed> <n>" prints the
call's result ("0", a code, or "ok"/"bad" for a get compared with the pattern)."""
import sys

from hmc.kv import MooncakeDistributedStore


def pattern(seed, n):
    return bytes((i * 31 + seed + (i >> 10)) % 256 for i in range(n))


def main():
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", 32 << 20, 16 << 20, "tcp", "", sys.argv[1])
    print("READY", rc, s.get_hostname(), flush=True)
    for line in sys.stdin:
        f = line.split()
        if f[0] == "put":
            print(s.put(f[1], pattern(int(f[2]), int(f[3])), int(f[4])), flush=True)
        elif f[0] == "get":
            got = s.get(f[1])
            print("ok" if got == pattern(int(f[2]), int(f[3])) else "bad " + s.last_error, flush=True)
    s.close()


if __name__ == "__main__":
    main()
