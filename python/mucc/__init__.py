"""mucc: µGraphs (Mirage's two-level kernel graphs) to CUDA, from Python.

Three lines from a saved Mirage file to a callable on PyTorch tensors::

    import mucc
    kernel = mucc.best("gated_mlp.json")      # fastest verified candidate, compiled
    (out,) = kernel(x, w1, w2)                  # torch tensors in, torch tensors out

Graphs can also be built with Mirage's Python API (``mucc.new_kernel_graph()`` …), inspected,
evaluated on the CPU (``graph.eval``), transpiled to CUDA C++ (``graph.transpile``) and
compiled (``mucc.compile``). See docs/python.md in the repository.
"""

from __future__ import annotations

import os

from . import _mucc
from ._builder import (DTensor, KNGraph, STensor, TBGraph, new_kernel_graph,
                       new_threadblock_graph)
from ._dtypes import (bfloat16, convert_dtype_to_torch_type, convert_torch_type_to_dtype,
                      dtype, float16, float32, float64, int8, int16, int32, int64, uint8,
                      uint16, uint32, uint64)
from ._kernel import Graphed, Kernel, Optimized, OptimizedGraphed, best, compile
from ._mucc import (CompileError, CudaError, Graph, GraphError, MuccError, driver_available,
                    nvrtc_version)

__version__: str = _mucc.__version__

__all__ = [
    "load", "Graph", "GraphError", "MuccError", "CompileError", "CudaError", "Kernel",
    "Graphed", "Optimized", "OptimizedGraphed", "compile", "best", "KNGraph", "TBGraph", "DTensor", "STensor",
    "new_kernel_graph", "new_threadblock_graph", "dtype", "float16", "bfloat16", "float32",
    "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "convert_dtype_to_torch_type", "convert_torch_type_to_dtype", "driver_available",
    "nvrtc_version", "set_gpu_device_id",
]


def load(path: str | os.PathLike, dtype_table: str | None = None) -> list[Graph]:
    """Reads a Mirage JSON file (a list of candidate graphs, one graph, or a 2024 checkpoint)
    and returns its graphs in file order. ``dtype_table`` (``legacy``, ``mid``, ``current``)
    overrides the detected table of Mirage's ``data_type`` codes. Raises
    :class:`GraphError` naming the file and JSON path of what is malformed."""
    return _mucc.load(os.fspath(path), dtype_table)


def set_gpu_device_id(device_id: int) -> None:
    """Mirage's device selection: makes ``device_id`` torch's current device (mucc compiles
    for the current device when none is named)."""
    import torch

    torch.cuda.set_device(int(device_id))
