"""The decode side of test_serving_paths, written as the serving stacks call the engines.

argv[1] "vllm": vLLM's MooncakeConnectorWorker as a consumer: `from mooncake.engine import
TransferEngine`, initialize(ip, "P2PHANDSHAKE", "rdma", "") (MC_FORCE_TCP=1 in the
environment), get_rpc_port, KV caches as torch tensors registered with batch_register_memory.
argv[1] "ascend" STORE_URL: SGLang's AscendTransferEngine as Decode: `from mf_adapter import
TransferEngine`, get_rpc_port before initialize, initialize(store_url, "ip:port", "Decode", npu_id,
TransferEngine.TransDataOpType.SDMA), batch_register_memory.
Prints "READY <session> <addr>..." with each layer's base address; then for each "check <seed>"
line on stdin prints "ok"/"bad" after comparing every layer with the pattern; stdin closing ends it.
"""
import sys

import torch

LAYERS, NBYTES = 4, 1 << 20


def expected(seed):
    return [((torch.arange(NBYTES, dtype=torch.int64) * (7 + i) + seed) % 251).to(torch.uint8) for i in range(LAYERS)]


def main():
    kv = [torch.zeros(NBYTES, dtype=torch.uint8) for _ in range(LAYERS)]
    ptrs, lens = [t.data_ptr() for t in kv], [t.numel() * t.element_size() for t in kv]
    if sys.argv[1] == "vllm":
        from mooncake.engine import TransferEngine
        te = TransferEngine()
        assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "") == 0, te.last_error
        session = f"127.0.0.1:{te.get_rpc_port()}"
        assert te.batch_register_memory(ptrs, lens) == 0, te.last_error
    else:
        from mf_adapter import TransferEngine
        te = TransferEngine()
        session = f"127.0.0.1:{te.get_rpc_port()}"
        rc = te.initialize(sys.argv[2], session, "Decode", 0, TransferEngine.TransDataOpType.SDMA)
        assert rc == 0, rc
        assert te.batch_register_memory(ptrs, lens) == 0
    print("READY", session, *ptrs, flush=True)
    for line in sys.stdin:
        seed = int(line.split()[1])
        print("ok" if all(torch.equal(a, b) for a, b in zip(kv, expected(seed))) else "bad", flush=True)
    te.unInitialize() if sys.argv[1] == "ascend" else te.destroy()


if __name__ == "__main__":
    main()
