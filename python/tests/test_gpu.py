"""The Python package on a GPU (skipped without CUDA and torch): compile and call on torch
tensors, streams, CUDA-graph capture, out=, errors, best() and superoptimize() against PyTorch.

Runs under pytest, or standalone (`python python/tests/test_gpu.py`, for machines without
pytest), printing "N passed, N failed"."""

import os
import pathlib
import sys

import mucc

try:
    import torch

    HAVE_GPU = torch.cuda.is_available()
except ImportError:  # pragma: no cover - CPU-only machines
    torch = None
    HAVE_GPU = False

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORPUS = pathlib.Path(os.environ.get("MUCC_CORPUS", ROOT.parent / "shared" / "corpus" / "mirage-benchmarks"))
sys.path.insert(0, str(pathlib.Path(__file__).parent))
from mirage_scripts import gated_mlp_mirage_script, lora_mirage_script, rmsnorm_mirage_script  # noqa: E402

try:
    import pytest

    pytestmark = pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA GPU and torch")
    raises = pytest.raises
except ImportError:  # standalone
    import contextlib

    @contextlib.contextmanager
    def raises(exc, match=None):
        try:
            yield
        except exc as e:
            if match is not None and match not in str(e):
                raise AssertionError(f"{exc.__name__} raised without {match!r}: {e}") from e
        else:
            raise AssertionError(f"{exc.__name__} not raised")


def rel_err(got, want):
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def small_gated(mi=mucc, dtype=None, m=8):
    """(silu(X) * Y) @ W with X, Y (m, 256), W (256, 128): one customized operator."""
    dtype = dtype or mi.bfloat16
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(m, 256), dtype=dtype)
    Y = g.new_input(dims=(m, 256), dtype=dtype)
    W = g.new_input(dims=(256, 128), dtype=dtype)
    tb = mi.new_threadblock_graph((4, 1, 1), (128, 1, 1), 4, 64)
    tX = tb.new_input(X, (-1, -1, -1), 1)
    tY = tb.new_input(Y, (-1, -1, -1), 1)
    tW = tb.new_input(W, (1, -1, -1), 0)
    tb.new_output(tb.forloop_accum(tb.matmul(tb.mul(tb.silu(tX), tY), tW)), (1, -1, -1))
    g.mark_output(g.customized([X, Y, W], tb)[0])
    return g


def torch_gated(x, y, w):
    return (torch.nn.functional.silu(x.float()) * y.float()) @ w.float()


def inputs(dtype=None, scale=0.5):
    dtype = dtype or torch.bfloat16
    torch.manual_seed(0)
    return [torch.randn(s, device="cuda", dtype=dtype) * scale for s in [(8, 256), (8, 256), (256, 128)]]


def test_compile_and_call_matches_torch():
    k = mucc.compile(small_gated())
    x, y, w = inputs()
    (o,) = k(x, y, w)
    assert o.shape == (8, 128) and o.dtype == torch.bfloat16 and o.is_cuda
    assert rel_err(o, torch_gated(x, y, w)) < 1e-2
    assert "mucc.Kernel" in repr(k) and k.arch in ("sm_80", "sm_90a")


def test_fp16_and_out_argument():
    k = mucc.compile(small_gated(dtype=mucc.float16))
    x, y, w = inputs(torch.float16)
    out = torch.full((8, 128), float("nan"), device="cuda", dtype=torch.float16)
    (o,) = k(x, y, w, out=[out])
    assert o is out
    assert rel_err(out, torch_gated(x, y, w)) < 5e-3


def test_shape_dtype_stride_device_alignment_errors():
    k = mucc.compile(small_gated())
    x, y, w = inputs()
    with raises(ValueError, match="shape"):
        k(x[:4], y, w)
    with raises(TypeError, match="dtype"):
        k(x.half(), y, w)
    with raises(ValueError, match="strides"):
        k(x, y, w.t().contiguous().t())
    with raises(ValueError, match="aligned"):
        buf = torch.randn(8 * 256 + 1, device="cuda", dtype=torch.bfloat16)
        k(buf[1:].view(8, 256), y, w)
    with raises(ValueError, match="inputs"):
        k(x, y)
    with raises(ValueError, match="CUDA"):
        k(x.cpu(), y, w)


def test_arguments_off_the_fast_path():
    # Each call compares its arguments with precomputed facts; whatever differs goes through
    # the full check, which accepts what is equivalent and rejects the rest by name.
    k = mucc.compile(small_gated())
    x, y, w = inputs()
    want = torch_gated(x, y, w)
    # A size-1 dim's stride is never stepped over: an expanded row is accepted.
    row = torch.randn(1, 256, device="cuda", dtype=torch.bfloat16)
    one = mucc.compile(small_gated(m=1))
    narrow = torch.empty_strided((1, 256), (1, 1), device="cuda", dtype=torch.bfloat16)
    narrow.copy_(row)
    (o1,) = one(narrow, row, w)
    (o2,) = one(row, row, w)
    assert torch.equal(o1, o2)
    # Parameters (a tensor subclass) and objects exporting __dlpack__ are inputs too.
    (o,) = k(torch.nn.Parameter(x, requires_grad=False), y, w)
    assert rel_err(o, want) < 1e-2

    class Exported:
        def __init__(self, t):
            self.t = t

        def __dlpack__(self, **kw):
            return self.t.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.t.__dlpack_device__()

    (o,) = k(Exported(x), y, w)
    assert rel_err(o, want) < 1e-2
    # out= tensors are checked like inputs.
    with raises(ValueError, match="output 0 has shape"):
        k(x, y, w, out=[torch.empty(8, 64, device="cuda", dtype=torch.bfloat16)])
    with raises(TypeError, match="output 0 has dtype"):
        k(x, y, w, out=[torch.empty(8, 128, device="cuda", dtype=torch.float32)])
    with raises(TypeError, match="output 0 is a list"):
        k(x, y, w, out=[[0.0]])
    with raises(ValueError, match="out= has 2"):
        k(x, y, w, out=[want, want])


def test_calls_with_and_without_torch_helpers():
    # Calls allocate outputs with torch's private helper for compiled code where present, else
    # with its public API: both give the same results and take the same checks.
    x, y, w = inputs()
    with_helpers = mucc.compile(small_gated())
    try:
        mucc._kernel._HELPERS = False
        without = mucc.compile(small_gated())
        (o2,) = without(x, y, w)
    finally:
        mucc._kernel._HELPERS = True
    (o1,) = with_helpers(x, y, w)
    assert torch.equal(o1, o2) and o1.stride() == o2.stride() and o1.device == o2.device
    for k in (with_helpers, without):
        # Both take the extension's fast path on matching tensors.
        assert k._raw._call_torch((x, y, w), None, False, None, False) is not None
        (o,) = k(x, y, w)
        assert torch.equal(o, o1)
        with raises(ValueError, match="shape"):
            k(x[:4], y, w)
        with raises(ValueError, match="strides"):
            k(x, y, w.t().contiguous().t())
        with raises(TypeError, match="dtype"):
            k(x.half(), y, w)
        with raises(ValueError, match="CUDA"):
            k(x.cpu(), y, w)


def test_side_stream_and_cuda_graph_capture():
    k = mucc.compile(small_gated())
    x, y, w = inputs()
    want = torch_gated(x, y, w)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        (o,) = k(x, y, w)
    torch.cuda.current_stream().wait_stream(s)
    assert rel_err(o, want) < 1e-2
    out = torch.empty(8, 128, device="cuda", dtype=torch.bfloat16)
    k(x, y, w, out=[out])  # warm-up outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        k(x, y, w, out=[out])
    out.fill_(float("nan"))
    x.mul_(2.0)  # replay must read the new values
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(out, torch_gated(x, y, w)) < 1e-2


def test_plain_calls_replay_recurring_addresses():
    # The second call over the same addresses captures; later ones replay the capture and
    # compute exactly what plain launches compute, on whatever the inputs hold now.
    k = mucc.compile(small_gated())
    plain = mucc.compile(small_gated())
    plain.auto_replay = False
    x, y, w = inputs()
    out = torch.empty(8, 128, device="cuda", dtype=torch.bfloat16)
    assert k.auto_replay and k.captures == 0 and k.replays == 0
    k(x, y, w, out=[out])
    assert k.captures == 0
    k(x, y, w, out=[out])
    assert k.captures == 1 and k.replays == 1 and k.capture_error is None
    for scale in (2.0, -0.5, 3.0):
        x.mul_(scale)
        out.fill_(float("nan"))
        k(x, y, w, out=[out])
        (want,) = plain(x, y, w)
        torch.cuda.synchronize()
        assert torch.equal(out, want)
    assert k.captures == 1 and plain.captures == 0
    # Fresh outputs the caching allocator hands back at the same address replay too.
    for _ in range(3):
        (o,) = k(x, y, w)
        del o
    (o,) = k(x, y, w)
    assert torch.equal(o, want)
    # At most `keep` captures are kept, the most recently used.
    k.keep = 2
    bufs = [torch.empty(8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    for b in bufs:
        k(x, y, w, out=[b])
        k(x, y, w, out=[b])
        assert torch.equal(b, want)
    assert k.replays == 2
    with raises(ValueError, match="at least 1"):
        k.keep = 0


def test_graphed_calls():
    k = mucc.compile(small_gated())
    g = k.graphed()
    x, y, w = inputs()
    (o1,) = g(x, y, w)
    assert k.captures == 1
    want = torch_gated(x, y, w)
    torch.cuda.synchronize()
    assert rel_err(o1, want) < 1e-2
    x.mul_(-2.0)
    (o2,) = g(x, y, w)
    assert o2 is o1 and k.captures == 1  # its own outputs, overwritten by each call
    assert rel_err(o2, torch_gated(x, y, w)) < 1e-2
    out = torch.empty(8, 128, device="cuda", dtype=torch.bfloat16)
    (o3,) = g(x, y, w, out=[out])
    assert o3 is out and rel_err(out, torch_gated(x, y, w)) < 1e-2
    with raises(ValueError, match="shape"):
        g(x[:4], y, w)
    # Inside someone else's capture the call joins that capture instead.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    before = k.captures
    with torch.cuda.graph(graph, stream=s):
        g(x, y, w, out=[out])
    assert k.captures == before
    out.fill_(float("nan"))
    x.mul_(0.5)
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(out, torch_gated(x, y, w)) < 1e-2
    g.reset()
    assert k.replays == 0
    (o4,) = g(x, y, w)
    assert o4 is not o1 and rel_err(o4, torch_gated(x, y, w)) < 1e-2
    assert "mucc.Graphed" in repr(g)


def test_every_device_compiles():
    for d in range(torch.cuda.device_count()):
        with torch.cuda.device(d):
            k = mucc.compile(small_gated(), device=d)
            x, y, w = (t.to(f"cuda:{d}") for t in inputs())
            (o,) = k(x, y, w)
            assert o.device.index == d
            assert rel_err(o, torch_gated(x, y, w)) < 1e-2


def _superoptimize_and_compare(script, file, torch_fn, make_inputs):
    mi = mucc
    g = script(mi)
    opt = g.superoptimize(config="mlp", previous_checkpoint=str(CORPUS / file))
    ins = make_inputs()
    outs = opt(inputs=ins)
    assert isinstance(outs, list) and len(outs) == 1
    err = rel_err(outs[0], torch_fn(*ins))
    print(f"  {file}: fastest {opt.graph.origin} "
          f"({opt.timings[0][1]:.2f} us of {sum(1 for t in opt.timings if t[1])} verified); "
          f"rel err vs torch {err:.2e}")
    assert err < 1e-2
    # Repeated calls (Mirage's timing loop) and the graphed form compute the same.
    for _ in range(3):
        again = opt(inputs=ins)
    gr = opt.graphed()
    graphed = gr(inputs=ins)
    torch.cuda.synchronize()
    assert rel_err(again[0], outs[0]) < 1e-2 and rel_err(graphed[0], outs[0]) < 1e-2
    assert gr(inputs=ins)[0] is graphed[0]
    assert g.superoptimize(previous_checkpoint=str(CORPUS / file)) is opt  # cached


def test_superoptimize_gated_mlp_matches_torch():
    def mk():
        torch.manual_seed(1)
        return [torch.randn(s, device="cuda", dtype=torch.float16) * 0.1
                for s in [(8, 4096), (4096, 4096), (4096, 4096)]]

    _superoptimize_and_compare(
        gated_mlp_mirage_script, "gated_mlp.json",
        lambda x, w1, w2: torch.nn.functional.silu(x.float() @ w1.float()) * (x.float() @ w2.float()), mk)


def test_superoptimize_rmsnorm_matches_torch():
    def mk():
        torch.manual_seed(2)
        return [torch.randn(s, device="cuda", dtype=torch.float16) * 0.1
                for s in [(2, 4096), (4096, 6144)]]

    def ref(x, w):
        x = x.float()
        return (x / x.pow(2).mean(-1, keepdim=True).sqrt()) @ w.float()

    _superoptimize_and_compare(rmsnorm_mirage_script, "rmsnorm_bs1.json", ref, mk)


def test_superoptimize_lora_matches_torch():
    def mk():
        torch.manual_seed(3)
        return [torch.randn(s, device="cuda", dtype=torch.float16) * 0.1
                for s in [(16, 256), (256, 4096), (256, 16), (16, 4096)]]

    _superoptimize_and_compare(
        lora_mirage_script, "lora.json",
        lambda x, w, a, b: x.float() @ w.float() + (x.float() @ a.float()) @ b.float(), mk)


def test_best_of_a_file():
    k = mucc.best(CORPUS / "lora.json")
    torch.manual_seed(4)
    ins = [torch.randn(s, device="cuda", dtype=torch.float16) * 0.1
           for s in [(16, 256), (256, 4096), (256, 16), (16, 4096)]]
    (o,) = k(*ins)
    x, w, a, b = (t.float() for t in ins)
    assert rel_err(o, x @ w + (x @ a) @ b) < 1e-2


if __name__ == "__main__":
    if not HAVE_GPU:
        print("no CUDA GPU with torch: 0 passed, 0 failed")
        sys.exit(0)
    passed = failed = 0
    for name, fn in sorted((n, f) for n, f in globals().items() if n.startswith("test_")):
        try:
            fn()
            passed += 1
            print(f"ok   {name}")
        except Exception as e:  # noqa: BLE001 - report every failure
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
