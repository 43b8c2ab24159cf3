"""The peer process of the Python tests: serves a session and answers commands from rank 1."""
import os
import sys

import hmc

CHECK, FILL, STREAM, EXIT = 1, 2, 3, 9


def pattern(n, seed):
    return bytes((i * 7 + seed) % 256 for i in range(n)) if n < 4096 else (bytes((i * 7 + seed) % 256 for i in range(256)) * (n // 256 + 1))[:n]


def main():
    s = hmc.create_session(buffer_size=32 << 20, local_ip="127.0.0.1",
                           secret=os.environ.get("HMC_TEST_SECRET"))
    s.init_server(bind_ip="127.0.0.1", data_port=0, ctrl_tcp_port=0, self_id=0, ctrl_uds_dir=sys.argv[1])
    print("READY", s.data_port, s.ctrl_port, flush=True)
    while True:
        cmd = s.ctrl_recv(1)
        if cmd == EXIT:
            break
        n, seed = s.ctrl_recv(1), s.ctrl_recv(1)
        ok = 1
        if cmd == CHECK:
            ok = int(bytes(s.buf.get(n)) == pattern(n, seed))
        elif cmd == FILL:
            s.buf.put(pattern(n, seed))
        elif cmd == STREAM:
            dst = bytearray(n + 5)
            got = s.recv_data_into("127.0.0.1", 0, dst)
            ok = int(got == n and bytes(dst[:n]) == pattern(n, seed))
        s.ctrl_send(1, ok)
    s.close()


if __name__ == "__main__":
    main()
