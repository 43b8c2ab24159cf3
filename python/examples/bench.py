"""Puts NumPy arrays from Python and reports GB/s next to `hmc bench` of the same sizes and
transport, measured in the same run.

    python3 python/examples/bench.py [--transport auto|tcp|shm] [--sizes 4,16,64] [--iters 50]

Sizes are MiB. "stage+put" is sess.put(array) (zero-copy since Core v2: the transport reads the
array in place; before, a copy into the buffer, then the one-sided put);
"put" is put_remote of the already-staged bytes, the same operation `hmc bench` times, and timed
the same way (each call, summed); "wall clock" also counts the Python loop between calls.
"""
import argparse
import faulthandler
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import hmc  # noqa: E402


def dump_stacks(why):
    """Python's and the Go core's stacks, to stderr."""
    print(f"== {why}: Python threads", file=sys.stderr, flush=True)
    faulthandler.dump_traceback(all_threads=True)
    print(f"== {why}: Go core\n{hmc.debug_stacks()}", file=sys.stderr, flush=True)


def dump_request(pid):
    """The file whose creation asks process pid (the peer) to dump its stacks."""
    return f"/tmp/hmc-bench-dump-{pid}"


def dump_on_request(path):
    """The peer dumps its stacks when the benchmark's watchdog creates path."""
    def loop():
        while True:
            time.sleep(0.5)
            if os.path.exists(path):
                os.unlink(path)
                dump_stacks("peer")
    threading.Thread(target=loop, daemon=True).start()


class Watchdog:
    """Dumps every stack (this process, the peer, the hmc CLI) when no progress was made for
    `stall` seconds, then ends the run: a stuck benchmark says where it is stuck."""

    def __init__(self, stall, peer):
        self.stall, self.peer, self.cli, self.last = stall, peer, None, time.monotonic()
        threading.Thread(target=self.loop, daemon=True).start()

    def tick(self):
        self.last = time.monotonic()

    def loop(self):
        while time.monotonic() - self.last < self.stall:
            time.sleep(1)
        print(f"bench.py: no progress for {self.stall} s; dumping stacks", file=sys.stderr, flush=True)
        open(dump_request(self.peer.pid), "w").close()
        if self.cli is not None and self.cli.poll() is None:
            self.cli.send_signal(signal.SIGQUIT)  # Go prints every goroutine and exits
        # The Go core may be the stuck part: a dump that cannot enter it must not stop the exit.
        t = threading.Thread(target=dump_stacks, args=("bench",), daemon=True)
        t.start()
        t.join(timeout=5)
        if t.is_alive():
            print("== bench: the Go core did not answer (no goroutine dump)", file=sys.stderr, flush=True)
        time.sleep(3)
        if self.cli is not None and self.cli.poll() is not None:
            print(f"== hmc CLI stderr\n{self.cli.stderr.read()}", file=sys.stderr, flush=True)
        self.peer.kill()
        os._exit(3)


def serve(uds_dir):
    dump_on_request(dump_request(os.getpid()))
    s = hmc.create_session(buffer_size=int(sys.argv[3]), local_ip="127.0.0.1")
    s.init_server(bind_ip="127.0.0.1", data_port=0, ctrl_tcp_port=0, self_id=0, ctrl_uds_dir=uds_dir)
    print("READY", s.data_port, s.ctrl_port, flush=True)
    s.ctrl_recv(1, timeout=None)
    s.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--transport", default="auto")
    ap.add_argument("--sizes", default="4,16,64")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--hmc", default=None, help="path of the hmc binary (default: go run ./cmd/hmc)")
    ap.add_argument("--repeats", type=int, default=5, help="alternating Python/Go rounds; medians are compared")
    ap.add_argument("--stall", type=float, default=60, help="seconds without progress before stacks are dumped and the run ends")
    a = ap.parse_args()
    conn = hmc.ConnType[a.transport.upper()]
    sizes = [int(x) << 20 for x in a.sizes.split(",")]
    buf = max(sizes)
    peer = subprocess.Popen([sys.executable, __file__, "serve", "/tmp", str(buf)], stdout=subprocess.PIPE, text=True)
    _, dport, cport = peer.stdout.readline().split()
    dog = Watchdog(a.stall, peer)
    s = hmc.create_session(buffer_size=buf, num_chs=2, local_ip="127.0.0.1")
    s.connect(peer_id=0, self_id=1, peer_ip="127.0.0.1", data_port=int(dport), ctrl_tcp_port=int(cport),
              uds_dir="/tmp", conn=conn)
    cmd = [a.hmc] if a.hmc else ["go", "run", "./cmd/hmc"]
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    xs = {n: np.random.default_rng(0).integers(0, 255, n, dtype=np.uint8) for n in sizes}
    res = {n: {"staged": [], "put": [], "wall": [], "go": []} for n in sizes}
    for _ in range(a.repeats):  # Python and Go alternate, so both see the same machine
        for n in sizes:
            x = xs[n]
            s.put("127.0.0.1", int(dport), x, conn=conn)  # warm-up
            t0 = time.perf_counter()
            for _ in range(a.iters):
                s.put("127.0.0.1", int(dport), x, conn=conn)
            res[n]["staged"].append(n * a.iters / (time.perf_counter() - t0) / 1e9)
            dog.tick()
            # Timed per call and summed, as `hmc bench` times each transfer (its loop's own
            # bookkeeping between transfers is not counted either); wall clock kept beside it.
            busy, t0 = 0.0, time.perf_counter()
            for _ in range(a.iters):
                c0 = time.perf_counter()
                s.put_remote("127.0.0.1", int(dport), 0, 0, n, conn)
                busy += time.perf_counter() - c0
            res[n]["wall"].append(n * a.iters / (time.perf_counter() - t0) / 1e9)
            res[n]["put"].append(n * a.iters / busy / 1e9)
            dog.tick()
        dog.cli = subprocess.Popen(cmd + ["bench", "--quiet", "--json", "--transport", a.transport, "--iters", str(a.iters),
                                          "--sizes", ",".join(f"{n >> 20}MiB" for n in sizes)],
                                   cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env=dict(os.environ, GOTRACEBACK="all"))
        out = dog.cli.stdout.read()
        if dog.cli.wait() != 0:
            sys.exit(f"hmc bench failed ({dog.cli.returncode}): {dog.cli.stderr.read()}")
        dog.cli = None
        dog.tick()
        for r in map(json.loads, out.splitlines()):
            res[r["size"]]["go"].append(r["gbps"])
            route = r["route"]
    s.ctrl_send(0, 9)
    s.close()
    peer.wait(timeout=30)
    med = statistics.median
    print(f"medians of {a.repeats} alternating rounds, {a.iters} iterations each")
    print(f"{'size':>8} {'py stage+put GB/s':>18} {'py put GB/s':>12} {'(wall clock)':>13} {'hmc bench GB/s':>15} "
          f"{'py put / go':>12}  route")
    for n in sizes:
        r = res[n]
        print(f"{n >> 20:>6}Mi {med(r['staged']):>18.2f} {med(r['put']):>12.2f} {med(r['wall']):>13.2f} "
              f"{med(r['go']):>15.2f} {med(r['put']) / med(r['go']):>12.2f}  {route}")

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        main()
