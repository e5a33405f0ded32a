#!/usr/bin/env python3
"""One Markdown table from a folder of `mucc tune --json` documents: per graph, the default
variant's time and every other variant's time relative to it (same run, same GPU).

    python3 scripts/gpu/tune_summary.py DIR
"""
import glob
import json
import os
import sys


def label(v):
    s = "ampere" if v["path"] == "ampere" else (
        f"split={'on' if v['cluster_split'] else 'off'} pdl={'on' if v['dependent_launch'] else 'off'}")
    if v.get("warps"):
        s += f" w{v['warps']}"
    return s


def main():
    rows, cols = [], []
    for p in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
        try:
            doc = json.load(open(p))
        except (OSError, json.JSONDecodeError):
            rows.append((os.path.basename(p), None, {}, None, "no JSON"))
            continue
        for g in doc.get("graphs", []):
            if "results" not in g:
                rows.append((os.path.basename(p), None, {}, None, g.get("error", "?")[:80]))
                continue
            times = {}
            for r in g["results"]:
                name = label(r["variant"])
                if name not in cols:
                    cols.append(name)
                times[name] = r.get("us")
            rows.append((f"{os.path.basename(p)[:-5]}", g.get("default_us"), times,
                         g.get("floor_us"), label(g["best"]) if g.get("best") else "—"))
    print("| graph | default µs | floor µs | " + " | ".join(cols) + " | best |")
    print("|---|---|---|" + "---|" * len(cols) + "---|")
    for name, d, times, floor, best in rows:
        cells = []
        for c in cols:
            t = times.get(c)
            cells.append("—" if t is None or not d else f"{t / d:.2f}")
        ds = f"{d:.2f}" if d else "—"
        fs = f"{floor:.2f}" if floor else "—"
        print(f"| {name} | {ds} | {fs} | " + " | ".join(cells) + f" | {best} |")


if __name__ == "__main__":
    main()
