"""The comparison with the float64 reference on the GPU (three fused reduction kernels) gives the
NumPy path's answers: the same reasons, and errors equal to rounding."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autogen.core.compare import relative_error

pytestmark = pytest.mark.gpu

NAN, INF = np.nan, np.inf


def cases():
    rng = np.random.default_rng(7)
    ref = rng.standard_normal(10_007)
    near = ref + 1e-4 * rng.standard_normal(ref.size)
    yield "float32, close", near.astype(np.float32), ref, None
    yield "float16, close", near.astype(np.float16), ref, None
    yield "float64, magnitude given", near, ref, np.abs(ref) + 1.0
    yield "float32, magnitude in float32", near.astype(np.float32), ref, (np.abs(ref) + 1.0).astype(np.float32)
    yield "int32 against integers", np.arange(1000, dtype=np.int32), np.arange(1000, dtype=np.float64) + 0.5, None
    yield "2-D", near.reshape(-1, 1).astype(np.float32)[:10_000].reshape(100, 100), ref[:10_000].reshape(100, 100), None
    grid = ref[:10_000].reshape(100, 100)
    yield "2-D, magnitude given", (grid + 1e-4).astype(np.float32), grid, np.abs(grid) + 1.0
    yield "2-D, magnitude broadcast", (grid + 1e-4).astype(np.float32), grid, np.abs(grid[:, :1]) + 1.0
    yield "column against row-major", (grid + 1e-4).astype(np.float32)[:, :1], grid[:, :1].copy(), None
    yield "specials matched", np.array([1.0, NAN, -INF, INF], np.float32), np.array([1.0, NAN, -INF, INF]), None
    yield "NaN where finite", np.array([NAN, 2.0, 3.0], np.float32), np.array([1.0, 2.0, 3.0]), None
    yield "inf where finite", np.array([1.0, INF, INF], np.float16), np.array([1.0, 2.0, 3.0]), None
    yield "finite where NaN", np.array([1.0, 0.0, -INF]), np.array([1.0, NAN, -INF]), None
    yield "wrong infinity", np.array([1.0, INF]), np.array([1.0, -INF]), None
    yield "reference all zero", np.array([1e-6, 0.0]), np.array([0.0, 0.0]), None
    yield "zero reference, magnitude given", np.array([1e-6]), np.array([0.0]), np.array([1.0])
    # Past autogen.core.compare.REDUCE_ROW (2^14) elements the kernels reduce row by row.
    big = rng.standard_normal(3 * (1 << 14) + 5)
    big_near = big + 1e-4 * rng.standard_normal(big.size)
    yield "rows and a last short row", big_near.astype(np.float32), big, None
    yield "whole rows, magnitude given", big_near[:2 << 14].astype(np.float16), big[:2 << 14], np.abs(big[:2 << 14]) + 1.0
    nan_in_last = big_near.copy()
    nan_in_last[-2] = NAN
    yield "NaN in the last row", nan_in_last.astype(np.float32), big, None
    inf_in_middle = big_near.copy()
    inf_in_middle[(1 << 14) + 3] = INF
    yield "inf in a middle row", inf_in_middle, big, None


@pytest.mark.parametrize("name, out, ref, magnitude", list(cases()), ids=[c[0] for c in cases()])
def test_the_gpu_comparison_answers_as_numpy_does(name, out, ref, magnitude):
    import cupy

    expected_error, expected_reason = relative_error(np, out, ref, magnitude)
    error, reason = relative_error(cupy, cupy.asarray(out), cupy.asarray(ref),
                                   None if magnitude is None else cupy.asarray(magnitude))
    assert reason == expected_reason
    if math.isnan(expected_error):
        assert math.isnan(error)
    else:
        # NumPy takes the norm of a float32 magnitude in float32; the kernels sum in float64.
        assert error == pytest.approx(expected_error, rel=1e-6, abs=1e-300)


def test_checks_run_without_cub_reductions_and_restore_them():
    import cupy
    from cupy._core import _accelerator

    from autogen.core.registry import get_family
    from autogen.gpu.measure import validate

    family = get_family("sgemv")
    problem = family.problem(m=4096, n=128)  # checked on the device
    seen = []

    def launch(inputs):
        seen.append(list(_accelerator.get_reduction_accelerators()))
        result = inputs["alpha"] * (inputs["A"] @ inputs["x"])
        inputs["y"][...] = result if inputs["beta"] == 0 else result + inputs["beta"] * inputs["y"]

    before = list(_accelerator.get_reduction_accelerators())
    check = validate(family, problem, launch, cupy, cupy.random.default_rng(1))
    assert check.ok, check.reason
    assert seen and all(s == [] for s in seen)
    assert list(_accelerator.get_reduction_accelerators()) == before
