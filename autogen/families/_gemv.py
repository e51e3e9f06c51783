"""What the GEMV families (sgemv, hgemv) share: the row-group geometry, the pruning of row groups
that overshoot short rows, the Python call's arguments, and GemvFamily: the float64 reference,
byte and flop counts and example call of y = alpha * A x + beta * y. Registers no family (a
private module).

Geometry. A row group of threads_per_row lanes computes rows_per_group rows, its lanes splitting
the columns; a block of warps_per_block warps holds 32 * warps_per_block / threads_per_row groups
(threads_per_row > 32: one group spans several warps, which sum across warps at the end).
"""

from __future__ import annotations

import numpy as np

from autogen.core.dtypes import DTYPES, to_float64, to_storage
from autogen.core.family import Family
from autogen.core.problem import Config, Problem


def row_fits_block(p) -> str | None:
    if p["threads_per_row"] > 32 * p["warps_per_block"]:
        return (f"threads_per_row={p['threads_per_row']} needs warps_per_block >= "
                f"{p['threads_per_row'] // 32}")
    return None


def reduce_only_across_warps(p) -> str | None:
    # Inside one warp only shuffles are used, so reduce=smem would duplicate a shfl variant.
    if p["reduce"] == "smem" and p["threads_per_row"] <= 32:
        return "reduce=smem only differs from shfl when threads_per_row > 32"
    return None


def rows_per_block(params) -> int:
    """Rows one block computes: 32 * warps_per_block / threads_per_row row groups of
    rows_per_group rows each."""
    return 32 * params["warps_per_block"] // params["threads_per_row"] * params["rows_per_group"]


def overshoot_reason(n: int, threads_per_row: int, width: int, unroll: int, width_name: str) -> str | None:
    """Why a row group of threads_per_row lanes loading `width` elements each (`unroll` loads in
    flight) is not worth timing on rows of n elements, or None."""
    # A row group whose single load step covers over twice the row leaves most lanes idle.
    step = threads_per_row * width
    if step > 2 * max(n, 32):
        return f"threads_per_row*{width_name}={step} spans over twice n={n}"
    if unroll > 1 and step * unroll > 2 * max(n, 32):
        return f"unroll={unroll} reaches past n={n} on the first step"
    return None


def gemv_shapes(problem: Problem) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """The shapes of A, x and y: x and y are vectors when there is one."""
    m, n, b = problem["m"], problem["n"], problem.shape.get("batch", 1)
    return (m, n), ((n,) if b == 1 else (n, b)), ((m,) if b == 1 else (m, b))


def gemv_arguments(A, x, alpha=1.0, beta=0.0, y=None):
    """The Python call's arguments, in order: autogen.sgemv and autogen.hgemv take the same."""
    return A, x, alpha, beta, y


class GemvFamily(Family):
    """y = alpha * A x + beta * y, A (m x n) row-major, x holding `batch` vectors (n x batch, or
    a vector of n; a family without the dimension has one), y (m x batch, or m) in A's dtype."""

    outputs = ("y",)

    def rows_per_block(self, config: Config) -> int:
        return rows_per_block(config)

    def reference(self, problem: Problem, inputs: dict, xp=np):
        # The values the kernel reads (the inputs as stored), multiplied in float64.
        A, x = (to_float64(xp, inputs[name], problem.dtype) for name in ("A", "x"))
        result = inputs["alpha"] * (A @ x)
        if inputs["beta"] != 0.0:
            result += inputs["beta"] * to_float64(xp, inputs["y"], problem.dtype)
        return result

    def bytes_moved(self, problem: Problem, case: dict | None = None) -> int:
        m, n, b = problem["m"], problem["n"], problem.shape.get("batch", 1)
        reads_y = case is not None and case.get("beta", 0.0) != 0.0
        return DTYPES[problem.dtype].itemsize * (m * n + n * b + m * b + (m * b if reads_y else 0))

    def flops(self, problem: Problem) -> int:
        return 2 * problem["m"] * problem["n"] * problem.shape.get("batch", 1)

    def example_call(self, problem: Problem, cupy):
        rng = cupy.random.default_rng(0)
        a_shape, x_shape, y_shape = gemv_shapes(problem)
        A, x = (to_storage(cupy, rng.random(shape, dtype=cupy.float32) - 0.5, problem.dtype)
                for shape in (a_shape, x_shape))
        return (A, x), {"y": cupy.empty(y_shape, dtype=DTYPES[problem.dtype].storage)}
