"""Element types, spelled the way Mirage's Python API spells them (``mucc.float16`` …)."""

from __future__ import annotations

from typing import Any

__all__ = [
    "dtype", "float16", "bfloat16", "float32", "float64", "int8", "int16", "int32",
    "int64", "uint8", "uint16", "uint32", "uint64", "convert_dtype_to_torch_type",
    "convert_torch_type_to_dtype",
]


class dtype:  # noqa: N801 - Mirage's name
    """An element type. Compares equal to another of the same name (``mucc.float16 ==
    mucc.dtype("fp16")``); ``str()`` is Mirage's name, :attr:`mucc_name` mucc's."""

    __slots__ = ("name", "mucc_name")

    def __init__(self, name: str) -> None:
        if name not in _MIRAGE_TO_MUCC:
            raise ValueError(f"unknown dtype {name!r} (known: {', '.join(_MIRAGE_TO_MUCC)})")
        self.name: str = name
        self.mucc_name: str = _MIRAGE_TO_MUCC[name]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, dtype) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"mucc.dtype({self.name!r})"

    def is_floating(self) -> bool:
        return self.mucc_name in ("f16", "bf16", "f32", "f64")


_MIRAGE_TO_MUCC = {
    "fp16": "f16", "bf16": "bf16", "fp32": "f32", "fp64": "f64",
    "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64",
    "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64",
}

float16 = dtype("fp16")
bfloat16 = dtype("bf16")
float32 = dtype("fp32")
float64 = dtype("fp64")
int8 = dtype("int8")
int16 = dtype("int16")
int32 = dtype("int32")
int64 = dtype("int64")
uint8 = dtype("uint8")
uint16 = dtype("uint16")
uint32 = dtype("uint32")
uint64 = dtype("uint64")

_BY_MUCC = {d.mucc_name: d for d in (float16, bfloat16, float32, float64, int8, int16,
                                       int32, int64, uint8, uint16, uint32, uint64)}


def from_mucc_name(name: str) -> dtype:
    """The dtype mucc calls ``name`` (``f16``, ``bf16`` …)."""
    try:
        return _BY_MUCC[name]
    except KeyError:
        raise ValueError(f"mucc dtype {name!r} has no Python spelling") from None


def as_dtype(x: Any) -> dtype:
    """A :class:`dtype` from a dtype, Mirage's name, mucc's name, or a torch dtype."""
    if isinstance(x, dtype):
        return x
    if isinstance(x, str):
        if x in _MIRAGE_TO_MUCC:
            return dtype(x)
        return from_mucc_name(x)
    return convert_torch_type_to_dtype(x)


def _torch_table() -> dict[str, Any]:
    import torch

    table = {
        "f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32,
        "f64": torch.float64, "i8": torch.int8, "u8": torch.uint8, "i16": torch.int16,
        "i32": torch.int32, "i64": torch.int64,
    }
    for name, attr in (("u16", "uint16"), ("u32", "uint32"), ("u64", "uint64")):
        if hasattr(torch, attr):
            table[name] = getattr(torch, attr)
    return table


def convert_dtype_to_torch_type(dt: Any) -> Any:
    """The torch dtype of ``dt`` (a :class:`dtype` or a name)."""
    d = as_dtype(dt)
    try:
        return _torch_table()[d.mucc_name]
    except KeyError:
        raise ValueError(f"{d} has no torch dtype in this torch version") from None


def convert_torch_type_to_dtype(t: Any) -> dtype:
    """The :class:`dtype` of torch dtype ``t``."""
    for name, tt in _torch_table().items():
        if tt == t:
            return _BY_MUCC[name]
    raise ValueError(f"torch dtype {t} has no mucc dtype")
