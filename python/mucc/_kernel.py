"""Compiled graphs called on GPU tensors: :func:`compile`, :func:`best`, ``superoptimize``."""

from __future__ import annotations

import math
import os
import sys
from typing import Any, Sequence

from . import _mucc
from ._builder import row_major
from ._dtypes import convert_dtype_to_torch_type

__all__ = ["Kernel", "Graphed", "compile", "best", "Optimized"]

# (shape, strides in elements, mucc dtype name, elements to allocate) of an input or output.
_Spec = tuple[list[int], list[int], str, int]

_ALIGN = 16  # bytes: the generated kernels copy 16-byte chunks and TMA needs aligned bases
# Whether calls allocate outputs with torch's private helper for compiled code
# (`torch._C._dynamo.guards._empty_strided_cuda`) where present; the tests turn it off to run
# the fallback on the public API.
_HELPERS = True


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
        self._in: list[_Spec] = list(raw.input_specs)
        self._out: list[_Spec] = list(raw.output_specs)
        self._ws_bytes = raw.workspace_bytes
        self._torch_dtypes: list[Any] | None = None
        self._facts: _TorchFacts | None = None

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
        if self._facts is not None or self._torch_ready(inputs):
            outs = self._raw._call_torch(inputs, out, False, stream, False)
            if outs is not None:
                return outs
        ptrs, outs, optrs, ws, s = self._args(inputs, out, stream, False)
        self._raw._run(ptrs, optrs, ws, s, False)
        return outs

    @property
    def auto_replay(self) -> bool:
        """Whether plain calls replay CUDA graphs: a call over the same addresses (inputs,
        outputs, workspace) as the call before it captures its execution, and later calls over
        them replay it with one driver call (the same kernels over the same buffers). Default
        on; a failed capture turns it off (:attr:`capture_error` says why)."""
        return self._raw.auto_replay

    @auto_replay.setter
    def auto_replay(self, on: bool) -> None:
        self._raw.auto_replay = bool(on)

    @property
    def captures(self) -> int:
        """CUDA-graph captures made so far (plain calls and :meth:`graphed` ones)."""
        return self._raw.captures

    @property
    def replays(self) -> int:
        """Captures kept: the most recently used, at most :attr:`keep`."""
        return self._raw.replays

    @property
    def keep(self) -> int:
        """How many captures are kept (default 8)."""
        return self._raw.keep

    @keep.setter
    def keep(self, n: int) -> None:
        if int(n) < 1:
            raise ValueError(f"keep must be at least 1, got {n}")
        self._raw.keep = int(n)

    @property
    def capture_error(self) -> str | None:
        """Why a plain call's capture failed (plain calls then stopped capturing), or None."""
        return self._raw.capture_error

    def _torch_ready(self, inputs: Sequence[Any]) -> bool:
        """Sets up the fast path (the facts it compares with) at the first call on torch
        tensors."""
        torch = sys.modules.get("torch")
        if torch is None or not inputs or not isinstance(inputs[0], torch.Tensor):
            return False
        self._torch_facts(torch)
        return True

    def graphed(self) -> "Graphed":
        """This kernel called through CUDA-graph replays with outputs of its own: see
        :class:`Graphed`."""
        return Graphed(self)

    def _args(self, inputs: Sequence[Any], out: Sequence[Any] | None, stream: Any,
              trusted: bool) -> tuple[list[int], list[Any], list[int], int, int]:
        """Checks a call's arguments; returns (input addresses, outputs, output addresses,
        workspace address, stream). ``trusted``: ``out`` are outputs this package allocated for
        this kernel (no checks)."""
        if len(inputs) != len(self._in):
            raise ValueError(f"{self._raw.origin}: the graph has {len(self._in)} inputs, "
                             f"{len(inputs)} were given")
        torch = sys.modules.get("torch")
        first = inputs[0] if inputs else None
        if (torch is None or not isinstance(first, torch.Tensor)) and first is not None and \
                hasattr(first, "__cuda_array_interface__"):
            return self._args_cai(inputs, out, stream, trusted)
        return self._args_torch(inputs, out, stream, trusted)

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

    def _torch_facts(self, torch: Any) -> "_TorchFacts":
        if self._facts is None:
            self._facts = _TorchFacts(torch, self)
        return self._facts

    def _checked_tensor(self, torch: Any, i: int, kind: str, t: Any) -> Any:
        """The slow path of one argument: conversion from ``__dlpack__`` and every check with
        its message. Returns the tensor when it passes (say, a size-1 dim's stride differs)."""
        spec = (self._in + self._out)[i if kind == "input" else len(self._in) + i]
        if not isinstance(t, torch.Tensor):
            if kind == "input" and hasattr(t, "__dlpack__"):
                t = torch.from_dlpack(t)
            else:
                raise TypeError(f"{self._raw.origin}: {kind} {i} is a {type(t).__name__}, "
                                "not a tensor (torch, __dlpack__ or __cuda_array_interface__)")
        if not t.is_cuda:
            raise ValueError(f"{self._raw.origin}: {kind} {i} is on {t.device}, not a CUDA "
                             "device")
        want = self._tdt()[i if kind == "input" else len(self._in) + i]
        self._check(i, kind, spec, tuple(t.shape), t.stride(), t.dtype == want, str(t.dtype),
                    t.data_ptr(), t.device.index)
        return t

    def _args_torch(self, inputs: Sequence[Any], out: Sequence[Any] | None, stream: Any,
                    trusted: bool) -> tuple[list[int], list[Any], list[int], int, int]:
        torch: Any = sys.modules.get("torch")
        if torch is None:
            import torch as imported
            torch = imported
        f = self._torch_facts(torch)
        tensor, dev = torch.Tensor, self._raw.device
        # The fast path compares each argument with its precomputed facts in one expression;
        # anything off (or not a torch tensor) takes the slow path, which converts or raises
        # the located error.
        ptrs = []
        for i, t in enumerate(inputs):
            shape, strides, dt, _ = f.facts[i]
            if not (isinstance(t, tensor) and t.dtype is dt and t.shape == shape
                    and t.get_device() == dev and t.stride() == strides):
                t = self._checked_tensor(torch, i, "input", t)
            p = t.data_ptr()
            if p % _ALIGN:
                self._checked_tensor(torch, i, "input", t)
            ptrs.append(p)
        n_in = len(ptrs)
        if out is None:
            outs = [f.alloc(j) for j in range(len(self._out))]
        elif trusted:
            outs = list(out)
        else:
            outs = list(out)
            if len(outs) != len(self._out):
                raise ValueError(f"{self._raw.origin}: out= has {len(outs)} tensors, the graph "
                                 f"has {len(self._out)} outputs")
            for j, t in enumerate(outs):
                shape, strides, dt, roomy = f.facts[n_in + j]
                if not (isinstance(t, tensor) and t.dtype is dt and t.shape == shape
                        and t.get_device() == dev and t.stride() == strides):
                    self._checked_tensor(torch, j, "output", t)
                if t.data_ptr() % _ALIGN:
                    self._checked_tensor(torch, j, "output", t)
                if not roomy:
                    # The plan writes past the span of the output's shape and strides: the
                    # storage must have that room.
                    alloc = self._out[j][3]
                    room = t.untyped_storage().nbytes() - t.storage_offset() * t.element_size()
                    if room < alloc * t.element_size():
                        raise ValueError(f"{self._raw.origin}: output {j} has room for "
                                         f"{room // t.element_size()} elements, the plan writes "
                                         f"{alloc}")
        if stream is None:
            s = f.current_stream(dev)
        else:
            s = int(getattr(stream, "cuda_stream", stream))
        ws = self._raw._workspace(s) if self._ws_bytes else 0
        return ptrs, outs, [o.data_ptr() for o in outs], ws, s

    def _args_cai(self, inputs: Sequence[Any], out: Sequence[Any] | None, stream: Any,
                  trusted: bool) -> tuple[list[int], list[Any], list[int], int, int]:
        import numpy as np

        if self._ws_bytes:
            raise TypeError(f"{self._raw.origin}: this graph needs a {self._ws_bytes}-byte "
                            "workspace, which mucc allocates through torch; call it with torch "
                            "tensors")
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
            for oshape, ostrides, dt, alloc in self._out:
                npdt = np.dtype(_NUMPY[dt])
                flat = lib.empty(max(alloc, 1), dtype=npdt)
                outs.append(lib.lib.stride_tricks.as_strided(
                    flat, shape=oshape, strides=[s * npdt.itemsize for s in ostrides]))
        else:
            outs = list(out)
        optrs = []
        for j, (t, spec) in enumerate(zip(outs, self._out)):
            ptr, shape, strides, ok, name = _cai_facts(t.__cuda_array_interface__, spec[2])
            self._check(j, "output", spec, shape, strides, ok, name, ptr, self.device)
            optrs.append(ptr)
        if stream is None:
            # CuPy's current stream when CuPy is loaded, else the legacy default stream.
            cp = sys.modules.get("cupy")
            s = int(cp.cuda.get_current_stream().ptr) if cp is not None else 0
        else:
            s = int(getattr(stream, "ptr", stream))
        return ptrs, outs, optrs, 0, s


class Graphed:
    """A :class:`Kernel` called through CUDA-graph replays with outputs of its own
    (``kernel.graphed()``): the first call over a set of input addresses runs the kernel and
    captures that execution into a CUDA graph; later calls over the same addresses replay it
    with one driver call, however many kernels and cuBLAS calls the graph has. Inputs are
    checked on every call as :class:`Kernel` checks them; the data in them may change freely
    between calls.

    Outputs: without ``out=``, every call returns the same output tensors, allocated by the
    first call and overwritten by each later one (as ``torch.cuda.graph``'s static outputs
    are): ``clone()`` what must be kept. With ``out=``, those tensors are written.

    The kernel keeps its :attr:`Kernel.keep` most recently used captures; addresses not among
    them cost a capture. A call on a stream that is itself capturing (inside
    ``torch.cuda.graph``) queues a plain execution into that capture."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self._outs: list[Any] | None = None

    def __call__(self, *inputs: Any, out: Sequence[Any] | None = None,
                 stream: Any = None) -> list[Any]:
        k = self.kernel
        mine = out is None and self._outs is not None
        given = self._outs if mine else out
        outs = None
        if k._facts is not None or k._torch_ready(inputs):
            outs = k._raw._call_torch(inputs, given, mine, stream, True)
        if outs is None:
            ptrs, outs, optrs, ws, s = k._args(inputs, given, stream, mine)
            k._raw._run(ptrs, optrs, ws, s, True)
        if out is None:
            self._outs = outs
        return outs

    def reset(self) -> None:
        """Drops the kernel's captures and the outputs of earlier calls."""
        self.kernel._raw._drop_replays()
        self._outs = None

    def __repr__(self) -> str:
        return (f"<mucc.Graphed {self.kernel._raw.origin}: {self.kernel.replays} capture(s) "
                f"kept>")


class _TorchFacts:
    """What one call compares torch arguments with, computed once per kernel: per input and
    output (torch.Size, strides, torch dtype, whether the plan writes only within the span of
    that shape and those strides), the output allocators and the current-stream query."""

    def __init__(self, torch: Any, k: Kernel) -> None:
        tdt = k._tdt()
        self.facts: list[tuple[Any, tuple[int, ...], Any, bool]] = []
        for (shape, strides, _, alloc), dt in zip(k._in + k._out, tdt):
            span = 1 + sum((n - 1) * s for n, s in zip(shape, strides))
            self.facts.append((torch.Size(shape), tuple(strides), dt, alloc <= span))
        self._dev = torch.device("cuda", k.device)
        # Per output: (shape, strides, elements, torch dtype, dense): a dense output (row-major,
        # allocation = its elements) is one torch.empty; others a strided view of a flat one.
        self._outs = [(shape, strides, alloc, dt,
                       list(strides) == row_major(shape) and alloc == math.prod(shape))
                      for (shape, strides, _, alloc), dt in zip(k._out, tdt[len(k._in):])]
        self._torch = torch
        # torch's own raw-stream query (what its compiled code calls) when present: one C call
        # instead of building a torch.cuda.Stream object per call.
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is not None:
            self.current_stream = raw
        else:
            self.current_stream = lambda d: torch.cuda.current_stream(d).cuda_stream
        # The extension's fast path compares with the same facts and allocates outputs with
        # torch's own allocation helper for compiled code where this torch has it (no
        # dispatcher), else from templates (`new_empty` parses fewer arguments than
        # `torch.empty`).
        guards = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
        k._raw._torch_setup(
            torch.Tensor, [(tuple(sz), st, dt, roomy, list(st) == row_major(list(sz)))
                           for sz, st, dt, roomy in self.facts],
            [(torch.empty(0, dtype=dt, device=self._dev), tuple(shape), tuple(strides), dt,
              alloc, dense) for shape, strides, alloc, dt, dense in self._outs],
            k.device, self.current_stream, torch.empty(0, dtype=torch.uint8, device=self._dev),
            getattr(guards, "_empty_strided_cuda", None) if _HELPERS else None)

    def alloc(self, j: int) -> Any:
        shape, strides, alloc, dt, dense = self._outs[j]
        if dense:
            return self._torch.empty(shape, dtype=dt, device=self._dev)
        flat = self._torch.empty(max(alloc, 1), dtype=dt, device=self._dev)
        return flat.as_strided(shape, strides)


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
            path: str = "auto", warps: int | str = "auto") -> Kernel:
    """Validates, plans, emits and compiles ``graph`` (a :class:`mucc.Graph` or
    :class:`mucc.KNGraph`) for CUDA device ``device`` (default: torch's current device, or 0)
    with NVRTC and mucc's disk cache. ``tune`` applies ``mucc tune``'s cached variant when
    there is one (only where ``path`` and ``warps`` are left at ``auto``); ``path`` is
    ``auto``, ``ampere`` or ``hopper``; ``warps`` is the CTA shape of threadblock kernels:
    ``auto`` (mucc's cost model), ``graph`` (the µGraph's ``block_dim``) or a number of warps
    (1 to 32)."""
    g = _as_graph(graph)
    dev = _default_device() if device is None else int(device)
    return Kernel(_mucc.compile(g, dev, tune, path, warps))


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
        self._fast: Any = None

    def __call__(self, inputs: Sequence[Any] | None = None, stream: Any = None,
                 **ignored: Any) -> list[Any]:
        fast = self._fast
        if fast is not None and inputs is not None:
            outs = fast(inputs, None, False, stream, False)
            if outs is not None:
                return outs
        if inputs is None:
            raise TypeError("call it as optimized(inputs=[...])")
        outs = self.kernel(*inputs, stream=stream)
        if self.kernel._facts is not None:
            # The extension's fast path is set up: later calls go to it directly.
            self._fast = self.kernel._raw._call_torch
        return outs

    def graphed(self) -> "OptimizedGraphed":
        """The same call through CUDA-graph replays (see :class:`Graphed`): every call returns
        the same output tensors, overwritten by the next call."""
        return OptimizedGraphed(self.kernel.graphed())

    def __repr__(self) -> str:
        return f"<mucc.Optimized {self.graph.origin}>"


class OptimizedGraphed:
    """:meth:`Optimized.graphed`: called as ``outputs = g(inputs=[tensors])``."""

    def __init__(self, graphed: Graphed) -> None:
        self.graphed = graphed
        self._fast = graphed.kernel._raw._call_torch

    def __call__(self, inputs: Sequence[Any] | None = None, stream: Any = None,
                 **ignored: Any) -> list[Any]:
        g = self.graphed
        mine = g._outs
        if mine is not None and inputs is not None:
            # Straight to the extension once the first call has set up the facts and outputs.
            outs = self._fast(inputs, mine, True, stream, True)
            if outs is not None:
                g._outs = outs
                return outs
        if inputs is None:
            raise TypeError("call it as graphed(inputs=[...])")
        return g(*inputs, stream=stream)

    def __repr__(self) -> str:
        return f"<mucc.OptimizedGraphed {self.graphed.kernel._raw.origin}>"


def _index_or(index: int | None, default: int) -> int:
    return default if index is None else index


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
    rows = [(_index_or(same[i].index, i), us, n) for i, us, n in rows]
    if verbose:
        print(f"mucc: fastest: {winner.origin} ({rows[0][1]:.2f} us)", file=sys.stderr)
    opt = Optimized(compile(winner, dev), winner, rows)
    _SUPEROPTIMIZED[key] = opt
    return opt
