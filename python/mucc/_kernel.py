"""Compiled graphs called on GPU tensors: :func:`compile`, :func:`best`, ``superoptimize``."""

from __future__ import annotations

import os
import sys
from typing import Any, Sequence

from . import _mucc
from ._builder import row_major
from ._dtypes import convert_dtype_to_torch_type

__all__ = ["Kernel", "compile", "best", "Optimized"]

_ALIGN = 16  # bytes: the generated kernels copy 16-byte chunks and TMA needs aligned bases


def _as_graph(graph: Any) -> "_mucc.Graph":
    if isinstance(graph, _mucc.Graph):
        return graph
    inner = getattr(graph, "graph", None)
    if callable(inner):
        g = inner()
        if isinstance(g, _mucc.Graph):
            return g
    raise TypeError(f"expected a mucc.Graph or mucc.KNGraph, got {type(graph).__name__}")


def _default_device() -> int:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.current_device()
    return 0


def _shape_str(s: Sequence[int]) -> str:
    return "(" + ", ".join(str(x) for x in s) + ("," if len(s) == 1 else "") + ")"


def _strides_match(shape: Sequence[int], got: Sequence[int], want: Sequence[int]) -> bool:
    # A dim of size 1 is never stepped over: its stride does not matter.
    return all(n == 1 or g == w for n, g, w in zip(shape, got, want))


class Kernel:
    """A graph compiled for one GPU. Call it on CUDA tensors: ``outs = kernel(*inputs)``.

    Inputs are checked against the graph (count, shape, dtype, strides, device, 16-byte
    alignment) with errors naming the input; outputs are allocated with the inputs' library
    (PyTorch tensors in, PyTorch tensors out; CuPy likewise) unless ``out=`` gives them. The
    work runs on the caller's current stream (``torch.cuda.current_stream()``, or ``stream=``)
    and can be captured in ``torch.cuda.graph``. The workspace is cached per stream."""

    def __init__(self, raw: "_mucc._Kernel") -> None:
        self._raw = raw
        self._in = [tuple(s) for s in raw.input_specs]
        self._out = [tuple(s) for s in raw.output_specs]
        self._ws_bytes = raw.workspace_bytes
        self._ws: dict[int, Any] = {}
        self._torch_dtypes: list[Any] | None = None

    # Facts about the compiled graph.
    @property
    def device(self) -> int:
        return self._raw.device

    @property
    def arch(self) -> str:
        return self._raw.arch

    @property
    def source(self) -> str:
        """The generated CUDA C++."""
        return self._raw.source

    def explain(self) -> str:
        """The plan as text."""
        return self._raw.explain

    @property
    def tuned(self) -> str | None:
        return self._raw.tuned

    @property
    def input_specs(self) -> list[tuple[tuple[int, ...], tuple[int, ...], str]]:
        """(shape, strides in elements, mucc dtype) of each input."""
        return [(tuple(s), tuple(st), d) for s, st, d, _ in self._in]

    @property
    def output_specs(self) -> list[tuple[tuple[int, ...], tuple[int, ...], str]]:
        """(shape, strides in elements, mucc dtype) of each output."""
        return [(tuple(s), tuple(st), d) for s, st, d, _ in self._out]

    @property
    def workspace_bytes(self) -> int:
        return self._ws_bytes

    def __repr__(self) -> str:
        return (f"<mucc.Kernel {self._raw.origin} on cuda:{self.device} ({self._raw.gpu_name}, "
                f"{self.arch}), {self._raw.steps} step(s)>")

    # Calling.
    def _tdt(self) -> list[Any]:
        if self._torch_dtypes is None:
            self._torch_dtypes = [convert_dtype_to_torch_type(d) for _, _, d, _ in self._in + self._out]
        return self._torch_dtypes

    def __call__(self, *inputs: Any, out: Sequence[Any] | None = None,
                 stream: Any = None) -> list[Any]:
        if len(inputs) != len(self._in):
            raise ValueError(f"{self._raw.origin}: the graph has {len(self._in)} inputs, "
                             f"{len(inputs)} were given")
        first = inputs[0] if inputs else None
        if first is not None and hasattr(first, "__cuda_array_interface__") and \
                type(first).__module__.split(".")[0] != "torch":
            return self._call_cai(inputs, out, stream)
        return self._call_torch(inputs, out, stream)

    def _check(self, i: int, kind: str, spec: tuple, shape: tuple, strides: tuple, dt_ok: bool,
               dt_name: str, ptr: int, dev: int) -> None:
        want_shape, want_strides, want_dt, _ = spec
        what = f"{self._raw.origin}: {kind} {i}"
        if tuple(shape) != tuple(want_shape):
            raise ValueError(f"{what} has shape {_shape_str(shape)}, the graph expects "
                             f"{_shape_str(want_shape)}")
        if not dt_ok:
            raise TypeError(f"{what} has dtype {dt_name}, the graph expects {want_dt}")
        if dev != self.device:
            raise ValueError(f"{what} is on device {dev}, the kernel was compiled for "
                             f"cuda:{self.device}")
        if not _strides_match(shape, strides, want_strides):
            hint = " (pass .contiguous())" if list(want_strides) == row_major(want_shape) else ""
            raise ValueError(f"{what} has strides {_shape_str(strides)}, the graph expects "
                             f"{_shape_str(want_strides)}{hint}")
        if ptr % _ALIGN:
            raise ValueError(f"{what}: its address {ptr:#x} is not {_ALIGN}-byte aligned (a view "
                             f"into another tensor?); pass .clone()")

    def _call_torch(self, inputs: Sequence[Any], out: Sequence[Any] | None,
                    stream: Any) -> list[Any]:
        import torch

        tdt = self._tdt()
        ptrs = []
        for i, (t, spec) in enumerate(zip(inputs, self._in)):
            if not isinstance(t, torch.Tensor):
                if hasattr(t, "__dlpack__"):
                    t = torch.from_dlpack(t)
                else:
                    raise TypeError(f"{self._raw.origin}: input {i} is a {type(t).__name__}, "
                                    "not a tensor (torch, __dlpack__ or __cuda_array_interface__)")
            if not t.is_cuda:
                raise ValueError(f"{self._raw.origin}: input {i} is on {t.device}, not a CUDA "
                                 "device")
            self._check(i, "input", spec, tuple(t.shape), t.stride(), t.dtype == tdt[i],
                        str(t.dtype), t.data_ptr(), t.device.index)
            ptrs.append(t.data_ptr())
        dev = torch.device("cuda", self.device)
        if out is None:
            outs = []
            for j, (shape, strides, _, alloc) in enumerate(self._out):
                flat = torch.empty(max(alloc, 1), dtype=tdt[len(self._in) + j], device=dev)
                outs.append(flat.as_strided(shape, strides))
        else:
            outs = list(out)
            if len(outs) != len(self._out):
                raise ValueError(f"{self._raw.origin}: out= has {len(outs)} tensors, the graph "
                                 f"has {len(self._out)} outputs")
            for j, (t, spec) in enumerate(zip(outs, self._out)):
                self._check(j, "output", spec, tuple(t.shape), t.stride(),
                            t.dtype == tdt[len(self._in) + j], str(t.dtype), t.data_ptr(),
                            t.device.index)
                room = t.untyped_storage().nbytes() - t.storage_offset() * t.element_size()
                if room < spec[3] * t.element_size():
                    raise ValueError(f"{self._raw.origin}: output {j} has room for "
                                     f"{room // t.element_size()} elements, the plan writes "
                                     f"{spec[3]}")
        if stream is None:
            s = torch.cuda.current_stream(dev).cuda_stream
        else:
            s = getattr(stream, "cuda_stream", stream)
        ws = 0
        if self._ws_bytes:
            buf = self._ws.get(s)
            if buf is None:
                buf = torch.empty(self._ws_bytes, dtype=torch.uint8, device=dev)
                self._ws[s] = buf
            ws = buf.data_ptr()
        self._raw._launch(ptrs, [o.data_ptr() for o in outs], ws, int(s))
        return outs

    def _call_cai(self, inputs: Sequence[Any], out: Sequence[Any] | None,
                  stream: Any) -> list[Any]:
        import numpy as np

        ptrs = []
        for i, (t, spec) in enumerate(zip(inputs, self._in)):
            cai = getattr(t, "__cuda_array_interface__", None)
            if cai is None:
                raise TypeError(f"{self._raw.origin}: input {i} has no __cuda_array_interface__")
            ptr, shape, strides, ok, name = _cai_facts(cai, spec[2])
            self._check(i, "input", spec, shape, strides, ok, name, ptr, self.device)
            ptrs.append(ptr)
        if out is None:
            lib = sys.modules.get(type(inputs[0]).__module__.split(".")[0])
            if lib is None or not hasattr(lib, "empty") or lib.__name__ != "cupy":
                raise TypeError(f"{self._raw.origin}: pass out= to receive the outputs (mucc "
                                f"allocates outputs with torch or cupy only)")
            outs = []
            for shape, strides, dt, alloc in self._out:
                npdt = np.dtype(_NUMPY[dt])
                flat = lib.empty(max(alloc, 1), dtype=npdt)
                outs.append(lib.lib.stride_tricks.as_strided(
                    flat, shape=shape, strides=[s * npdt.itemsize for s in strides]))
        else:
            outs = list(out)
        optrs = []
        for j, (t, spec) in enumerate(zip(outs, self._out)):
            ptr, shape, strides, ok, name = _cai_facts(t.__cuda_array_interface__, spec[2])
            self._check(j, "output", spec, shape, strides, ok, name, ptr, self.device)
            optrs.append(ptr)
        s = 0 if stream is None else int(getattr(stream, "ptr", stream))
        ws = 0
        if self._ws_bytes:
            raise TypeError(f"{self._raw.origin}: this graph needs a {self._ws_bytes}-byte "
                            "workspace, which mucc allocates through torch; call it with torch "
                            "tensors")
        self._raw._launch(ptrs, optrs, ws, s)
        return outs


_NUMPY = {"f16": "float16", "f32": "float32", "f64": "float64", "i8": "int8", "u8": "uint8",
          "i16": "int16", "u16": "uint16", "i32": "int32", "u32": "uint32", "i64": "int64",
          "u64": "uint64"}


def _cai_facts(cai: dict, want: str) -> tuple[int, tuple, tuple, bool, str]:
    import numpy as np

    typestr = cai["typestr"]
    dt = np.dtype(typestr)
    shape = tuple(cai["shape"])
    if cai.get("strides") is None:
        strides = tuple(row_major(shape))
    else:
        strides = tuple(s // dt.itemsize for s in cai["strides"])
    ok = want in _NUMPY and dt == np.dtype(_NUMPY[want])
    return int(cai["data"][0]), shape, strides, ok, str(dt)


def compile(graph: Any, device: int | None = None, tune: bool = True,
            path: str = "auto") -> Kernel:
    """Validates, plans, emits and compiles ``graph`` (a :class:`mucc.Graph` or
    :class:`mucc.KNGraph`) for CUDA device ``device`` (default: torch's current device, or 0)
    with NVRTC and mucc's disk cache. ``tune`` applies ``mucc tune``'s cached variant when
    there is one; ``path`` is ``auto``, ``ampere`` or ``hopper``."""
    g = _as_graph(graph)
    dev = _default_device() if device is None else int(device)
    return Kernel(_mucc.compile(g, dev, tune, path))


def _rank(graphs: list["_mucc.Graph"], reference: "_mucc.Graph | None", device: int, tune: bool,
          verbose: bool) -> list[tuple[int, float | None, str]]:
    rows = _mucc._bench(graphs, reference, device, tune)
    if verbose:
        for i, us, note in rows:
            t = f"{us:9.2f} us" if us is not None else "        --"
            print(f"mucc: {graphs[i].origin}: {t}  {note}", file=sys.stderr)
    return rows


def best(path: str | os.PathLike, device: int | None = None, tune: bool = True,
         verbose: bool = False) -> Kernel:
    """The fastest candidate of a saved Mirage file that passes the check against the
    interpreter on the GPU, compiled: the superoptimiser-backend flow in one call."""
    graphs = _mucc.load(os.fspath(path))
    dev = _default_device() if device is None else int(device)
    rows = _rank(graphs, None, dev, tune, verbose)
    if not rows or rows[0][1] is None:
        notes = "; ".join(f"graph {i}: {n}" for i, _, n in rows[:5])
        raise _mucc.MuccError(f"{os.fspath(path)}: no candidate passed ({notes})")
    k = compile(graphs[rows[0][0]], dev, tune)
    k.timings = rows  # type: ignore[attr-defined]
    return k


def _signature(specs: list) -> list[tuple]:
    return [(tuple(s), d) for s, _, d, _ in specs]


class Optimized:
    """What ``KNGraph.superoptimize`` returns: the fastest verified candidate, called the way
    Mirage's is: ``outputs = optimized(inputs=[tensors])`` returns a list of new tensors."""

    def __init__(self, kernel: Kernel, candidate: "_mucc.Graph",
                 timings: list[tuple[int, float | None, str]]) -> None:
        self.kernel = kernel
        self.graph = candidate
        self.timings = timings

    def __call__(self, inputs: Sequence[Any] | None = None, stream: Any = None,
                 **ignored: Any) -> list[Any]:
        if inputs is None:
            raise TypeError("call it as optimized(inputs=[...])")
        return self.kernel(*inputs, stream=stream)

    def __repr__(self) -> str:
        return f"<mucc.Optimized {self.graph.origin}>"


_SUPEROPTIMIZED: dict[tuple[str, str, int], Optimized] = {}


def superoptimize(kn: Any, previous_checkpoint: str | None, backend: str, verbose: bool,
                  config: str | None) -> Optimized:
    if backend != "cuda":
        raise _mucc.MuccError(f"superoptimize: backend {backend!r}: mucc emits CUDA only")
    if previous_checkpoint is None:
        raise _mucc.MuccError(
            "superoptimize: mucc does not search for µGraphs, it is a backend for the ones "
            "Mirage found. Pass previous_checkpoint='FILE.json' (Mirage's saved candidates of "
            "this graph), or call mucc.best('FILE.json') or mucc.compile(graph) directly.")
    me = _as_graph(kn)
    me.validate()
    dev = _default_device()
    key = (os.path.abspath(previous_checkpoint), me.to_json(), dev)
    if key in _SUPEROPTIMIZED:
        return _SUPEROPTIMIZED[key]
    if not os.path.exists(previous_checkpoint):
        raise _mucc.MuccError(f"superoptimize: {previous_checkpoint}: no such file (mucc does "
                              "not search, so it cannot create one)")
    candidates = _mucc.load(previous_checkpoint)
    sig_in, sig_out = _signature(me._input_specs()), _signature(me._output_specs())
    same = [g for g in candidates
            if _signature(g._input_specs()) == sig_in and _signature(g._output_specs()) == sig_out]
    if not same:
        raise _mucc.MuccError(
            f"superoptimize: none of the {len(candidates)} graphs of {previous_checkpoint} has "
            f"this graph's inputs {sig_in} and outputs {sig_out}")
    rows = _rank(same, me, dev, True, verbose)
    if rows[0][1] is None:
        notes = "; ".join(f"{same[i].origin}: {n}" for i, _, n in rows[:5])
        raise _mucc.MuccError(f"superoptimize: no candidate of {previous_checkpoint} computes "
                              f"this graph on the GPU ({notes})")
    winner = same[rows[0][0]]
    rows = [(same[i].index if same[i].index is not None else i, us, n) for i, us, n in rows]
    if verbose:
        print(f"mucc: fastest: {winner.origin} ({rows[0][1]:.2f} us)", file=sys.stderr)
    opt = Optimized(compile(winner, dev), winner, rows)
    _SUPEROPTIMIZED[key] = opt
    return opt
