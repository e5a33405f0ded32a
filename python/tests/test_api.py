"""The Python package without a GPU: loading, inspecting, validating, errors, the
Mirage-style builder (reproducing corpus graphs exactly), transpiling, and the interpreter."""

import json

import numpy as np
import pytest

import mucc
from mirage_scripts import gated_mlp_mirage_script, lora_mirage_script, rmsnorm_mirage_script


def test_load_lora_prints_a_summary(corpus):
    graphs = mucc.load(corpus / "lora.json")
    assert len(graphs) == 4
    g = graphs[0]
    assert str(g).endswith(
        "inputs [16, 256] f16, [256, 4096] f16, [256, 16] f16, [16, 4096] f16; "
        "outputs [16, 4096] f16; 1 kernel: customized[grid (64, 1, 1), forloop 1, 10 ops]")
    assert g.index == 0 and g.file.endswith("lora.json")
    assert "validation: ok" in g.inspect()
    g.validate()


def test_missing_file_is_a_located_graph_error(tmp_path):
    with pytest.raises(mucc.GraphError, match="nope.json"):
        mucc.load(tmp_path / "nope.json")


def test_malformed_json_names_the_json_path(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('[[{"op_type": "kn_input_op", "input_tensors": [], "output_tensors": 7}]]')
    with pytest.raises(mucc.GraphError) as e:
        mucc.load(bad)
    assert "bad.json" in str(e.value) and "output_tensors" in str(e.value)


def test_invalid_graph_validate_lists_errors():
    g = mucc.new_kernel_graph()
    g.new_input(dims=(4, 8), dtype=mucc.float16)  # no output marked
    with pytest.raises(mucc.GraphError, match="invalid"):
        g.validate()


def test_builder_rejects_bad_shapes_with_graph_error():
    g = mucc.new_kernel_graph()
    x = g.new_input(dims=(8, 64), dtype=mucc.float16)
    w = g.new_input(dims=(32, 16), dtype=mucc.float16)
    with pytest.raises(mucc.GraphError, match="matmul"):
        g.matmul(x, w)
    with pytest.raises(mucc.GraphError, match="normalized_shape"):
        g.rms_norm(x, normalized_shape=(32,))
    tb = mucc.new_threadblock_graph(grid_dim=(3, 1, 1), block_dim=(128, 1, 1), forloop_range=4,
                                    reduction_dimx=64)
    with pytest.raises(mucc.GraphError):
        tb.new_input(dtensor=x, input_map=(1, -1, -1), forloop_dim=0)  # 64 / 3
    with pytest.raises(mucc.GraphError, match="3 values"):
        mucc.new_threadblock_graph((1, 1), (128, 1, 1), 1, 64)


def _round_trip(g):
    """The graph's Mirage JSON with tensor guids renumbered by first appearance (a file's guids
    are arbitrary identifiers; everything else must be equal)."""
    ids = {}

    def norm(v):
        if isinstance(v, dict):
            return {k: (ids.setdefault(x, len(ids)) if k == "guid" else norm(x))
                    for k, x in v.items()}
        if isinstance(v, list):
            return [norm(x) for x in v]
        return v

    return norm(json.loads(g.to_json()))


@pytest.mark.parametrize("script,file", [(gated_mlp_mirage_script, "gated_mlp.json"),
                                         (rmsnorm_mirage_script, "rmsnorm_bs1.json"),
                                         (lora_mirage_script, "lora.json")])
def test_mirage_script_reproduces_the_corpus_graph(corpus, script, file):
    built = script(mucc)
    built.validate()
    assert _round_trip(built) == _round_trip(mucc.load(corpus / file)[0])


def test_reference_graphs_of_the_benchmark_scripts_build():
    mi = mucc
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(8, 4096), dtype=mi.float16)
    W1 = g.new_input(dims=(4096, 4096), dtype=mi.float16)
    W2 = g.new_input(dims=(4096, 4096), dtype=mi.float16)
    O = g.mul(g.silu(g.matmul(X, W1)), g.matmul(X, W2))
    g.mark_output(O)
    g.validate()
    assert O.shape == (8, 4096) and O.dtype == mi.float16 and O.num_dims == 2 and O.dim(1) == 4096
    r = mi.new_kernel_graph()
    X = r.new_input(dims=(2, 4096), dtype=mi.float16)
    W = r.new_input(dims=(4096, 6144), dtype=mi.float16)
    r.mark_output(r.matmul(r.rms_norm(X, normalized_shape=(4096,)), W))
    r.validate()


def test_customized_inputs_must_match_the_tb_inputs():
    g = mucc.new_kernel_graph()
    X = g.new_input(dims=(8, 64), dtype=mucc.float16)
    W = g.new_input(dims=(64, 64), dtype=mucc.float16)
    tb = mucc.new_threadblock_graph((1, 1, 1), (128, 1, 1), 1, 64)
    tX = tb.new_input(X, (-1, -1, -1), -1)
    tW = tb.new_input(W, (-1, -1, -1), -1)
    tb.new_output(tb.forloop_accum(tb.matmul(tX, tW)), (-1, -1, -1))
    with pytest.raises(mucc.GraphError, match="in order"):
        g.customized([W, X], tb)
    (O,) = g.customized([X, W], tb)
    with pytest.raises(mucc.GraphError, match="already used"):
        g.customized([X, W], tb)
    g.mark_output(O)
    g.validate()


def test_unsupported_builder_features_raise():
    g = mucc.new_kernel_graph()
    X = g.new_input(dims=(8, 64), dtype=mucc.float16)
    tb = mucc.new_threadblock_graph((1, 1, 1), (128, 1, 1), 2, 64)
    with pytest.raises(mucc.GraphError, match="store_in_dmem"):
        tb.new_input(X, (-1, -1, -1), 1, store_in_dmem=True)
    tX = tb.new_input(X, (-1, -1, -1), 1)
    with pytest.raises(mucc.GraphError, match="every iteration"):
        tb.new_output(tX, (-1, -1, -1), forloop_dim=1)
    with pytest.raises(ValueError, match="acc"):
        tb.forloop_accum(tX, "max")


def test_transpile_and_explain_a_built_graph():
    g = lora_mirage_script(mucc)
    src = g.transpile("sm_80")
    assert "__global__" in src and "sm_80" in src
    assert "kernel" in g.explain("sm_90a").lower()
    with pytest.raises(ValueError, match="arch"):
        g.transpile("sm_70")


def test_the_cta_shape_is_an_option():
    g = lora_mirage_script(mucc)
    # tune=False: a tuning cache on this machine must not change the plan under test.
    assert "CTA: 8 warps (asked for" in g.explain("sm_80", tune=False, warps=8)
    assert "CTA: 4 warps (the µGraph's block_dim" in g.explain("sm_80", tune=False, warps="graph")
    assert "__launch_bounds__(512" in g.transpile("sm_80", tune=False, warps="16")
    with pytest.raises(ValueError, match="warps: unknown warp count `33`"):
        g.explain("sm_80", warps=33)
    with pytest.raises(ValueError, match="warps: unknown warp count `many`"):
        g.transpile("sm_80", warps="many")


def test_eval_matches_numpy_for_the_gated_mlp():
    mi = mucc
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(8, 64), dtype=mi.float16)
    W1 = g.new_input(dims=(64, 32), dtype=mi.float16)
    W2 = g.new_input(dims=(64, 32), dtype=mi.float16)
    tb = mi.new_threadblock_graph((2, 1, 1), (128, 1, 1), 4, 64)
    tX = tb.new_input(X, (-1, -1, -1), 1)
    t1 = tb.new_input(W1, (1, -1, -1), 0)
    t2 = tb.new_input(W2, (1, -1, -1), 0)
    a1 = tb.forloop_accum(tb.matmul(tX, t1))
    a2 = tb.forloop_accum(tb.matmul(tX, t2))
    tb.new_output(tb.mul(tb.silu(a1), a2), (1, -1, -1))
    g.mark_output(g.customized([X, W1, W2], tb)[0])
    rng = np.random.default_rng(0)
    x, w1, w2 = rng.standard_normal((8, 64)), rng.standard_normal((64, 32)), rng.standard_normal((64, 32))
    (got,) = g.eval([x, w1, w2])
    h = x @ w1
    want = h / (1 + np.exp(-h)) * (x @ w2)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="shape"):
        g.eval([x.T, w1, w2])


def test_eval_of_a_loaded_corpus_graph_matches_numpy(corpus):
    g = mucc.load(corpus / "lora.json")[0]
    rng = np.random.default_rng(1)
    x, w, a, b = (rng.standard_normal(s) for s in [(16, 256), (256, 4096), (256, 16), (16, 4096)])
    (got,) = g.eval([x, w, a, b])
    np.testing.assert_allclose(got, x @ w + (x @ a) @ b, rtol=1e-9, atol=1e-9)


def test_dtypes_compare_like_mirages():
    assert mucc.float16 == mucc.dtype("fp16") and str(mucc.bfloat16) == "bf16"
    assert mucc.float16 != mucc.bfloat16
    with pytest.raises(ValueError):
        mucc.dtype("fp7")


def test_superoptimize_without_a_checkpoint_explains_that_mucc_does_not_search():
    g = lora_mirage_script(mucc)
    with pytest.raises(mucc.MuccError, match="does not search"):
        g.superoptimize(config="lora")


def test_compile_of_a_non_graph_is_a_type_error():
    with pytest.raises(TypeError, match="mucc.Graph"):
        mucc.compile("lora.json")
