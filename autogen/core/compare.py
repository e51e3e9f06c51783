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


def rounding_error(xp, ref, dtype: str, magnitude=None) -> float:
    """The relative error (as relative_error measures it) of the float64 reference `ref` rounded
    to `dtype` (subnormals included) and back: what an output stored in that dtype cannot avoid.
    0 where the rounded reference overflows to inf: then no output of that dtype can be right."""
    with np.errstate(over="ignore", invalid="ignore"):  # NumPy warns on the overflow it returns
        rounded = round_trip(xp, ref, dtype)
    error, reason = relative_error(xp, rounded, ref, magnitude)
    return 0.0 if reason else error
