#!/usr/bin/env python3
"""mucc against PyTorch on the corpus benchmark programs, on one GPU, in one run.

For every benchmark program of the corpus (gated MLP, RMSNorm + linear, the attention files,
LoRA, nTrans; qknorm for reference), this script times

  * PyTorch eager and torch.compile on the same shapes and dtype (fp16), and for the attention
    programs F.scaled_dot_product_attention (K stored as SDPA wants it), each captured in a
    CUDA graph and replayed, with input sets rotated so that the working set exceeds twice the
    L2 cache — the method `mucc bench` uses (samples of >= 10 executions, median of 50);
  * `mucc bench FILE --all --json` (every candidate; the fastest candidate whose outputs are
    all finite and, with --check, that matches the interpreter),

and prints one Markdown table with the ratios. Run it on the GPU machine (it has PyTorch):

    LD_LIBRARY_PATH=carry:/usr/local/cuda/lib64 \\
      python3 scripts/bench_vs_torch.py --mucc carry/mucc --corpus carry/corpus --out $OUT

`--mucc-json DIR` reads `DIR/<name>.bench.json` files written earlier by `mucc bench --json`
instead of running mucc (scripts/gpu-test.sh writes them). `--torch-json FILE` reads PyTorch's
timings from a file an earlier run wrote with `--save-torch FILE` (same GPU kind, please);
`--no-mucc` times PyTorch only.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

import torch


def rms(x):
    """x / sqrt(mean(x^2)) over the last dim, no epsilon, no weight (Mirage's rms_norm)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True))).to(x.dtype)


def gated_mlp(x, w1, w2):
    return torch.nn.functional.silu(x @ w1) * (x @ w2)


def lora(x, w, a, b):
    return x @ w + (x @ a) @ b


def attention(q, k, v):
    # exp(Q·K) / Σ exp(Q·K) · V, no scaling; softmax subtracts the max, which changes nothing
    # mathematically and keeps fp16 finite.
    return torch.softmax(q @ k, dim=-1) @ v


def qknorm_attention(q, k, v):
    # The program the qknorm files were searched from: attention with rms(Q) and rms(V) over
    # the head dim. mucc's candidates compute something else (format reference, §5.3).
    return torch.softmax(rms(q) @ k, dim=-1) @ rms(v)


def sdpa(q, kt, v):
    # The same attention through PyTorch's fused kernels (FlashAttention / memory-efficient),
    # 4-D (batch 1, heads, seq, head dim), no scaling. K comes in (heads, kv, 64), the layout
    # a user of SDPA would store; the timing does not include a transpose.
    o = torch.nn.functional.scaled_dot_product_attention(
        q.unsqueeze(0), kt.unsqueeze(0), v.unsqueeze(0), scale=1.0)
    return o.squeeze(0)


def qknorm_sdpa(q, kt, v):
    return sdpa(rms(q), kt, rms(v))


def sdpa_shapes(shapes):
    """attn_shapes with K stored as (heads, kv, head dim) for SDPA."""
    q, k, v = shapes
    return [q, (k[0], k[2], k[1]), v]


# Workload program -> its SDPA form (the attention programs only).
SDPA_FORMS = {"attention": sdpa, "qknorm_attention": qknorm_sdpa}


def ntrans(h, x, alpha):
    return rms(x + alpha * (rms(h) + x))


def rmsnorm_linear(x, w):
    return rms(x) @ w


def attn_shapes(heads, s):
    return [(heads, s, 64), (heads, 64, 4096), (heads, 4096, 64)]


# name, file, program, input shapes, mucc input scale (attention has no max subtraction)
WORKLOADS = [
    ("gated_mlp", "gated_mlp.json", gated_mlp, [(8, 4096), (4096, 4096), (4096, 4096)], 1.0),
    ("rmsnorm_bs1", "rmsnorm_bs1.json", rmsnorm_linear, [(2, 4096), (4096, 6144)], 1.0),
    ("rmsnorm_bs8", "rmsnorm_bs8.json", rmsnorm_linear, [(16, 4096), (4096, 6144)], 1.0),
    ("gqa_bs1", "gqa_bs1.json", attention, attn_shapes(2, 256), 0.5),
    ("gqa_bs8", "gqa_bs8.json", attention, attn_shapes(16, 256), 0.5),
    ("mqa_bs1", "mqa_bs1.json", attention, attn_shapes(1, 1024), 0.5),
    ("mqa_bs8", "mqa_bs8.json", attention, attn_shapes(8, 1024), 0.5),
    ("mha_bs1", "mha_bs1.json", attention, attn_shapes(32, 16), 0.5),
    ("mha_bs8", "mha_bs8.json", attention, attn_shapes(256, 16), 0.5),
    ("qknorm_gqa_bs1", "qknorm_gqa_bs1.json", qknorm_attention, attn_shapes(2, 256), 0.1),
    ("qknorm_gqa_bs8", "qknorm_gqa_bs8.json", qknorm_attention, attn_shapes(16, 256), 0.1),
    ("ntrans_bs1", "ntrans_bs1.json", ntrans, [(8, 4096)] * 3, 1.0),
    ("ntrans_bs8", "ntrans_bs8.json", ntrans, [(64, 4096)] * 3, 1.0),
    ("lora", "lora.json", lora, [(16, 256), (256, 4096), (256, 16), (16, 4096)], 1.0),
]


def rotation_sets(set_bytes, l2_bytes, budget_bytes):
    """As mucc's `rotation_sets`: sets whose total exceeds twice the L2 cache."""
    set_bytes = max(set_bytes, 1)
    wanted = -(-2 * l2_bytes // set_bytes) + 1
    affordable = max(budget_bytes // set_bytes, 1)
    return max(1, min(wanted, affordable, 1024))


def time_graph(fn, shapes, iters, warmup, min_execs=10, dtype=torch.float16):
    """Median µs per execution of fn over rotated input sets, replayed as one CUDA graph."""
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    first = [torch.empty(s, device=dev, dtype=dtype).uniform_(-1, 1) for s in shapes]
    with torch.no_grad():
        out = fn(*first)
        out_bytes = out.numel() * out.element_size()
    set_bytes = sum(t.numel() * t.element_size() for t in first) + out_bytes
    free, _ = torch.cuda.mem_get_info()
    n = rotation_sets(set_bytes, props.L2_cache_size, min(free // 4, 8 << 30))
    sets = [first] + [[t.clone() for t in first] for _ in range(n - 1)]
    per = n * -(-min_execs // n)
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for k in range(3):
                fn(*sets[k % n])
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = [fn(*sets[k % n]) for k in range(per)]
    for _ in range(max(warmup, 1)):
        graph.replay()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(iters)]
    for a, b in events:
        a.record()
        graph.replay()
        b.record()
    torch.cuda.synchronize()
    us = [a.elapsed_time(b) * 1e3 / per for a, b in events]
    finite = all(bool(torch.isfinite(o).all()) for o in outs[:n])
    del graph, outs, sets
    torch.cuda.empty_cache()
    return statistics.median(us), n, finite


def mucc_bench(args, name, file, scale):
    if args.mucc_json:
        path = os.path.join(args.mucc_json, f"{name}.bench.json")
        with open(path) as f:
            return json.load(f)
    cmd = [args.mucc, "bench", os.path.join(args.corpus, file), "--all", "--json",
           "--scale", str(scale), "--iters", str(args.iters)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if args.out:
        with open(os.path.join(args.out, f"{name}.bench.json"), "w") as f:
            f.write(p.stdout)
        with open(os.path.join(args.out, f"{name}.bench.err"), "w") as f:
            f.write(p.stderr)
    try:
        return json.loads(p.stdout)
    except json.JSONDecodeError:
        print(f"{name}: mucc bench failed (exit {p.returncode}): {p.stderr.strip()[:500]}",
              file=sys.stderr)
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mucc", default="carry/mucc")
    ap.add_argument("--corpus", default="carry/corpus")
    ap.add_argument("--mucc-json", help="read <name>.bench.json from this folder")
    ap.add_argument("--out", help="folder for mucc's JSON and the table")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--only", nargs="*", help="workload names to run")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--no-sdpa", action="store_true",
                    help="skip scaled_dot_product_attention for the attention workloads")
    ap.add_argument("--save-torch", help="write PyTorch's timings to this JSON file")
    ap.add_argument("--torch-json", help="read PyTorch's timings from this JSON file")
    ap.add_argument("--no-mucc", action="store_true", help="time PyTorch only")
    args = ap.parse_args()
    saved = {}
    if args.torch_json:
        with open(args.torch_json) as f:
            saved = json.load(f)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    gpu = torch.cuda.get_device_name(0)
    rows = []
    for name, file, fn, shapes, scale in WORKLOADS:
        if args.only and name not in args.only:
            continue
        t0 = time.time()
        if name in saved:
            eager, comp = saved[name]["eager_us"], saved[name]["compile_us"]
            sets = saved[name]["sets"]
            sdpa_us = saved[name].get("sdpa_us")
        else:
            eager, sets, eager_ok = time_graph(fn, shapes, args.iters, args.warmup)
            comp, comp_ok = None, True
            if not args.no_compile:
                torch._dynamo.reset()
                cfn = torch.compile(fn, dynamic=False)
                comp, _, comp_ok = time_graph(cfn, shapes, args.iters, args.warmup)
            sdpa_us, sdpa_ok = None, True
            form = SDPA_FORMS.get(fn.__name__)
            if form is not None and not args.no_sdpa:
                sdpa_us, _, sdpa_ok = time_graph(form, sdpa_shapes(shapes), args.iters, args.warmup)
            if not (eager_ok and comp_ok and sdpa_ok):
                print(f"{name}: PyTorch produced non-finite outputs (eager finite: {eager_ok}, "
                      f"compile finite: {comp_ok}, sdpa finite: {sdpa_ok})", file=sys.stderr)
            saved[name] = {"eager_us": eager, "compile_us": comp, "sdpa_us": sdpa_us,
                           "sets": sets, "gpu": gpu, "torch": torch.__version__}
        doc = None if args.no_mucc else mucc_bench(args, name, file, scale)
        best = None
        if doc:
            ok = [g for g in doc["graphs"] if g.get("ok")]
            if ok:
                best = min(ok, key=lambda g: g["median_us"])
        rows.append((name, eager, comp, sdpa_us, best, doc))
        print(f"{name}: eager {eager:.2f} µs, compile {comp if comp is None else round(comp, 2)} µs, "
              f"mucc {best['median_us'] if best else None} µs ({time.time() - t0:.0f} s)",
              file=sys.stderr, flush=True)

    lines = [
        f"GPU: {gpu}; torch {torch.__version__}; CUDA-graph replays, inputs rotated past 2x L2, "
        f"median of {args.iters} samples of >= 10 executions; µs per execution.",
        "",
        "Best torch = the fastest of eager, torch.compile and (attention workloads) "
        "scaled_dot_product_attention.",
        "",
        "| workload | torch eager | torch.compile | SDPA | mucc best (graph) | candidates ok | floor | "
        "mucc / best torch | mucc / floor |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    ratios = []
    for name, eager, comp, sdpa_us, best, doc in rows:
        torch_best = min(x for x in (eager, comp, sdpa_us) if x is not None)
        if best:
            r = best["median_us"] / torch_best
            ratios.append(r)
            n_ok = sum(1 for g in doc["graphs"] if g.get("ok"))
            cells = [f"{best['median_us']:.2f} (g{best['graph']})", f"{n_ok}/{len(doc['graphs'])}",
                     f"{best['floor_us']:.2f}", f"{r:.2f}", f"{best['ratio_to_floor']:.2f}"]
        else:
            cells = ["failed", "0", "—", "—", "—"]
        comp_s = f"{comp:.2f}" if comp is not None else "—"
        sdpa_s = f"{sdpa_us:.2f}" if sdpa_us is not None else "—"
        lines.append(f"| {name} | {eager:.2f} | {comp_s} | {sdpa_s} | " + " | ".join(cells) + " |")
    if ratios:
        geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        lines.append("")
        lines.append(f"Geometric mean of mucc / best torch over {len(ratios)} workloads: {geo:.2f}")
    if args.save_torch:
        with open(args.save_torch, "w") as f:
            json.dump(saved, f, indent=1)
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(os.path.join(args.out, "bench_vs_torch.md"), "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
