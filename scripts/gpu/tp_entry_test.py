#!/usr/bin/env python3
"""The generated host entry of a multi-GPU plan, end to end on N GPUs of one process.

Builds (beforehand, with `mucc build` and `mucc transpile --out-dir` on the same file and
options) two libraries of one tensor-parallel graph, one with the NCCL all-reduce and one with
the all-reduce fused into its kernel, and checks that their `mucc_execute` entries give the same
outputs on the same random inputs: the fused entry with exchange buffers this script allocates
(`cudaMalloc`, peer access enabled between every pair, zeroed once), called several times to
walk the exchange's parities; both entries from one host thread per rank, each rank's device
current, on communicators from `ncclCommInitAll`.

    mucc build FILE --gpus 2 --all-reduce nccl  -o /tmp/nccl.so
    mucc build FILE --gpus 2 --all-reduce fused -o /tmp/fused.so
    mucc transpile FILE --gpus 2 --all-reduce fused --out-dir /tmp/plan   (the buffer sizes)
    python3 scripts/gpu/tp_entry_test.py /tmp/nccl.so /tmp/fused.so /tmp/plan/X.plan.json LIBNCCL

Needs PyTorch (allocation, random data, comparison) and NCCL's libnccl.so.2 (LIBNCCL). With two
GPUs the two forms add the same two values in the same precision, so they must agree exactly.
"""
import ctypes
import json
import sys
import threading

import torch

TORCH_DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
P = ctypes.c_void_p


def load_cudart():
    """The CUDA runtime PyTorch runs on (its wheel's copy when the system has none)."""
    import glob
    import os
    names = ["libcudart.so.13", "libcudart.so.12"]
    roots = [os.path.dirname(os.path.dirname(torch.__file__))]
    for root in roots:
        names += glob.glob(os.path.join(root, "nvidia", "*", "lib", "libcudart.so.*"))
        names += glob.glob(os.path.join(root, "nvidia", "cuda_runtime", "lib", "libcudart.so.*"))
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise SystemExit("no libcudart found")


def main() -> int:
    nccl_so, fused_so, plan_path, libnccl = sys.argv[1:5]
    plan = json.load(open(plan_path))
    n = plan["gpus"]
    xbytes = plan.get("exchange_bytes", 0)
    assert xbytes > 0, "the plan has no fused all-reduce"
    assert torch.cuda.device_count() >= n, f"needs {n} GPUs"
    nccl = ctypes.CDLL(libnccl)
    comms = (ctypes.c_void_p * n)()
    assert nccl.ncclCommInitAll(comms, n, None) == 0, "ncclCommInitAll"
    cudart = load_cudart()
    for a in range(n):
        torch.cuda.set_device(a)
        for b in range(n):
            if a != b:
                r = cudart.cudaDeviceEnablePeerAccess(b, 0)
                assert r in (0, 704), f"peer access {a}->{b}: {r}"  # 704: already enabled
    libs = {"nccl": ctypes.CDLL(nccl_so), "fused": ctypes.CDLL(fused_so)}
    libs["nccl"].mucc_execute.argtypes = [P, P, P, P, P]
    libs["fused"].mucc_execute.argtypes = [P, P, P, P, P, P]
    for lib in libs.values():
        lib.mucc_execute.restype = ctypes.c_int
    gen = torch.Generator().manual_seed(0)

    def tensor(d, device):
        t = torch.empty(d["alloc_elems"], dtype=TORCH_DTYPES[d["dtype"]])
        return t.uniform_(-1, 1, generator=gen).to(device)

    ranks = []
    for r in range(n):
        dev = torch.device("cuda", r)
        inputs = [tensor(d, dev) for d in plan["inputs"]]
        outs = {k: [torch.full((d["alloc_elems"],), float("nan"), dtype=TORCH_DTYPES[d["dtype"]],
                               device=dev) for d in plan["outputs"]] for k in libs}
        ws = torch.zeros(max(plan["workspace_bytes"], 1), dtype=torch.uint8, device=dev)
        # cudaMalloc'd (torch's allocator), so every GPU can address it once peer access is on.
        xb = torch.zeros(xbytes, dtype=torch.uint8, device=dev)
        ranks.append((dev, inputs, outs, ws, xb))
    xptrs = (ctypes.c_void_p * n)(*[x[4].data_ptr() for x in ranks])
    errors = []

    def run(kind, r, repeats):
        dev, inputs, outs, ws, _ = ranks[r]
        torch.cuda.set_device(dev)
        ins = (ctypes.c_void_p * len(inputs))(*[t.data_ptr() for t in inputs])
        o = (ctypes.c_void_p * len(outs[kind]))(*[t.data_ptr() for t in outs[kind]])
        stream = torch.cuda.current_stream(dev).cuda_stream
        entry = libs[kind].mucc_execute
        for _ in range(repeats):
            args = [ctypes.cast(ins, P), ctypes.cast(o, P), P(ws.data_ptr())]
            if kind == "fused":
                args.append(ctypes.cast(xptrs, P))
            rc = entry(*args, P(comms[r]), P(stream))
            if rc != 0:
                errors.append(f"{kind} rank {r}: mucc_execute returned {rc}")
                return
        torch.cuda.synchronize(dev)

    for kind, repeats in (("nccl", 1), ("fused", 5)):
        threads = [threading.Thread(target=run, args=(kind, r, repeats)) for r in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        print("\n".join(errors))
        return 1
    worst = 0.0
    for r, (_, _, outs, _, _) in enumerate(ranks):
        for j, (a, b) in enumerate(zip(outs["nccl"], outs["fused"])):
            a, b = a.float().cpu(), b.float().cpu()
            assert torch.isfinite(a).all() and torch.isfinite(b).all(), f"rank {r} output {j}"
            diff = (a - b).abs().max().item()
            worst = max(worst, diff)
            print(f"rank {r} output {j}: {a.numel()} elements, max |nccl - fused| = {diff:.3g}")
    print("ok" if worst == 0.0 or n > 2 else "DIFFERENT")
    return 0 if worst == 0.0 or n > 2 else 1


if __name__ == "__main__":
    sys.exit(main())
