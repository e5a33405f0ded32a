"""Mirage's graph-building API (``new_kernel_graph``, ``new_threadblock_graph`` and their
methods), so that a Mirage script runs against mucc with ``import mucc as mi``.

Differences from Mirage: arguments may be lists or tuples; a malformed call raises
:class:`mucc.GraphError` naming the operator (Mirage aborts the process); operators mucc does
not implement (per-iteration outputs, ``store_in_dmem``) raise instead of being ignored.
"""

from __future__ import annotations

from typing import Any, Generic, Sequence, TypeVar

from . import _mucc
from ._dtypes import as_dtype, dtype, float16, from_mucc_name

__all__ = ["KNGraph", "TBGraph", "DTensor", "STensor", "new_kernel_graph", "new_threadblock_graph"]


def row_major(shape: Sequence[int]) -> list[int]:
    """Row-major element strides of ``shape``."""
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return out[::-1]


def _triple(x: Sequence[int], what: str) -> list[int]:
    v = [int(i) for i in x]
    if len(v) != 3:
        raise _mucc.GraphError(f"{what}: expected 3 values, got {len(v)} ({tuple(v)})")
    return v


class DTensor:
    """A tensor of a kernel graph (device memory)."""

    __slots__ = ("_graph", "_h")

    def __init__(self, graph: "KNGraph", handle: int) -> None:
        self._graph = graph
        self._h = handle

    @property
    def num_dims(self) -> int:
        return len(self.shape)

    def dim(self, i: int) -> int:
        """Size of dim ``i`` (negative indices count from the end)."""
        return self.shape[i]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._graph._b.shape(self._h))

    @property
    def dtype(self) -> dtype:
        return from_mucc_name(self._graph._b.dtype(self._h))

    def __repr__(self) -> str:
        return f"DTensor(shape={self.shape}, dtype={self.dtype})"


class STensor:
    """A tile of a threadblock graph (shared memory)."""

    __slots__ = ("_tb", "_h")

    def __init__(self, tb: "TBGraph", handle: int) -> None:
        self._tb = tb
        self._h = handle

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._tb._b.tile_shape(self._h))

    @property
    def num_dims(self) -> int:
        return len(self.shape)

    def dim(self, i: int) -> int:
        return self.shape[i]

    @property
    def dtype(self) -> dtype:
        return from_mucc_name(self._tb._b.tile_dtype(self._h))

    def __repr__(self) -> str:
        return f"STensor(shape={self.shape}, dtype={self.dtype})"


T = TypeVar("T")


class _Operators(Generic[T]):
    """The operators a kernel graph and a threadblock graph share (Mirage gives both the same
    names): each takes and returns the graph's own tensors (``T``), through the builder
    ``self._b`` and the subclass's ``_handle`` (tensor to builder handle, refusing another
    graph's) and ``_wrap`` (builder handle to tensor)."""

    _b: Any

    def _handle(self, t: T) -> int:
        raise NotImplementedError

    def _wrap(self, h: int) -> T:
        raise NotImplementedError

    def matmul(self, A: T, B: T) -> T:
        return self._wrap(self._b.matmul(self._handle(A), self._handle(B)))

    def _unary(self, op: str, A: T) -> T:
        return self._wrap(self._b.unary(op, self._handle(A)))

    def exp(self, A: T) -> T:
        return self._unary("exp", A)

    def silu(self, A: T) -> T:
        return self._unary("silu", A)

    def gelu(self, A: T) -> T:
        return self._unary("gelu", A)

    def relu(self, A: T) -> T:
        return self._unary("relu", A)

    def sigmoid(self, A: T) -> T:
        return self._unary("sigmoid", A)

    def square(self, A: T) -> T:
        return self._unary("square", A)

    def sqrt(self, A: T) -> T:
        return self._unary("sqrt", A)

    def log(self, A: T) -> T:
        return self._unary("log", A)

    def clamp(self, A: T, min_val: float, max_val: float) -> T:
        return self._wrap(self._b.clamp(self._handle(A), float(min_val), float(max_val)))

    def mul_scalar(self, A: T, scalar: float) -> T:
        return self._wrap(self._b.mul_scalar(self._handle(A), float(scalar)))

    def _binary(self, op: str, A: T, B: T) -> T:
        return self._wrap(self._b.binary(op, self._handle(A), self._handle(B)))

    def add(self, A: T, B: T) -> T:
        return self._binary("add", A, B)

    def sub(self, A: T, B: T) -> T:
        return self._binary("sub", A, B)

    def mul(self, A: T, B: T) -> T:
        return self._binary("mul", A, B)

    def div(self, A: T, B: T) -> T:
        return self._binary("div", A, B)

    def pow(self, A: T, B: T) -> T:
        return self._binary("pow", A, B)

    def reduction(self, A: T, dim: int) -> T:
        """Sum over ``dim``, which becomes 1."""
        return self._wrap(self._b.reduction(self._handle(A), int(dim)))


class TBGraph(_Operators["STensor"]):
    """A threadblock graph: the body of a customized operator (Mirage's ``TBGraph``)."""

    def __init__(self, grid_dim: Sequence[int], block_dim: Sequence[int], forloop_range: int,
                 reduction_dimx: int) -> None:
        self._b = _mucc._TbBuilder(_triple(grid_dim, "grid_dim"), _triple(block_dim, "block_dim"),
                                   int(forloop_range), int(reduction_dimx))
        self._graph: KNGraph | None = None
        self._inputs: list[DTensor] = []

    def _tile(self, t: STensor) -> int:
        if not isinstance(t, STensor) or t._tb is not self:
            raise _mucc.GraphError(f"{t!r} is not a tile of this threadblock graph")
        return t._h

    def new_input(self, dtensor: DTensor, input_map: Sequence[int], forloop_dim: int,
                  store_in_dmem: bool = False) -> STensor:
        """Tiles of ``dtensor``: grid axes split the dims ``input_map`` names (-1: replicated),
        the loop walks ``forloop_dim`` (-1: the same tile every iteration)."""
        if store_in_dmem:
            raise _mucc.GraphError("tb new_input: store_in_dmem=True is not supported by mucc")
        if not isinstance(dtensor, DTensor):
            raise _mucc.GraphError(f"tb new_input: {dtensor!r} is not a DTensor")
        if self._graph is None:
            self._graph = dtensor._graph
        elif self._graph is not dtensor._graph:
            raise _mucc.GraphError("tb new_input: the DTensor belongs to another kernel graph")
        h = self._b.new_input(dtensor._graph._b, dtensor._h, _triple(input_map, "input_map"),
                              int(forloop_dim))
        self._inputs.append(dtensor)
        return STensor(self, h)

    def new_output(self, stensor: STensor, output_map: Sequence[int],
                   forloop_dim: int = -1) -> None:
        """Stores the after-loop tile ``stensor``; grid axes place it along ``output_map``."""
        self._b.new_output(self._tile(stensor), _triple(output_map, "output_map"), int(forloop_dim))

    def _handle(self, t: STensor) -> int:
        return self._tile(t)

    def _wrap(self, h: int) -> STensor:
        return STensor(self, h)

    def reduction_to_dimx(self, A: STensor, dim: int) -> STensor:
        """Strided grouped sum of ``dim`` down to ``reduction_dimx``."""
        return STensor(self, self._b.reduction_to_dimx(self._tile(A), int(dim)))

    def reduction_max(self, A: STensor, dim: int) -> tuple[STensor, STensor]:
        """Online-softmax helper: (running max, previous max - new max)."""
        a, b = self._b.reduction_max(self._tile(A), int(dim))
        return STensor(self, a), STensor(self, b)

    def rms_norm(self, A: STensor) -> STensor:
        return STensor(self, self._b.rms_norm(self._tile(A)))

    def concat(self, A: STensor, B: STensor, dim: int) -> STensor:
        return STensor(self, self._b.concat(self._tile(A), self._tile(B), int(dim)))

    def forloop_accum(self, A: STensor, acc: str | None = None) -> STensor:
        """Accumulates over the loop: None (element-wise sum), "sum", "mean", "rms",
        "sum_todimx"."""
        return STensor(self, self._b.forloop_accum(self._tile(A), acc))

    def forloop_accum_rescale(self, A: STensor, B: STensor, acc: str | None = None) -> STensor:
        return STensor(self, self._b.forloop_accum_rescale(self._tile(A), self._tile(B), acc))


class KNGraph(_Operators["DTensor"]):
    """A kernel graph being built (Mirage's ``KNGraph``). Once its outputs are marked it is a
    graph like those :func:`mucc.load` returns: ``transpile``, ``explain``, ``eval``,
    ``validate``, ``to_json`` and :func:`mucc.compile` work on it."""

    def __init__(self) -> None:
        self._b = _mucc._KernelBuilder()
        self._optimized: dict[Any, Any] = {}

    def _t(self, t: DTensor) -> int:
        if not isinstance(t, DTensor) or t._graph is not self:
            raise _mucc.GraphError(f"{t!r} is not a tensor of this kernel graph")
        return t._h

    # Builders (Mirage's names and arguments).
    def new_input(self, dims: Sequence[int], strides: Sequence[int] | None = None,
                  dtype: Any = float16) -> DTensor:
        """A graph input of shape ``dims`` (row-major unless ``strides`` says otherwise)."""
        return DTensor(self, self._b.new_input([int(d) for d in dims],
                                               None if strides is None else [int(s) for s in strides],
                                               as_dtype(dtype).mucc_name))

    def mark_output(self, A: DTensor, strides: Sequence[int] | None = None) -> None:
        """Makes ``A`` a graph output (outputs keep the order of these calls), laid out with
        ``strides`` (default: row-major, recorded explicitly as Mirage does)."""
        h = self._t(A)
        if strides is None:
            strides = row_major(A.shape)
        self._b.mark_output(h, [int(s) for s in strides])

    def _handle(self, t: DTensor) -> int:
        return self._t(t)

    def _wrap(self, h: int) -> DTensor:
        return DTensor(self, h)

    def rms_norm(self, A: DTensor, normalized_shape: Sequence[int]) -> DTensor:
        """RMS normalisation over the trailing dims ``normalized_shape`` (no weight, no eps)."""
        ns = tuple(int(d) for d in normalized_shape)
        if A.shape[len(A.shape) - len(ns):] != ns or not ns:
            raise _mucc.GraphError(
                f"kn_rms_norm_op: normalized_shape {ns} is not the trailing dims of {A.shape}")
        return DTensor(self, self._b.rms_norm(self._t(A), len(ns)))

    def concat(self, tensors: Sequence[DTensor], dim: int) -> DTensor:
        return DTensor(self, self._b.concat([self._t(t) for t in tensors], int(dim)))

    def customized(self, inputs: Sequence[DTensor], bgraph: TBGraph) -> list[DTensor]:
        """Adds the customized operator ``bgraph``; ``inputs`` are its operands in the order of
        its ``new_input`` calls. Returns its outputs in the order of ``new_output`` calls."""
        if not isinstance(bgraph, TBGraph):
            raise _mucc.GraphError(f"customized: {bgraph!r} is not a threadblock graph")
        given = [self._t(t) for t in inputs]
        bound = self._b._tb_inputs(bgraph._b)
        if given != bound:
            raise _mucc.GraphError(
                f"customized: the inputs given ({len(given)}) are not the tensors the threadblock "
                f"graph's new_input calls read, in order ({len(bound)})")
        return [DTensor(self, h) for h in self._b.customized(bgraph._b)]

    # Graph methods (on a snapshot of what is built so far).
    def graph(self) -> "_mucc.Graph":
        """The graph built so far as a :class:`mucc.Graph`."""
        return self._b.graph()

    def validate(self) -> None:
        self.graph().validate()

    def inspect(self) -> str:
        return self.graph().inspect()

    def to_json(self, dtype_table: str = "current") -> str:
        return self.graph().to_json(dtype_table)

    def transpile(self, arch: str = "sm_90a", path: str = "auto", tune: bool = True,
                  warps: int | str = "auto") -> str:
        return self.graph().transpile(arch, path, tune, warps)

    def explain(self, arch: str = "sm_90a", path: str = "auto", tune: bool = True,
                warps: int | str = "auto") -> str:
        return self.graph().explain(arch, path, tune, warps)

    def eval(self, inputs: Sequence[Any]) -> list[Any]:
        return self.graph().eval(list(inputs))

    def __str__(self) -> str:
        return str(self.graph())

    def superoptimize(self, config: str | None = None, previous_checkpoint: str | None = None,
                      backend: str = "cuda", warmup_iters: int = 16, profile_iters: int = 1000,
                      verbose: bool = False, **kwargs: Any) -> Any:
        """Mirage's entry point. mucc does not search: it is a backend. With
        ``previous_checkpoint`` (a file of Mirage's saved candidates) it keeps the candidates
        that compute this graph (same inputs and outputs; outputs on the GPU equal to this
        graph's on the interpreter), times them, and returns the fastest as a callable:
        ``outputs = optimized(inputs=[tensors])``. Other Mirage keywords are accepted and
        ignored."""
        from ._kernel import superoptimize

        return superoptimize(self, previous_checkpoint=previous_checkpoint, backend=backend,
                             verbose=verbose, config=config)


def new_kernel_graph() -> KNGraph:
    """An empty kernel graph."""
    return KNGraph()


def new_threadblock_graph(grid_dim: Sequence[int], block_dim: Sequence[int], forloop_range: int,
                          reduction_dimx: int) -> TBGraph:
    """An empty threadblock graph of ``grid_dim`` blocks of ``block_dim`` threads and a loop of
    ``forloop_range`` iterations."""
    return TBGraph(grid_dim, block_dim, forloop_range, reduction_dimx)
