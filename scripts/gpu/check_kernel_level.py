#!/usr/bin/env python3
"""Runs generated kernel-level code on a GPU and compares it with mucc's f64 interpreter.

For each graph directory prepared by scripts/gpu/check_kernel_level.sh (NAME.cu, NAME.plan.json,
and NAME/ holding the inputs and reference outputs written by `mucc eval --dump`), this script
builds a shared library with nvcc, allocates the buffers the launch plan describes with PyTorch,
poisons the outputs, calls `mucc_execute` through ctypes on PyTorch's current stream, and compares
every output with the reference: relative error ||out - ref|| / ||ref||, max absolute error, and
no NaN or unwritten element.
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
    cmd = ["nvcc", "-shared", "-Xcompiler", "-fPIC", "-std=c++17", "-O3", "-I", headers,
           "-gencode=arch=compute_90a,code=sm_90a", "-o", so, cu, "-lcublas"]
    subprocess.run(cmd, check=True)


def check(work, name, headers):
    cu, plan_path, data = (os.path.join(work, name + s) for s in (".cu", ".plan.json", ""))
    so = os.path.join(work, name + ".so")
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


def main():
    work, headers = sys.argv[1], sys.argv[2]
    names = sorted(n[:-3] for n in os.listdir(work) if n.endswith(".cu"))
    print(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(f"{'graph':<32} {'output':<34} {'rel err':>9} {'max abs':>9}  status")
    failures = 0
    for name in names:
        try:
            ok, rows = check(work, name, headers)
        except Exception as e:  # report and go on
            ok, rows = False, [(name, "-", "error", "", str(e)[:200])]
        failures += not ok
        for r in rows:
            print(f"{r[0]:<32} {r[1]:<34} {r[2]:>9} {r[3]:>9}  {r[4]}")
    print(f"{len(names) - failures} passed, {failures} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
