"""The seeds' server example, on 127.0.0.1: serve a buffer and print what a client put."""
import hmc

sess = hmc.create_session(device_id=0, buffer_size=128 * 1024 * 1024, mem_type=hmc.MemoryType.CPU,
                          num_chs=1, local_ip="127.0.0.1")
sess.init_server(bind_ip="127.0.0.1", ucx_port=2025, rdma_port=2026, ctrl_tcp_port=5001, self_id=0,
                 ctrl_uds_dir="/tmp")
print("server ready")
tag = sess.ctrl_recv(1)          # the client puts, then sends a tag
n = sess.ctrl_recv(1)            # ... and the length
data = sess.buf.get(n, offset=0)
print("tag", tag, "received", bytes(data))
sess.close()
