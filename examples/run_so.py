#!/usr/bin/env python3
"""Load a library made by `mucc build` and run it from Python (ctypes + PyTorch for memory).

    mucc build ../shared/corpus/mirage-benchmarks/single_gated_mlp.json --graph 0 -o libmlp.so
    python3 examples/run_so.py ./libmlp.so f16:8x4096 f16:4096x4096 f16:4096x4096 -- f16:8x4096

Each tensor is DTYPE:DIMS as the header beside the library lists them (inputs, `--`, outputs);
this example assumes dense row-major buffers (the header says when a buffer is padded or strided:
allocate its "buffer of N elements" then). Inputs are random; the script prints each output's
shape and a checksum. Needs a CUDA GPU and PyTorch.
"""
import ctypes
import sys

import torch

DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32,
          "f64": torch.float64, "i32": torch.int32, "i64": torch.int64}


def parse(spec):
    dtype, dims = spec.split(":")
    return DTYPES[dtype], [int(d) for d in dims.split("x")]


def main():
    if len(sys.argv) < 3 or "--" not in sys.argv:
        sys.exit(__doc__)
    lib = ctypes.CDLL(sys.argv[1])
    sep = sys.argv.index("--")
    ins = [parse(s) for s in sys.argv[2:sep]]
    outs = [parse(s) for s in sys.argv[sep + 1:]]
    torch.manual_seed(0)
    inputs = [(torch.rand(d, device="cuda") - 0.5).to(t) if t.is_floating_point
              else torch.randint(-8, 8, d, device="cuda", dtype=t) for t, d in ins]
    outputs = [torch.full(d, float("nan"), device="cuda").to(t) for t, d in outs]
    # The header's MUCC_WORKSPACE_BYTES; a generous default keeps the example self-contained.
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    in_ptrs = (ctypes.c_void_p * len(inputs))(*[x.data_ptr() for x in inputs])
    out_ptrs = (ctypes.c_void_p * len(outputs))(*[x.data_ptr() for x in outputs])
    lib.mucc_execute.restype = ctypes.c_int
    lib.mucc_execute.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    stream = torch.cuda.current_stream().cuda_stream
    rc = lib.mucc_execute(in_ptrs, out_ptrs, ctypes.c_void_p(workspace.data_ptr()), ctypes.c_void_p(stream))
    torch.cuda.synchronize()
    if rc != 0:
        sys.exit(f"mucc_execute returned {rc}")
    for j, o in enumerate(outputs):
        f = o.double()
        print(f"output {j}: {list(o.shape)} {o.dtype}, finite {bool(torch.isfinite(f).all())}, sum {f.sum().item():.6e}")


if __name__ == "__main__":
    main()
