#!/usr/bin/env python3
"""The builder-made decode graphs ((silu(X) * Y) @ W, `cargo run --release --example
decode_graphs -- DIR`): mucc with `--path ampere` and with the default path next to PyTorch
eager and torch.compile, timed the same way (scripts/bench_vs_torch.py's method), in one run.

    python3 scripts/gpu/decode_vs_torch.py --decode carry/decode --bench ampere=OUT/a auto=OUT/b

where each LABEL=DIR pair (any number of them) names a folder of NAME.bench.json files that
`mucc bench carry/decode/NAME.json --check [--path ampere] --json-out DIR/NAME.bench.json` wrote
in the same run, e.g.

    for f in carry/decode/*.json; do n=$(basename $f .json)
      carry/mucc bench $f --check --path ampere --json-out OUT/a/$n.bench.json
      carry/mucc bench $f --check --json-out OUT/b/$n.bench.json; done

Needs PyTorch; prints a Markdown table (µs, ratios to the best PyTorch and to the floor).
"""

import argparse
import json
import math
import os
import re
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_vs_torch import time_graph  # noqa: E402


def gated_linear(x, y, w):
    return (torch.nn.functional.silu(x) * y) @ w


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--decode", default="carry/decode")
    ap.add_argument("--bench", nargs="+", default=[], help="LABEL=DIR of mucc bench JSON files")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    benches = [b.split("=", 1) for b in args.bench]
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    gpu = torch.cuda.get_device_name(0)
    names = sorted(f[:-5] for f in os.listdir(args.decode) if f.endswith(".json"))
    head = "| graph | torch eager | torch.compile | " + " | ".join(
        f"mucc {label}" for label, _ in benches) + " | floor | " + " | ".join(
        f"{label} / best torch | {label} / floor" for label, _ in benches) + " |"
    lines = [f"GPU: {gpu}; torch {torch.__version__}; µs per execution (CUDA-graph replays, "
             f"inputs rotated past 2x L2, median of {args.iters}).", "", head,
             "|" + "---|" * (head.count("|") - 1)]
    ratios = {label: [] for label, _ in benches}
    for name in names:
        m = re.match(r"decode_m(\d+)_(bf16|f16)_(\d+)x(\d+)$", name)
        if not m:
            continue
        rows, dt, k, n = int(m[1]), m[2], int(m[3]), int(m[4])
        dtype = torch.bfloat16 if dt == "bf16" else torch.float16
        shapes = [(rows, k), (rows, k), (k, n)]
        eager, _, _ = time_graph(gated_linear, shapes, args.iters, args.warmup, dtype=dtype)
        torch._dynamo.reset()
        comp, _, _ = time_graph(torch.compile(gated_linear, dynamic=False), shapes, args.iters,
                                args.warmup, dtype=dtype)
        best_torch = min(eager, comp)
        cells, tail, floor = [], [], None
        for label, d in benches:
            try:
                with open(os.path.join(d, f"{name}.bench.json")) as f:
                    doc = json.load(f)
                g = [g for g in doc["graphs"] if g.get("ok")][0]
                floor = g["floor_us"]
                cells.append(f"{g['median_us']:.2f}")
                r = g["median_us"] / best_torch
                ratios[label].append(r)
                tail += [f"{r:.2f}", f"{g['ratio_to_floor']:.2f}"]
            except (OSError, IndexError, KeyError, json.JSONDecodeError) as e:
                cells.append(f"failed ({type(e).__name__})")
                tail += ["—", "—"]
        fl = f"{floor:.2f}" if floor else "—"
        lines.append(f"| {name} | {eager:.2f} | {comp:.2f} | " + " | ".join(cells) + f" | {fl} | "
                     + " | ".join(tail) + " |")
        print(f"{name}: eager {eager:.2f} compile {comp:.2f}", file=sys.stderr, flush=True)
    lines.append("")
    for label, rs in ratios.items():
        if rs:
            geo = math.exp(sum(math.log(r) for r in rs) / len(rs))
            lines.append(f"Geometric mean of mucc {label} / best torch over {len(rs)} graphs: {geo:.2f}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
