"""Device memory through the KV-cache pool's Python face (test_device.py): with
HMC_EMULATE_GPU=1 where no GPU is present.

serve: a master and a store lending 32 MiB; prints "READY <master>", then answers "check <key>
<seed> <n>" by reading the object into device memory (its own segment: a device copy) and
comparing the bytes read back, "ok" or "bad ...".
client <master>: a store lending nothing puts objects from device memory (put_from,
batch_put_from: staged by the transfer engine), reads them back into device memory
(batch_get_into), asks the server to check them, and prints "PASS" (or raises)."""
import sys

from hmc import device
from hmc.kv import Master, MooncakeDistributedStore


def pattern(n, seed):
    return bytes((i * 7 + seed) % 256 for i in range(n))


def serve():
    with Master() as m:
        s = MooncakeDistributedStore()
        assert s.setup("127.0.0.1", "P2PHANDSHAKE", 32 << 20, 0, "tcp", "", m.addr) == 0, s.last_error
        print("READY", m.addr, flush=True)
        for line in sys.stdin:
            _, key, seed, n = line.split()
            seed, n = int(seed), int(n)
            with device.DeviceArray(n) as d:
                got = s.get_into(key, d.data_ptr(), n)
                ok = got == n and d.to_bytes(n) == pattern(n, seed)
                print("ok" if ok else f"bad {got} {s.last_error}", flush=True)
        s.close()


def client(master):
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", master) == 0, s.last_error
    sizes = [1 << 20, 64 << 10, (3 << 20) + 5]
    arrs = [device.DeviceArray(n) for n in sizes]
    for i, (a, n) in enumerate(zip(arrs, sizes)):
        a.copy_from(pattern(n, i))
    assert s.put_from("d0", arrs[0], sizes[0]) == 0, s.last_error
    assert s.batch_put_from(["d1", "d2"], [arrs[1].data_ptr(), arrs[2].data_ptr()], sizes[1:]) == [0, 0], s.last_error
    back = [device.DeviceArray(n) for n in sizes]
    got = s.batch_get_into(["d0", "d1", "d2"], back, sizes)
    assert got == sizes, (got, s.last_error)
    for i, (b, n) in enumerate(zip(back, sizes)):
        assert b.to_bytes(n) == pattern(n, i), f"d{i} differs"
    for i, n in enumerate(sizes):
        print(f"check d{i} {i} {n}", flush=True)
        assert sys.stdin.readline().strip() == "ok"
    s.close()
    print("PASS", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve()
    else:
        client(sys.argv[2])
