"""The one table of element types every family shares.

A dtype has the name users type (`float16`), the tag in kernel and export names (`f16`), the C
type a kernel sees, and the NumPy/CuPy dtype that stores it on the host and the device. NumPy and
CuPy have no bfloat16, so bfloat16 is stored as its 16-bit pattern (uint16) and converted here;
kernels handle half types as bit patterns too (templates/common.cuh.j2), so NVRTC needs no headers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DType:
    name: str  # what users type and the database stores: "bfloat16"
    tag: str  # in kernel names and exported symbols: "bf16"
    c_type: str  # the type a kernel loads: "unsigned short" for the half types (bit patterns)
    storage: str  # NumPy/CuPy dtype of the arrays holding it: "uint16" for bfloat16
    itemsize: int
    kind: str  # "float" | "int" | "uint"
    torch_name: str  # attribute of the torch module: "bfloat16"

    @property
    def is_half(self) -> bool:
        return self.name in ("float16", "bfloat16")


DTYPES: dict[str, DType] = {d.name: d for d in (
    DType("float32", "f32", "float", "float32", 4, "float", "float32"),
    DType("float16", "f16", "unsigned short", "float16", 2, "float", "float16"),
    DType("bfloat16", "bf16", "unsigned short", "uint16", 2, "float", "bfloat16"),
    DType("float64", "f64", "double", "float64", 8, "float", "float64"),
    DType("int32", "i32", "int", "int32", 4, "int", "int32"),
    DType("int64", "i64", "long long", "int64", 8, "int", "int64"),
    DType("uint32", "u32", "unsigned int", "uint32", 4, "uint", "uint32"),
    DType("uint8", "u8", "unsigned char", "uint8", 1, "uint", "uint8"),
)}

# Kept for readers of kernel names: dtype name -> tag.
DTYPE_TAGS = {name: d.tag for name, d in DTYPES.items()}


def dtype(name: str) -> DType:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(DTYPES)}") from None


def storage_dtype(name: str):
    """The NumPy dtype of arrays holding `name` (uint16 for bfloat16)."""
    return np.dtype(DTYPES[name].storage)


def to_storage(xp, values, name: str):
    """float32/float64 values -> an array of dtype `name` as stored (bfloat16: round to nearest
    even, kept as bit patterns)."""
    if name != "bfloat16":
        return values.astype(DTYPES[name].storage, copy=False)
    bits = values.astype(xp.float32, copy=False).view(xp.uint32)
    # Round to nearest even on the 16 bits dropped; NaN stays NaN (quiet bit forced).
    rounded = (bits + xp.uint32(0x7FFF) + ((bits >> 16) & xp.uint32(1))) >> 16
    nan = xp.isnan(values)
    return xp.where(nan, (bits >> 16) | xp.uint32(0x40), rounded).astype(xp.uint16)


def to_float64(xp, array, name: str):
    """An array stored as `name` -> float64 values (the reference's precision)."""
    if name == "bfloat16":
        return (array.astype(xp.uint32) << 16).view(xp.float32).astype(xp.float64)
    return array.astype(xp.float64)


def round_trip(xp, values, name: str):
    """float values as `name` can hold them, back in float64: what a kernel really reads."""
    return to_float64(xp, to_storage(xp, values, name), name)
