"""Device-memory peers for test_device.py, written against Mooncake's contract (hmc.trans, as
mooncake.engine) with device memory from hmc.device (what CuPy or torch.cuda give a real user).
Both run with HMC_EMULATE_GPU=1 where no GPU is present.

target: registers a DeviceArray, prints "READY <name> <device address>", then answers
notifications: "check <seed> <off> <n>" with "ok <seed>" / "bad <seed> ..." after reading the
bytes back through a device copy, "fill <seed> <off> <n>" with "filled <seed>", "exit" ends it.

initiator <target name> <remote address>: runs every scenario against the target and prints
"PASS" (or raises).

mftarget <store url> / mfinit <store url> <session> <remote address>: the same through
memfabric_hybrid's TransferEngine (mf_adapter's contract, as SGLang's Ascend path calls it), with
a stream given to the _submit forms.
"""
import sys
import time

from hmc import device
from hmc.trans import TransferEngine, TransferNotify

N = 4 << 20


def pattern(n, seed):
    return bytes((i * 7 + seed) % 256 for i in range(n))


def target():
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, te.last_error
    name = "127.0.0.1:" + str(te.get_rpc_port())
    arr = device.DeviceArray(N)
    kind, _, _ = device.locate(arr.ptr)
    assert kind == device.Kind.DEVICE, kind
    assert te.register_memory(arr.ptr, N) == 0, te.last_error
    print("READY", name, arr.ptr, flush=True)
    while True:
        for n in te.get_notifies():
            if n.msg == "exit":
                return
            op, seed, off, size = n.msg.split()
            seed, off, size = int(seed), int(off), int(size)
            if op == "fill":
                arr.copy_from(pattern(size, seed), off)
                answer = f"filled {seed}"
            else:
                got = arr.to_bytes(size, off)
                want = pattern(size, seed)
                answer = f"ok {seed}" if got == want else \
                    f"bad {seed} first difference at {next(i for i in range(size) if got[i] != want[i])}"
            assert te.send_notify(n.name, TransferNotify(name, answer)) == 0, te.last_error
        time.sleep(0.0005)


def ask(te, peer, msg, want):
    me = "127.0.0.1:" + str(te.get_rpc_port())  # the name the target answers
    assert te.send_notify(peer, TransferNotify(me, msg)) == 0, te.last_error
    deadline = time.time() + 20
    while time.time() < deadline:
        for n in te.get_notifies():
            if n.msg.startswith("bad"):
                raise AssertionError(f"{msg}: target says {n.msg}")
            if n.msg == want:
                return
        time.sleep(0.0005)
    raise AssertionError(f"{msg}: no {want!r} from the target")


def initiator(peer, remote):
    remote = int(remote)
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, te.last_error
    local = device.DeviceArray(N)
    assert te.register_memory(local, N) == 0, te.last_error  # the array itself, as a tensor would be

    # Device to device, by address.
    n = 3 << 20
    local.copy_from(pattern(n, 1), 5)
    assert te.transfer_sync_write(peer, local.ptr + 5, remote + 7, n) == 0, te.last_error
    ask(te, peer, f"check 1 7 {n}", "ok 1")

    # A scattered batch of 16 KiB blocks, device to device.
    blk, count = 16 << 10, 64
    data = pattern(2 * blk * count, 2)
    local.copy_from(data)
    locs = [local.ptr + 2 * i * blk for i in range(count)]
    rems = [remote + i * blk for i in range(count)]
    assert te.batch_transfer_sync_write(peer, locs, rems, [blk] * count) == 0, te.last_error
    packed = b"".join(data[2 * i * blk:(2 * i + 1) * blk] for i in range(count))
    ask(te, peer, f"fill 0 0 0", "filled 0")  # a round trip: the writes are in
    assert te.transfer_sync_read(peer, local.ptr, remote, len(packed)) == 0, te.last_error
    assert local.to_bytes(len(packed)) == packed, "scattered device batch"

    # Reads of the peer's device memory into device memory.
    ask(te, peer, f"fill 3 11 {n}", "filled 3")
    assert te.transfer_sync_read(peer, local.ptr + 1, remote + 11, n) == 0, te.last_error
    assert local.to_bytes(n, 1) == pattern(n, 3), "read into device memory"

    # Stream order: a memset queued on a stream right before the call is what moves.
    m = 1 << 20
    with device.Stream() as s:
        local.memset_async(0x3c, s, m)
        te.transfer_write_on_cuda(peer, local.ptr, remote, m, stream_ptr=s.ptr)
        assert te.transfer_sync_read(peer, local.ptr + m, remote, m) == 0, te.last_error
        assert local.to_bytes(m, m) == bytes([0x3c]) * m, "transfer_write_on_cuda did not wait for the stream"
        local.memset_async(0x5d, s, m)
        te.batch_transfer_read_on_cuda(peer, [local.ptr], [remote + 8], [16], stream_ptr=s.ptr)
        # the read came after the memset: its 16 bytes are the peer's, the rest the memset's
        assert local.to_bytes(16) == bytes([0x3c]) * 16 and local.to_bytes(16, 16) == bytes([0x5d]) * 16

    # Unknown addresses and unregistered memory fail, typed, never crash.
    assert te.transfer_sync_write(peer, local.ptr, remote + N - 4, 8) == -1
    assert te.last_error, "a failure leaves last_error"
    print("PASS", flush=True)


def mf_target(url):
    from memfabric_hybrid import TransferEngine as MF
    te = MF()
    session = f"127.0.0.1:{te.get_rpc_port()}"
    assert te.initialize(url, session, "Decode", 0) == 0
    arr = device.DeviceArray(N)
    assert te.register_memory(arr.ptr, N) == 0
    print("READY", session, arr.ptr, flush=True)
    sys.stdin.read()
    te.unInitialize()


def mf_initiator(url, session, remote):
    from memfabric_hybrid import TransferEngine as MF
    remote = int(remote)
    te = MF()
    me = f"127.0.0.1:{te.get_rpc_port()}"
    assert te.initialize(url, me, "Prefill", 0) == 0
    local = device.DeviceArray(N)
    assert te.register_memory(local, N) == 0  # the array itself, as CuPy's would be given
    n = 1 << 20
    local.copy_from(pattern(n, 9))
    assert te.transfer_sync_write(session, local, remote, n) == 0
    assert te.transfer_sync_read(session, local.ptr + n, remote, n) == 0
    assert local.to_bytes(n, n) == pattern(n, 9), "memfabric: device round trip"
    with device.Stream() as s:  # a device stream orders the _submit forms
        local.memset_async(0x4b, s, n)
        assert te.transfer_async_write_submit(session, local.ptr, remote + 64, n, s.ptr) == 0
        assert te.batch_transfer_async_read_submit(session, [local.ptr + 2 * n], [remote + 64], [n], s.ptr) == 0
        assert local.to_bytes(n, 2 * n) == bytes([0x4b]) * n, "memfabric: the submit did not wait for its stream"
    te.unInitialize()
    print("PASS", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "target":
        target()
    elif sys.argv[1] == "mftarget":
        mf_target(sys.argv[2])
    elif sys.argv[1] == "mfinit":
        mf_initiator(*sys.argv[2:5])
    else:
        initiator(sys.argv[2], sys.argv[3])
