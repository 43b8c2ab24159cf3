"""The seeds' client example, on 127.0.0.1: stage bytes and a NumPy array, put them, tag."""
import numpy as np

import hmc

server_ip = "127.0.0.1"
sess = hmc.create_session(mem_type=hmc.MemoryType.CPU, local_ip="127.0.0.1")
sess.connect(peer_id=0, self_id=1, peer_ip=server_ip, data_port=2025, ctrl_tcp_port=5001, uds_dir="/tmp",
             conn=hmc.ConnType.AUTO)
payload = b"hello hmc"
n = sess.buf.put(payload, offset=0)             # stage into the local ConnBuffer
sess.put_remote(server_ip, 2025, local_off=0, remote_off=0, nbytes=n, conn=hmc.ConnType.AUTO)
sess.ctrl_send(0, 1)                            # the bytes are visible at the server already
sess.ctrl_send(0, n)
x = np.arange(1024, dtype=np.int32)             # NumPy round trip into our own buffer
sess.buf.put(x, offset=4096)
y = np.empty_like(x)
sess.buf.get_into(y, nbytes=y.nbytes, offset=4096)
assert (x == y).all()
print("sent", n, "bytes")
sess.close()
