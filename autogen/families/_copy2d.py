"""What the transpose and concat families share: both move a 2-D array's elements without
changing them (fp32, fp16 or bf16 moved as bit patterns), so their checks are exact, their
floor is the copy bandwidth, and their operands are 2-D row-major CUDA arrays.
Templates: templates/copy2d.cuh.j2 (the Pack both kernels access memory with).
"""

from __future__ import annotations

import math

import numpy as np

from autogen.core.dtypes import DTYPES, to_float64
from autogen.core.operands import device_array, dtype_name, random_uniform
from autogen.core.problem import Config, Problem
from autogen.core.space import Param

DTYPES_MOVED = ("float32", "float16", "bfloat16")
MAX_PACK_BYTES = 16  # one access at most: the widest global load and store


def vector_width_param() -> Param:
    return Param("vector_width", (1, 2, 4, 8), "vw",
                 "elements per access where rows and pointers keep it aligned (16 bytes at most: 4 in fp32, "
                 "8 in fp16/bf16); single elements elsewhere")


def packs_whole(p) -> str | None:
    """Space constraint: a thread's elements are whole packs."""
    if p["elements_per_thread"] % p["vector_width"]:
        return f"elements_per_thread={p['elements_per_thread']} is not a multiple of vector_width={p['vector_width']}"
    return None


def pack_too_wide(problem: Problem, config: Config) -> str | None:
    """Pruning: a Pack wider than one 16-byte access."""
    pack = config["vector_width"] * DTYPES[problem.dtype].itemsize
    if pack > MAX_PACK_BYTES:
        return f"vector_width={config['vector_width']} is {pack} bytes of {problem.dtype}: over one 16-byte access"
    return None


def elements(problem: Problem) -> int:
    return problem["rows"] * problem["cols"]


def bytes_moved(problem: Problem) -> int:
    """Every element read once and written once."""
    return 2 * elements(problem) * DTYPES[problem.dtype].itemsize


def random_matrix(xp, rng, shape: tuple[int, int], dtype: str):
    """Fresh values in [-0.5, 0.5) as stored in `dtype`: never NaN, so a NaN left in an output is
    poison that was not overwritten."""
    return random_uniform(xp, rng, shape, dtype)


def poisoned(xp, shape: tuple[int, ...], dtype: str):
    """An output of `dtype` filled with NaN (bfloat16: a NaN bit pattern)."""
    if dtype == "bfloat16":
        return xp.full(shape, 0x7FC0, dtype=xp.uint16)
    return xp.full(shape, xp.nan, dtype=DTYPES[dtype].storage)


def exact_compare(problem: Problem, got, expected, xp) -> tuple[float, str]:
    """(0, "") when every output element equals the float64 reference (a copy is exact, so any
    difference, a NaN of the poison included, fails); else (inf, how many and the first)."""
    values = to_float64(xp, got, problem.dtype)
    wrong = xp.flatnonzero((values != expected).ravel())
    if int(wrong.size) == 0:
        return 0.0, ""
    first = int(wrong[0])
    got_first, want_first = float(values.ravel()[first]), float(expected.ravel()[first])
    unwritten = " (poison left: unwritten)" if math.isnan(got_first) else ""
    return math.inf, (f"{int(wrong.size)} of {values.size} elements differ (flat index {first}: got {got_first!r}, "
                      f"want {want_first!r}){unwritten}")


def reference_values(problem: Problem, array, xp=np):
    """An input's float64 values (the reference of a copy is its input, rearranged)."""
    return to_float64(xp, array, problem.dtype)


def matrix_operand(cupy, obj, name: str, dtypes: tuple[str, ...], device: int):
    """A 2-D C-contiguous CUDA array of one of `dtypes` (errors name the argument) and its dtype name."""
    array = device_array(cupy, obj, name, dtypes, 2, device)
    return array, dtype_name(array)


def rounded_up(value: int, step: int) -> int:
    return -(-value // step)


def offset_matrix(xp, matrix, offset: int):
    """`matrix` copied into a buffer `offset` elements longer and returned as the 2-D view past
    them: for offset 1 the data start off the 16-byte alignment of allocations, so vector paths
    must take their single-element path."""
    if not offset:
        return matrix
    buffer = xp.empty((matrix.size + offset,), dtype=matrix.dtype)
    view = buffer[offset:].reshape(matrix.shape)
    view[...] = matrix
    return view


def torch_warm_up(torch, dtype: str, call, shapes=((3, 5), (5, 3))) -> None:
    """Run a torch peer's `call(x, y)` once outside capture on small tensors of `dtype` (x and y
    of `shapes`), so that its CUDA kernel is loaded before a graph captures it."""
    kind = getattr(torch, DTYPES[dtype].torch_name)
    x = torch.zeros(shapes[0], dtype=kind, device="cuda")
    call(x, torch.empty(shapes[1], dtype=kind, device="cuda"))
    torch.cuda.synchronize()
