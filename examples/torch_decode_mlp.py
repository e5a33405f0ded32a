"""A decode-time MLP block (Qwen2.5-7B sizes: hidden 3584, intermediate 18944) at batch 1 and
8 whose down projection with its gating, (silu(G) ⊙ U) · W_down, runs as one mucc kernel built
with the Mirage-style API; the gate and up projections stay in PyTorch.

Checks the block's output against PyTorch's, then times three things inside captured CUDA
graphs (so launch overheads do not count): the whole block with mucc, the whole block in
PyTorch eager ops, and the fused step alone against its PyTorch ops and torch.compile; and the
host cost of one eager ``kernel(...)`` call. Needs a CUDA GPU and torch:

    python examples/torch_decode_mlp.py [--dtype bf16|fp16] [--iters 200]
"""

import argparse
import time

import torch

import mucc

HIDDEN, INTER = 3584, 18944
BLOCKS, FORLOOP = 56, 64  # the grid mucc's decode benchmark graphs use for 18944 x 3584
# Relative error (‖got − want‖ / ‖want‖) a 16-bit output may show against PyTorch's: both round
# the same f32 sums to 16 bits in a different order (docs/python.md).
BOUNDS = {"bf16": 2e-2, "fp16": 5e-3}


def fused_graph(m, dt):
    g = mucc.new_kernel_graph()
    G = g.new_input(dims=(m, INTER), dtype=dt)
    U = g.new_input(dims=(m, INTER), dtype=dt)
    W = g.new_input(dims=(INTER, HIDDEN), dtype=dt)
    tb = mucc.new_threadblock_graph(grid_dim=(BLOCKS, 1, 1), block_dim=(128, 1, 1),
                                    forloop_range=FORLOOP, reduction_dimx=64)
    tG = tb.new_input(dtensor=G, input_map=(-1, -1, -1), forloop_dim=1)
    tU = tb.new_input(dtensor=U, input_map=(-1, -1, -1), forloop_dim=1)
    tW = tb.new_input(dtensor=W, input_map=(1, -1, -1), forloop_dim=0)
    t = tb.matmul(tb.mul(tb.silu(tG), tU), tW)
    tb.new_output(stensor=tb.forloop_accum(t), output_map=(1, -1, -1))
    (O,) = g.customized([G, U, W], tb)
    g.mark_output(O)
    return g


def graphed_us(fn, iters):
    """µs per call of ``fn`` replayed from a CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(5):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / iters


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    ap.add_argument("--iters", type=int, default=200)
    a = ap.parse_args()
    tdt = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    mdt = mucc.bfloat16 if a.dtype == "bf16" else mucc.float16
    torch.manual_seed(0)
    dev = "cuda"
    w_gate = torch.randn(HIDDEN, INTER, device=dev, dtype=tdt) * HIDDEN ** -0.5
    w_up = torch.randn(HIDDEN, INTER, device=dev, dtype=tdt) * HIDDEN ** -0.5
    w_down = torch.randn(INTER, HIDDEN, device=dev, dtype=tdt) * INTER ** -0.5
    compiled_step = torch.compile(lambda g, u, w: (torch.nn.functional.silu(g) * u) @ w)
    print(f"GPU {torch.cuda.get_device_name()}, {a.dtype}, torch {torch.__version__}, "
          f"mucc {mucc.__version__}")
    print("| batch | rel err vs torch | block, mucc (µs) | block, torch (µs) | step, mucc | "
          "step, torch eager | step, torch.compile | eager call, host µs | eager call − graphed (µs) |")
    print("|---|---|---|---|---|---|---|---|---|")
    ok = True
    for m in (1, 8):
        t0 = time.perf_counter()
        kernel = mucc.compile(fused_graph(m, mdt))
        compile_s = time.perf_counter() - t0
        h = torch.randn(m, HIDDEN, device=dev, dtype=tdt)

        def block_mucc():
            return kernel(h @ w_gate, h @ w_up, w_down)[0]

        def block_torch():
            return (torch.nn.functional.silu(h @ w_gate) * (h @ w_up)) @ w_down

        got, want = block_mucc(), block_torch()
        torch.cuda.synchronize()
        err = ((got.double() - want.double()).norm() / want.double().norm()).item()
        ok &= err <= BOUNDS[a.dtype]
        g, u = h @ w_gate, h @ w_up
        out = torch.empty(m, HIDDEN, device=dev, dtype=tdt)
        compiled_step(g, u, w_down)
        t_block_mucc = graphed_us(block_mucc, a.iters)
        t_block_torch = graphed_us(block_torch, a.iters)
        t_step_mucc = graphed_us(lambda: kernel(g, u, w_down, out=[out]), a.iters)
        t_step_torch = graphed_us(lambda: (torch.nn.functional.silu(g) * u) @ w_down, a.iters)
        t_step_compiled = graphed_us(lambda: compiled_step(g, u, w_down), a.iters)
        # Eager calls: host time per call (no sync inside), and the GPU rate of back-to-back
        # eager calls against graph replays of the same kernel.
        for _ in range(10):
            kernel(g, u, w_down, out=[out])
        torch.cuda.synchronize()
        n = a.iters
        t0 = time.perf_counter()
        for _ in range(n):
            kernel(g, u, w_down, out=[out])
        host_us = (time.perf_counter() - t0) * 1e6 / n
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            kernel(g, u, w_down, out=[out])
        end.record()
        torch.cuda.synchronize()
        eager_us = start.elapsed_time(end) * 1e3 / n
        print(f"| {m} | {err:.2e} (bound {BOUNDS[a.dtype]:.0e}) | {t_block_mucc:.2f} | "
              f"{t_block_torch:.2f} | {t_step_mucc:.2f} | {t_step_torch:.2f} | "
              f"{t_step_compiled:.2f} | {host_us:.2f} | {eager_us - t_step_mucc:+.2f} |")
        print(f"  (compiled in {compile_s:.2f} s; {kernel!r})")
    print("outputs match" if ok else "OUTPUTS DIFFER beyond the bound")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
