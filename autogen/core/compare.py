"""How outputs are compared with the float64 reference: the relative L2 error, and what rounding
to an output type cannot avoid (the rule that turns both into pass or fail is
autogen.gpu.measure.judge). Pure array maths (NumPy or CuPy through `xp`): no GPU, no timing."""

from __future__ import annotations

import math

import numpy as np

from autogen.core.dtypes import round_trip


def relative_error(xp, out, ref, magnitude=None) -> tuple[float, str]:
    """L2 error of `out` against float64 `ref`, relative to ||magnitude|| (default ||ref||), and
    why it fails (empty if it may pass)."""
    if hasattr(xp, "ReductionKernel"):
        return _relative_error_fused(xp, out, ref, magnitude)
    out64 = out.astype(xp.float64)
    finite_ref = xp.isfinite(ref)
    bad = int((~xp.isfinite(out64) & finite_ref).sum())
    if bad:
        return math.nan, f"{bad} of {out.size} outputs are NaN/inf (unwritten, or poisoned input read)"
    mismatched_special = int((~finite_ref & ~((out64 == ref) | (xp.isnan(out64) & xp.isnan(ref)))).sum())
    if mismatched_special:
        return math.nan, f"{mismatched_special} outputs differ where the reference is NaN/inf"
    out64 = xp.where(finite_ref, out64, 0.0)
    ref = xp.where(finite_ref, ref, 0.0)
    scale = ref if magnitude is None else xp.where(finite_ref, magnitude, 0.0)
    norm = float(xp.linalg.norm(scale))
    diff = float(xp.linalg.norm(out64 - ref))
    return (diff / norm if norm > 0 else diff), ""


# The same rule on the GPU in three reduction kernels instead of about twenty CuPy operations:
# each operation is a kernel that CuPy compiles on its first use, so with an empty CuPy cache the
# first check on the device paid seconds for them, in every GPU worker at once (issue 38: that start
# does not split over GPUs). Measured: docs/distributed.md, "The first check on a device".
_FUSED_PREAMBLE = r"""
__device__ unsigned long long special_code(double o, double r) {
    // 1 counts an output that is NaN/inf where the reference is finite; 1 << 32 one that differs
    // from a NaN/inf reference (NaN matches NaN).
    if (isfinite(r)) return isfinite(o) ? 0ull : 1ull;
    return (o == r || (isnan(o) && isnan(r))) ? 0ull : (1ull << 32);
}
__device__ double masked_square(double value, double mask) { return isfinite(mask) ? value * value : 0.0; }
"""
_FUSED: dict[str, object] = {}


def _fused_kernels(xp) -> tuple:
    if not _FUSED:
        kernel = lambda params, expr, name: xp.ReductionKernel(  # noqa: E731
            params, "float64 total" if "code" not in name else "uint64 total", expr, "a + b", "total = a", "0",
            name, preamble=_FUSED_PREAMBLE)
        _FUSED["codes"] = kernel("T out, float64 ref", "special_code((double)out, ref)", "autogen_special_codes")
        _FUSED["diff"] = kernel("T out, float64 ref", "masked_square((double)out - ref, ref)", "autogen_masked_diff")
        _FUSED["scale"] = kernel("T scale, float64 ref", "masked_square((double)scale, ref)", "autogen_masked_scale")
    return _FUSED["codes"], _FUSED["diff"], _FUSED["scale"]


def _relative_error_fused(xp, out, ref, magnitude) -> tuple[float, str]:
    """relative_error's rule on CuPy arrays (broadcast as NumPy's path broadcasts them); the GPU
    tests hold it to the NumPy path's answers."""
    codes_kernel, diff_kernel, scale_kernel = _fused_kernels(xp)
    shape = np.broadcast_shapes(out.shape, ref.shape)
    flat = lambda a, dtype=None: xp.ascontiguousarray(xp.broadcast_to(xp.asarray(a, dtype=dtype), shape)).ravel()  # noqa: E731
    size, out, ref = out.size, flat(out), flat(ref, xp.float64)
    codes = int(_reduce_all(codes_kernel, out, ref))
    if codes & 0xFFFFFFFF:
        return math.nan, f"{codes & 0xFFFFFFFF} of {size} outputs are NaN/inf (unwritten, or poisoned input read)"
    if codes >> 32:
        return math.nan, f"{codes >> 32} outputs differ where the reference is NaN/inf"
    scale = ref if magnitude is None else flat(magnitude)
    norm = math.sqrt(float(_reduce_all(scale_kernel, scale, ref)))
    diff = math.sqrt(float(_reduce_all(diff_kernel, out, ref)))
    return (diff / norm if norm > 0 else diff), ""


# Elements a row of _reduce_all's rows: each row is reduced by blocks of its own.
REDUCE_ROW = 1 << 14


def _reduce_all(kernel, *flat_arrays):
    """`kernel` over every element of the equally long flat CuPy arrays, as one NumPy scalar. Without
    CUB (checks run under autogen.gpu.measure.plain_reductions) CuPy reduces a whole array in one
    block, milliseconds a million elements (measured: docs/internals.md, "How a variant is judged");
    in rows of REDUCE_ROW every row gets blocks of its own, and the rows' partial results are added
    on the host. The last, shorter row goes the same way as a row of its own (the same 2-D kernel:
    nothing more to compile)."""
    size = flat_arrays[0].size
    whole = size - size % REDUCE_ROW
    pieces = []
    if whole:
        pieces.append(kernel(*(a[:whole].reshape(-1, REDUCE_ROW) for a in flat_arrays), axis=1))
    if size > whole:
        pieces.append(kernel(*(a[whole:].reshape(1, -1) for a in flat_arrays), axis=1))
    return sum(piece.get().sum() for piece in pieces)


def rounding_error(xp, ref, dtype: str, magnitude=None) -> float:
    """The relative error (as relative_error measures it) of the float64 reference `ref` rounded
    to `dtype` (subnormals included) and back: what an output stored in that dtype cannot avoid.
    0 where the rounded reference overflows to inf: then no output of that dtype can be right."""
    with np.errstate(over="ignore", invalid="ignore"):  # NumPy warns on the overflow it returns
        rounded = round_trip(xp, ref, dtype)
    error, reason = relative_error(xp, rounded, ref, magnitude)
    return 0.0 if reason else error
