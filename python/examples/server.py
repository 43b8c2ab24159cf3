"""The seeds' server example, on 127.0.0.1: serve a buffer and print what a client put.

It pairs with client.py and with the README's Python snippet: each puts, then sends a tag and
the length. Ports 2025 (data) and 5001 (control) and /tmp for the Unix socket, or HMC_DATA_PORT,
HMC_CTRL_PORT and HMC_UDS_DIR."""
import os

import hmc

data_port = int(os.environ.get("HMC_DATA_PORT", 2025))
ctrl_port = int(os.environ.get("HMC_CTRL_PORT", 5001))
uds_dir = os.environ.get("HMC_UDS_DIR", "/tmp")

sess = hmc.create_session(device_id=0, buffer_size=128 * 1024 * 1024, mem_type=hmc.MemoryType.CPU,
                          num_chs=1, local_ip="127.0.0.1")
sess.init_server(bind_ip="127.0.0.1", ucx_port=data_port, rdma_port=data_port + 1, ctrl_tcp_port=ctrl_port, self_id=0,
                 ctrl_uds_dir=uds_dir)
print("server ready", flush=True)
tag = sess.ctrl_recv(1)          # the client puts, then sends a tag
n = sess.ctrl_recv(1)            # ... and the length
data = sess.buf.get(n, offset=0)
print("tag", tag, "received", bytes(data))
sess.close()
