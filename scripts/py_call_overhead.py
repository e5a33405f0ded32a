"""Cost of a Python call of the package against its kernel's time, in the pattern of Mirage's
benchmark scripts: `optimized = graph.superoptimize(previous_checkpoint=FILE)`, then 1,000 calls
`optimized(inputs=[...])` in a loop timed by CUDA events (each call allocates its outputs), and
the same loop through `optimized.graphed()` (outputs of its own, CUDA-graph replays). Graphs:
Mirage's nTrans (bs 1 and 8), LoRA and GQA (bs 1) scripts rebuilt with `import mucc as mi`,
and mqa_bs8 graph 0 (two kernels and a workspace) and rmsnorm_bs1 graph 6 (a tensor map)
through `mucc.compile`. Needs a CUDA GPU, torch and the corpus (MUCC_CORPUS, default
../shared/corpus/mirage-benchmarks):

    python3 scripts/py_call_overhead.py [TAG]

Columns: "kernel" is the call captured in a torch CUDA graph and replayed (GPU time per call);
"loop" columns are µs per call of the 1,000-call loop (the best of 3 loops); "host" columns are
host µs per call (the best of 9 batches of 300 calls without synchronising, the GPU never the
limit); "launch alone" is the extension's plain launch on addresses computed beforehand.
"""

import os
import pathlib
import sys
import time

import torch

import mucc as mi

ROOT = pathlib.Path(__file__).resolve().parent.parent
C = os.environ.get("MUCC_CORPUS", str(ROOT.parent / "shared" / "corpus" / "mirage-benchmarks"))
tag = sys.argv[1] if len(sys.argv) > 1 else "mucc " + mi.__version__


def host_us(fn, n=300, reps=9):
    best = 1e9
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) * 1e6 / n)
    torch.cuda.synchronize()
    return best


def loop_us(fn, n=1000, reps=3):
    best = 1e9
    for _ in range(reps):
        for _ in range(16):
            fn()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(n):
            fn()
        b.record()
        torch.cuda.synchronize()
        best = min(best, a.elapsed_time(b) * 1e3 / n)
    return best


def kernel_us(fn, iters=300):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(5):
        g.replay()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    a.record()
    for _ in range(iters):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / iters


def randn(*shape):
    return torch.randn(*shape, dtype=torch.float16, device="cuda").mul_(0.1)


def ntrans(bs):
    g = mi.new_kernel_graph()
    H, X, alpha = (g.new_input(dims=(8 * bs, 4096), dtype=mi.float16) for _ in range(3))
    Hn = g.rms_norm(H, normalized_shape=(4096,))
    g.mark_output(g.rms_norm(g.add(X, g.mul(alpha, g.add(Hn, X))), normalized_shape=(4096,)))
    return g, f"ntrans_bs{bs}.json", [randn(8 * bs, 4096) for _ in range(3)]


def lora():
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(16, 256), dtype=mi.float16)
    W = g.new_input(dims=(256, 4096), dtype=mi.float16)
    A = g.new_input(dims=(256, 16), dtype=mi.float16)
    B = g.new_input(dims=(16, 4096), dtype=mi.float16)
    g.mark_output(g.add(g.matmul(X, W), g.matmul(g.matmul(X, A), B)))
    return g, "lora.json", [randn(16, 256), randn(256, 4096), randn(256, 16), randn(16, 4096)]


def gqa_bs1():
    g = mi.new_kernel_graph()
    Q = g.new_input(dims=(2, 256, 64), dtype=mi.float16)
    K = g.new_input(dims=(2, 64, 4096), dtype=mi.float16)
    V = g.new_input(dims=(2, 4096, 64), dtype=mi.float16)
    E = g.exp(g.matmul(Q, K))
    g.mark_output(g.matmul(g.div(E, g.reduction(E, 2)), V))
    return g, "gqa_bs1.json", [randn(2, 256, 64), randn(2, 64, 4096), randn(2, 4096, 64)]


print(f"[{tag}] {torch.cuda.get_device_name()}, torch {torch.__version__}")
print("| graph | steps | kernel | loop, eager | loop, graphed | host, eager | host, eager out= "
      "| host, graphed | launch alone |")
print("|---|---|---|---|---|---|---|---|---|")
rows = []
for make in (lambda: ntrans(1), lambda: ntrans(8), lora, gqa_bs1):
    graph, file, ins = make()
    opt = graph.superoptimize(previous_checkpoint=f"{C}/{file}")
    rows.append((f"{file[:-5]} ({opt.graph.origin.split(', ')[-1]})", opt.kernel, ins, opt))
for file, g in (("mqa_bs8", 0), ("rmsnorm_bs1", 6)):
    k = mi.compile(mi.load(f"{C}/{file}.json")[g])
    td = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
    ins = [torch.empty_strided(sh, st, dtype=td[d], device="cuda").normal_().mul_(0.1)
           for sh, st, d in k.input_specs]
    rows.append((f"{file} (graph {g})", k, ins, None))
for name, k, ins, opt in rows:
    outs = k(*ins)
    eager = (lambda: opt(inputs=ins)) if opt else (lambda: k(*ins))
    graphed = None
    if hasattr(k, "graphed"):  # older packages have no graphed mode
        gr = opt.graphed() if opt else k.graphed()
        graphed = (lambda: gr(inputs=ins)) if opt else (lambda: gr(*ins))
        graphed()
    s = torch.cuda.current_stream().cuda_stream
    ptrs, optrs = [t.data_ptr() for t in ins], [o.data_ptr() for o in outs]
    ws = 0
    if k.workspace_bytes:
        ws = k._raw._workspace(s) if hasattr(k._raw, "_workspace") else k._ws[s].data_ptr()
    t_k = kernel_us(lambda: k(*ins, out=outs))
    g_loop = f"{loop_us(graphed):.2f}" if graphed else "—"
    g_host = f"{host_us(graphed):.2f}" if graphed else "—"
    print(f"| {name} | {k._raw.steps} | {t_k:.2f} | {loop_us(eager):.2f} | {g_loop} "
          f"| {host_us(eager):.2f} | {host_us(lambda: k(*ins, out=outs)):.2f} "
          f"| {g_host} | {host_us(lambda: k._raw._launch(ptrs, optrs, ws, s)):.2f} |",
          flush=True)
