"""One member of the 4-process all-to-all test: prints its ports, reads the member list, runs."""
import json
import sys

import numpy as np

import hmc
from hmc import collective


def main():
    world, conn = int(sys.argv[1]), hmc.ConnType[sys.argv[2]]
    s = hmc.create_session(buffer_size=8 << 20, local_ip="127.0.0.1")
    s.init_server(bind_ip="127.0.0.1", data_port=0, ctrl_tcp_port=0, self_id=0, ctrl_uds_dir="", conn=conn)
    if len(sys.argv) > 3 and sys.argv[3] == "store":  # rendezvous through the config store
        g = collective.init_group(session=s, my_ip="127.0.0.1", conn=conn, store=sys.argv[4], world=world)
        rank = g.rank
    elif len(sys.argv) > 3:  # rendezvous through torch.distributed (gloo, file:// store)
        import torch.distributed as dist
        rank = int(sys.argv[3])
        dist.init_process_group("gloo", init_method="file://" + sys.argv[4], rank=rank, world_size=world)
        g = collective.init_group(session=s, my_ip="127.0.0.1", conn=conn)
    else:
        print("PORTS", s.data_port, s.ctrl_port, flush=True)
        members = json.loads(sys.stdin.readline())
        rank = next(m["rank"] for m in members if m["port_data"] == s.data_port)
        g = collective.init_group(session=s, my_ip="127.0.0.1", members=members, conn=conn)
    assert g.rank == rank and g.world == world
    n = 1000  # int32 per block
    for algo in ("direct", "ring", "auto"):
        send = np.array([[rank * 1_000_000 + dst * 1000 + i for i in range(n)] for dst in range(world)], dtype=np.int32)
        recv = np.zeros_like(send)
        collective.alltoall(g, send, recv, algo=algo)
        want = np.array([[src * 1_000_000 + rank * 1000 + i for i in range(n)] for src in range(world)], dtype=np.int32)
        if not (recv == want).all():
            print("FAIL", algo, flush=True)
            sys.exit(1)
    g.close()
    print("OK", flush=True)
    sys.stdin.readline()  # stay up until every member is done
    s.close()


if __name__ == "__main__":
    main()
