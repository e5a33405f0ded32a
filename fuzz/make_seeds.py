#!/usr/bin/env python3
"""Builds the fuzz seed corpus for the `load` target.

Writes into fuzz/corpus/load/ (git-ignored):
  - every file of the shared Mirage benchmark corpus under 100 KB, as is;
  - every candidate graph of every corpus file (all sizes) as a one-candidate list, compact JSON;
  - the shrunken graphs below (also copied to fuzz/seeds/, which is committed).
Usage: python3 fuzz/make_seeds.py [CORPUS_DIR]  (default /work/shared/corpus/mirage-benchmarks)
"""
import json, os, sys, glob, shutil

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = sys.argv[1] if len(sys.argv) > 1 else "/work/shared/corpus/mirage-benchmarks"
OUT = os.path.join(HERE, "corpus", "load")
SEEDS = os.path.join(HERE, "seeds")

def compact(v):
    return json.dumps(v, separators=(",", ":"))

def shrink(graph, dims, grid=None, forloop=None, rdx=None):
    """Maps every extent (dim lists, strides) through `dims`, grid extents through `grid`,
    forloop ranges through `forloop`, reduction_dimx through `rdx` (dicts; unlisted = kept)."""
    grid, forloop, rdx = grid or {}, forloop or {}, rdx or {}
    def walk(v):
        if isinstance(v, dict):
            out = {}
            for k, x in v.items():
                if k in ("dim", "input_strides", "output_strides") and isinstance(x, list):
                    out[k] = [dims.get(e, e) for e in x]
                elif k == "grid_dim":
                    out[k] = {a: grid.get(e, e) for a, e in x.items()}
                elif k == "forloop_range":
                    out[k] = forloop.get(x, x)
                elif k == "reduction_dimx":
                    out[k] = rdx.get(x, x)
                else:
                    out[k] = walk(x)
            return out
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v
    return walk(graph)

def load(name):
    with open(os.path.join(SRC, name)) as f:
        return json.load(f)

def main():
    os.makedirs(OUT, exist_ok=True)
    os.makedirs(SEEDS, exist_ok=True)
    n = 0
    for path in sorted(glob.glob(os.path.join(SRC, "*.json"))):
        base = os.path.basename(path)[:-5]
        if os.path.getsize(path) < 100_000:
            shutil.copy(path, os.path.join(OUT, base + ".json")); n += 1
        doc = json.load(open(path))
        cands = doc["generated_graphs"] if isinstance(doc, dict) else doc
        for i, g in enumerate(cands):
            with open(os.path.join(OUT, f"{base}.g{i}.json"), "w") as f:
                f.write(compact([g])); n += 1
    tiny = {
        # X 2x8, W 8x16, A 8x2, B 2x16; grid 4 (tile 4), forloop 1.
        "tiny_lora": shrink(load("single_lora.json"), {16: 2, 256: 8, 4096: 16, 64: 4},
                            grid={64: 4}, rdx={64: 4}),
        # X 8x8, W1/W2 8x8; forloop 2 over K (tile 4), grid 2 over N (tile 4).
        "tiny_gated_mlp": shrink(load("single_gated_mlp.json"), {4096: 8, 64: 4, 32: 4},
                                 grid={128: 2}, forloop={64: 2}, rdx={64: 4}),
        # X 2x8, W 8x12; forloop 2 (tile 4), grid 4 (tile 3).
        "tiny_rmsnorm": shrink([load("rmsnorm_bs1.json")[0]], {4096: 8, 128: 4, 6144: 12, 24: 3},
                               grid={256: 4}, forloop={32: 2}, rdx={64: 4}),
        # 3 inputs 8x16, grid 8 over rows.
        "tiny_ntrans": shrink([load("ntrans_bs1.json")[0]], {4096: 16}, rdx={64: 4}),
    }
    for name, g in tiny.items():
        text = compact(g)
        for d in (OUT, SEEDS):
            with open(os.path.join(d, name + ".json"), "w") as f:
                f.write(text)
        n += 1
    # A kernel-only graph in current Mirage spelling (940 = fp16 in the current table).
    t = lambda guid, dims: {"data_type": 940, "dim": dims + [0] * (4 - len(dims)), "guid": guid,
                            "layout": "DmemRowMajor", "num_dims": len(dims)}
    nomap = {"x": -1, "y": -1, "z": -1}
    kn = [[
        {"op_type": "kn_input_op", "input_map": nomap, "input_strides": [8, 1], "input_tensors": [],
         "output_tensors": [t(1, [4, 8])]},
        {"op_type": "kn_input_op", "input_map": nomap, "input_strides": [1, 8], "input_tensors": [],
         "output_tensors": [t(2, [8, 4])]},
        {"op_type": "kn_matmul_op", "input_tensors": [t(1, [4, 8]), t(2, [8, 4])],
         "output_tensors": [t(3, [4, 4])]},
        {"op_type": "kn_exp_op", "input_tensors": [t(3, [4, 4])], "output_tensors": [t(4, [4, 4])]},
        {"op_type": "kn_reduction_1_op", "input_tensors": [t(4, [4, 4])], "output_tensors": [t(5, [4, 1])]},
        {"op_type": "kn_div_op", "input_tensors": [t(4, [4, 4]), t(5, [4, 1])], "output_tensors": [t(6, [4, 4])]},
        {"op_type": "kn_output_op", "input_tensors": [t(6, [4, 4])], "output_map": nomap,
         "output_strides": [4, 1], "output_tensors": []},
    ]]
    for d in (OUT, SEEDS):
        with open(os.path.join(d, "tiny_kernel_only.json"), "w") as f:
            f.write(compact(kn))
    n += 1
    print(f"{n} files in {OUT}")

main()
