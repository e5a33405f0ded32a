#!/usr/bin/env python3
"""Runs generated code built by nvcc on a GPU and compares it with mucc's f64 interpreter: the
second half of scripts/gpu/check_graphs.sh, which calls it (not meant to be run by hand).

For each graph prepared in WORK by check_graphs.sh (NAME.cu, NAME.plan.json, and NAME/ holding
the inputs and reference outputs written by `mucc eval --dump`), this script builds a shared
library with nvcc (sm_90a; MUCC_NVCC_FLAGS adds flags), allocates the buffers the launch plan
describes with PyTorch, poisons the outputs, calls `mucc_execute` through ctypes on PyTorch's
current stream, and compares every output with the reference: relative error
||out - ref|| / ||ref||, max absolute error, and no NaN or unwritten element.

    python3 scripts/gpu/check_kernel_level.py WORK runtime-headers            # every graph
    python3 scripts/gpu/check_kernel_level.py --one WORK NAME runtime-headers  # one, in process
"""
import ctypes
import json
import os
import subprocess
import sys

import numpy as np
import torch

DTYPES = {
    "f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "f64": torch.float64,
    "i8": torch.int8, "u8": torch.uint8, "i16": torch.int16, "i32": torch.int32, "i64": torch.int64,
}
# Relative-error bounds per output dtype (16-bit results round at every kernel).
BOUNDS = {"f16": 5e-3, "bf16": 3e-2, "f32": 1e-5, "f64": 1e-12}


def build(cu, so, headers):
    cmd = ["nvcc", "-shared", "-Xcompiler", "-fPIC", "-std=c++17", "-O3", "-lineinfo", "-I", headers,
           "-gencode=arch=compute_90a,code=sm_90a", "-o", so, cu, "-lcublas"]
    cmd[1:1] = os.environ.get("MUCC_NVCC_FLAGS", "").split()
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def check(work, name, headers):
    cu, plan_path, data = (os.path.join(work, name + s) for s in (".cu", ".plan.json", ""))
    so = os.path.join(work, name + ".so")
    if not os.path.exists(so):
        build(cu, so, headers)
    plan = json.load(open(plan_path))
    manifest = json.load(open(os.path.join(data, "manifest.json")))
    dev = torch.device("cuda")
    inputs = []
    for spec, info in zip(plan["inputs"], manifest["inputs"]):
        raw = np.fromfile(os.path.join(data, info["file"]), dtype=np.float64)
        t = torch.from_numpy(raw)
        dt = DTYPES[spec["dtype"]]
        if not dt.is_floating_point:
            t = torch.nan_to_num(t, nan=0.0)
        inputs.append(t.to(dt).to(dev))
    outputs = []
    for spec in plan["outputs"]:
        dt = DTYPES[spec["dtype"]]
        fill = float("nan") if dt.is_floating_point else -123
        outputs.append(torch.full((spec["alloc_elems"],), fill, dtype=dt, device=dev))
    ws = torch.empty(max(plan["workspace_bytes"], 1), dtype=torch.uint8, device=dev)
    lib = ctypes.CDLL(so)
    fn = lib.mucc_execute
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_void_p]
    ins = (ctypes.c_void_p * max(len(inputs), 1))(*[t.data_ptr() for t in inputs])
    outs = (ctypes.c_void_p * max(len(outputs), 1))(*[t.data_ptr() for t in outputs])
    stream = torch.cuda.current_stream()
    rc = fn(ins, outs, ctypes.c_void_p(ws.data_ptr()), ctypes.c_void_p(stream.cuda_stream))
    torch.cuda.synchronize()
    rows = []
    ok = rc == 0
    if rc != 0:
        rows.append((name, "-", f"mucc_execute returned {rc}", "", "FAIL"))
        return ok, rows
    for j, (spec, info) in enumerate(zip(plan["outputs"], manifest["outputs"])):
        ref = np.fromfile(os.path.join(data, info["file"]), dtype=np.float64).reshape(spec["shape"])
        out = torch.as_strided(outputs[j], spec["shape"], spec["strides"]).double().cpu().numpy()
        bad = int(np.sum(~np.isfinite(out))) if spec["dtype"] in BOUNDS else int(np.sum(out == -123))
        diff = np.linalg.norm((out - ref).ravel())
        rel = diff / max(np.linalg.norm(ref.ravel()), 1e-300)
        mx = float(np.max(np.abs(out - ref))) if out.size else 0.0
        bound = BOUNDS.get(spec["dtype"], 0.0)
        good = bad == 0 and rel <= bound
        ok &= good
        rows.append((name, f"out{j} {spec['dtype']} {spec['shape']}", f"{rel:.2e}", f"{mx:.2e}",
                     "ok" if good else f"FAIL (bound {bound:g}, {bad} non-finite/unwritten)"))
    return ok, rows


def worker(work, headers, names):
    """Checks `names` in order, one JSON line each; stops at the first CUDA fault (the context is
    unusable after one), so the parent can go on in a fresh process."""
    for name in names:
        try:
            ok, rows = check(work, name, headers)
            print(json.dumps({"name": name, "ok": bool(ok), "rows": rows}), flush=True)
        except Exception as e:  # report and stop: a CUDA error is sticky
            msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            print(json.dumps({"name": name, "ok": False, "rows": [(name, "-", "error", "", msg)]}), flush=True)
            sys.exit(3)


def main():
    # `--one WORK NAME HEADERS`: check one graph in this process (for compute-sanitizer).
    if sys.argv[1] == "--one":
        ok, rows = check(sys.argv[2], sys.argv[3], sys.argv[4])
        print(json.dumps({"ok": bool(ok), "rows": rows}))
        return
    if sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], sys.argv[4:])
        return
    work, headers = sys.argv[1], sys.argv[2]
    names = sorted(n[:-3] for n in os.listdir(work) if n.endswith(".cu"))
    print(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    # Build every library first, in parallel (nvcc is single-threaded).
    from concurrent.futures import ThreadPoolExecutor
    import time

    def build_one(name):
        so = os.path.join(work, name + ".so")
        if os.path.exists(so):
            return name, None
        try:
            build(os.path.join(work, name + ".cu"), so, headers)
            return name, None
        except subprocess.CalledProcessError as e:
            return name, (e.stderr or "")[-400:]

    t0 = time.time()
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 4) as pool:
        build_errors = {n: e for n, e in pool.map(build_one, names) if e}
    print(f"built {len(names)} libraries in {time.time() - t0:.0f} s")
    print(f"{'graph':<32} {'output':<34} {'rel err':>9} {'max abs':>9}  status")
    results = {n: (False, [(n, "-", "nvcc failed", "", e.replace("\n", " | "))]) for n, e in build_errors.items()}
    todo = [n for n in names if n not in build_errors]
    while todo:
        p = subprocess.run([sys.executable, __file__, "--worker", work, headers] + todo,
                           capture_output=True, text=True)
        done = set()
        for line in p.stdout.splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue
            results[r["name"]] = (r["ok"], r["rows"])
            done.add(r["name"])
        rest = [n for n in todo if n not in done]
        if rest and p.returncode == 0:
            break
        if rest and rest[0] not in done and p.returncode not in (0, 3):
            # The worker died inside this graph without reporting it.
            tail = (p.stderr or "").strip().splitlines()[-1:] or ["(no output)"]
            results[rest[0]] = (False, [(rest[0], "-", "crashed", "", tail[0][:200])])
            rest = rest[1:]
        todo = rest
    failures = 0
    for name in names:
        ok, rows = results.get(name, (False, [(name, "-", "not run", "", "")]))
        failures += not ok
        for r in rows:
            print(f"{r[0]:<32} {r[1]:<34} {r[2]:>9} {r[3]:>9}  {r[4]}")
    print(f"{len(names) - failures} passed, {failures} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
