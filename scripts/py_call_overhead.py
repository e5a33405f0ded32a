"""Host cost of one eager ``kernel(...)`` call of the Python package, against the kernel's own
time (CUDA-graph replay) and the rate of back-to-back eager calls, for four graphs: the
decode-time fused MLP step of examples/torch_decode_mlp.py (M = 1, bf16) and corpus graphs
lora 2, mqa_bs8 0 (two kernels and a workspace) and rmsnorm_bs1 6. Needs a CUDA GPU, torch,
and the corpus (MUCC_CORPUS, default ../shared/corpus/mirage-benchmarks):

    python3 scripts/py_call_overhead.py [TAG]

Host cost: the best of 7 batches of 100 calls without synchronising inside a batch (100
launches never fill the GPU's queue, so the host is not throttled by the GPU). "raw _launch" is
the extension's launch alone, on pointers computed beforehand (no Python argument checks).
"""

import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
import torch  # noqa: E402

import mucc  # noqa: E402
from torch_decode_mlp import fused_graph  # noqa: E402

C = os.environ.get("MUCC_CORPUS", str(ROOT.parent / "shared" / "corpus" / "mirage-benchmarks"))
tag = sys.argv[1] if len(sys.argv) > 1 else "mucc " + mucc.__version__
def host_us(fn, n=100, reps=7):
    best = 1e9
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n): fn()
        best = min(best, (time.perf_counter() - t0) * 1e6 / n)
    torch.cuda.synchronize()
    return best
def graphed_us(fn, iters=200):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3): fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g): fn()
    for _ in range(5): g.replay()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters): g.replay()
    b.record(); torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / iters
def eager_rate(fn, iters=200):
    for _ in range(5): fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(); a.record()
    for _ in range(iters): fn()
    b.record(); torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / iters
TD = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
cases = [("decode m1 bf16", fused_graph(1, mucc.bfloat16)),
         ("lora g2", mucc.load(f"{C}/lora.json")[2]),
         ("mqa_bs8 g0", mucc.load(f"{C}/mqa_bs8.json")[0]),
         ("rmsnorm_bs1 g6", mucc.load(f"{C}/rmsnorm_bs1.json")[6])]
print(f"[{tag}] {torch.cuda.get_device_name()}")
print("| graph | steps | tensor maps | kernel (graphed) | host per call, out= | host, alloc | host, raw _launch | eager back-to-back rate |")
for name, g in cases:
    k = mucc.compile(g)
    ins = [torch.empty_strided(sh, st, dtype=TD[d], device="cuda").normal_().mul_(0.1) for sh, st, d in k.input_specs]
    outs = k(*ins)
    s = torch.cuda.current_stream().cuda_stream
    ptrs = [t.data_ptr() for t in ins]; optrs = [o.data_ptr() for o in outs]
    ws = torch.empty(max(k.workspace_bytes,1), dtype=torch.uint8, device="cuda").data_ptr() if k.workspace_bytes else 0
    call = lambda: k(*ins, out=outs)
    t_k = graphed_us(call)
    h_out = host_us(call); h_alloc = host_us(lambda: k(*ins)); h_raw = host_us(lambda: k._raw._launch(ptrs, optrs, ws, s))
    r = eager_rate(call)
    tm = k.explain().count("by tensor map")
    print(f"| {name} | {k._raw.steps} | {tm} | {t_k:.2f} | {h_out:.2f} | {h_alloc:.2f} | {h_raw:.2f} | {r:.2f} |")
print(f"[{tag}] current_stream obj {host_us(lambda: torch.cuda.current_stream().cuda_stream):.2f} us; raw {host_us(lambda: torch._C._cuda_getCurrentRawStream(0)):.2f} us; torch.empty {host_us(lambda: torch.empty(3584, dtype=torch.bfloat16, device='cuda')):.2f} us")
