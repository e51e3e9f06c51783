"""The softmax family on the CPU: rendering, naming, geometry, reference (special values
included) and inputs."""

import math

import numpy as np
import pytest

from conftest import nvrtc_usable

from autogen.gpu.compile import compile_cubin
from autogen.errors import UsageError
from autogen.core.registry import get_family
from autogen.core.compare import relative_error
from autogen.gpu.measure import validate
from autogen.core.render import render

FAMILY = get_family("softmax")
CONFIGS = list(FAMILY.space.enumerate())


def _config(**overrides):
    return FAMILY.space.check({**FAMILY.default_params, **overrides})


def test_space_is_the_documented_size_and_holds_every_strategy():
    # (4 row widths inside a warp + 5 across warps x 2 reductions) x ((vector_width, unroll)
    # pairs: 17 with at most 32 values per thread in registers + 14 with at most 16 on the
    # re-read path) x 2 pass schemes.
    assert len(CONFIGS) == (4 + 5 * 2) * (17 + 14) * 2 == 868
    widths = {c["threads_per_row"] for c in CONFIGS}
    assert {4, 32, 1024} <= widths  # several rows per warp, a warp per row, a block per row
    assert {(c["row_cache"], c["passes"]) for c in CONFIGS} == {
        ("registers", "online"), ("registers", "two_pass"), ("global", "online"), ("global", "two_pass")}
    assert all(c["reduce"] == "shfl" for c in CONFIGS if c["threads_per_row"] <= 32)


def test_procedural_name_spells_every_parameter():
    assert (FAMILY.kernel_name("float32", FAMILY.default_config())
            == "softmax_f32_tpr32_vw4_u8_rshfl_rcregisters_ponline")


@pytest.mark.parametrize("rows", [1, 3, 7, 1000, 16384, 2**31 - 1])
def test_launch_grid_covers_every_row(rows):
    problem = FAMILY.problem(rows=rows, cols=37)
    for config in CONFIGS[::7]:
        launch = FAMILY.launch(problem, config)
        per_block = FAMILY.rows_per_block(config)
        assert launch.block == (max(config["threads_per_row"], 128), 1, 1)
        assert launch.block[0] == per_block * config["threads_per_row"]
        assert (launch.grid[0] - 1) * per_block < rows <= launch.grid[0] * per_block
        assert launch.grid[0] <= 2**31 - 1


def _softmax_loop(row):
    """Softmax of one row with plain Python floats, as torch defines it for special values."""
    finite_max = max(row)
    if finite_max == -math.inf:
        return [math.nan] * len(row)
    exps = [math.exp(v - finite_max) if v != -math.inf else 0.0 for v in row]
    total = sum(exps)
    return [e / total for e in exps]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("rows, cols", [(1, 1), (3, 5), (7, 33)])
def test_reference_matches_a_plain_loop_for_every_case(dtype, rows, cols):
    problem = FAMILY.problem(dtype, rows=rows, cols=cols)
    rng = np.random.default_rng(1)
    for case in FAMILY.validation_cases(problem):
        inputs = FAMILY.make_inputs(problem, np, rng, case)
        expected = [_softmax_loop([float(v) for v in row]) for row in inputs["x"]]
        result = FAMILY.reference(problem, inputs)
        assert result.dtype == np.float64 and result.shape == (rows, cols)
        np.testing.assert_allclose(result, expected, rtol=1e-12, equal_nan=True)


def test_special_values_in_the_reference():
    problem = FAMILY.problem(rows=4, cols=3)
    inf = math.inf
    x = np.array([[-inf, -inf, -inf],     # all -inf: NaN, as torch.softmax gives
                  [1e4, -1e4, 0.0],       # large magnitudes: no overflow
                  [-inf, 2.0, 2.0],       # -inf entries: exactly 0
                  [-inf, -inf, 5.0]], dtype=np.float32)
    result = FAMILY.reference(problem, {"x": x})
    assert np.isnan(result[0]).all()
    np.testing.assert_allclose(result[1], [1.0, 0.0, 0.0], atol=1e-300)
    assert result[2].tolist() == [0.0, 0.5, 0.5]
    assert result[3].tolist() == [0.0, 0.0, 1.0]


def test_validation_accepts_nan_only_where_the_reference_is_nan():
    ref = np.array([[math.nan, math.nan], [0.25, 0.75]])
    good = np.array([[math.nan, math.nan], [0.25, 0.75]], dtype=np.float32)
    zeroed = np.array([[0.0, 0.0], [0.25, 0.75]], dtype=np.float32)
    unwritten = np.array([[math.nan, math.nan], [math.nan, 0.75]], dtype=np.float32)
    assert relative_error(np, good, ref) == (0.0, "")
    assert relative_error(np, zeroed, ref)[1]  # the all -inf row must stay NaN
    assert relative_error(np, unwritten, ref)[1]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_inputs_hold_the_special_values_and_the_output_is_poisoned(dtype):
    problem = FAMILY.problem(dtype, rows=64, cols=1024)
    rng = np.random.default_rng(2)
    uniform = FAMILY.make_inputs(problem, np, rng, {"values": "uniform"})
    large = FAMILY.make_inputs(problem, np, rng, {"values": "large"})
    neg_inf = FAMILY.make_inputs(problem, np, rng, {"values": "neg_inf"})
    for inputs in (uniform, large, neg_inf):
        assert inputs["x"].dtype == np.dtype(dtype) and inputs["y"].dtype == np.dtype(dtype)
        assert np.isnan(inputs["y"]).all()
        assert not np.isnan(inputs["x"]).any() and not np.isposinf(inputs["x"]).any()
    assert np.abs(uniform["x"]).max() <= 0.5  # fp16 may round 0.4999 up to 0.5
    assert 1000 < np.abs(large["x"]).max() <= 5000  # needs the max subtraction; fits fp16
    assert np.isneginf(neg_inf["x"][32]).all()  # the all -inf row
    fraction = np.isneginf(neg_inf["x"]).mean()
    assert 0.2 < fraction < 0.35
    assert not np.array_equal(uniform["x"], FAMILY.make_inputs(problem, np, rng, {"values": "uniform"})["x"])


def test_tolerances_per_dtype():
    assert FAMILY.tolerance_for(FAMILY.problem("float32", rows=2, cols=2)) == 1e-5
    assert FAMILY.tolerance_for(FAMILY.problem("float16", rows=2, cols=2)) == 1e-3
    # fp16 output rounding alone (2^-11 relative at most) stays under the fp16 tolerance.
    rng = np.random.default_rng(6)
    exact = rng.random(4096)
    rounded = exact.astype(np.float16)
    assert relative_error(np, rounded, exact)[0] < 2.0**-11 < FAMILY.tolerance_for(FAMILY.problem("float16", rows=1, cols=1))


def _fp32_softmax(inputs, rounding="nearest"):
    """What a correct kernel computes: fp32 arithmetic, the output rounded once to y's type (or,
    with rounding="toward_zero", chopped: a kernel that truncates instead of rounding)."""
    x = inputs["x"].astype(np.float32)
    with np.errstate(invalid="ignore"):  # the row of only -inf: NaN, as the reference
        e = np.exp(x - x.max(axis=1, keepdims=True))
        y = e / e.sum(axis=1, keepdims=True, dtype=np.float32)
    out = y.astype(inputs["y"].dtype)
    if rounding == "toward_zero":
        away = np.abs(out.astype(np.float32)) > np.abs(y)
        out[away] = np.nextafter(out[away], out.dtype.type(0))
    inputs["y"][...] = out


@pytest.mark.parametrize("rows, cols", [(1, 128256), (3, 100003)])
def test_vocabulary_rows_in_fp16_pass_when_correctly_rounded(rows, cols):
    # Probabilities near 1/cols are fp16 subnormals (under 2^-14), stored with a fixed spacing of
    # 2^-24: the float64 answer correctly rounded is already ~2e-3 from it, over the 1e-3 that
    # failed every variant of `tune softmax --rows 32 --cols 128256 --dtype float16`.
    problem = FAMILY.problem("float16", rows=rows, cols=cols)
    check = validate(FAMILY, problem, _fp32_softmax, np, np.random.default_rng(3))
    assert check.ok, check.reason
    assert FAMILY.tolerance_for(problem) < check.error < 3e-3
    # A kernel that truncates its fp16 output doubles that rounding error: it still fails.
    check = validate(FAMILY, problem, lambda inputs: _fp32_softmax(inputs, "toward_zero"), np,
                     np.random.default_rng(3))
    assert not check.ok and "the reference rounded to the output type" in check.reason
    # So does a result 0.5% off, and an element left unwritten.

    def scaled(inputs):
        _fp32_softmax(inputs)
        inputs["y"] *= np.float16(1.005)
    assert not validate(FAMILY, problem, scaled, np, np.random.default_rng(3)).ok

    def one_unwritten(inputs):
        _fp32_softmax(inputs)
        inputs["y"][0, -1] = np.nan
    check = validate(FAMILY, problem, one_unwritten, np, np.random.default_rng(3))
    assert not check.ok and "NaN" in check.reason


def test_fp32_vocabulary_rows_keep_the_fp32_tolerance():
    problem = FAMILY.problem("float32", rows=1, cols=128256)
    check = validate(FAMILY, problem, _fp32_softmax, np, np.random.default_rng(4))
    assert check.ok and check.error < 1e-6

    def off_by_2e5(inputs):
        _fp32_softmax(inputs)
        inputs["y"] *= np.float32(1 + 2e-5)
    check = validate(FAMILY, problem, off_by_2e5, np, np.random.default_rng(4))
    assert not check.ok and check.reason.endswith("> 1e-05")


def test_bytes_moved_reads_and_writes_the_matrix_once():
    assert FAMILY.bytes_moved(FAMILY.problem("float32", rows=16384, cols=1024)) == 2 * 4 * 16384 * 1024
    assert FAMILY.bytes_moved(FAMILY.problem("float16", rows=1024, cols=32768)) == 2 * 2 * 1024 * 32768


@pytest.mark.parametrize("dims, fragment", [
    ({"rows": 0, "cols": 16}, "rows must be between 1"),
    ({"rows": 16, "cols": -3}, "cols must be between 1"),
    ({"rows": 16}, "missing cols"),
    ({"rows": 16, "cols": 16, "n": 2}, "unknown n"),
    ({"rows": 1, "cols": 2**31}, "cols must be between 1"),
])
def test_bad_shapes_are_usage_errors(dims, fragment):
    with pytest.raises(UsageError) as info:
        FAMILY.problem(**dims)
    assert fragment in str(info.value)


def test_registers_variants_are_pruned_where_the_row_does_not_fit():
    problem = FAMILY.problem(rows=1024, cols=32768)
    small = _config(threads_per_row=32, vector_width=4, unroll=8, row_cache="registers")
    assert "does not fit the 1024 register slots" in FAMILY.reject_reason(problem, small)
    assert FAMILY.reject_reason(problem, _config(threads_per_row=32, vector_width=4, unroll=4,
                                                 row_cache="global")) is None
    block_row = _config(threads_per_row=1024, vector_width=4, unroll=8, row_cache="registers")
    assert FAMILY.reject_reason(problem, block_row) is None
    # A register capacity of twice the row is the same work with more registers.
    loose = _config(threads_per_row=32, vector_width=4, unroll=8, row_cache="registers")
    assert "unroll=4 fits it" in FAMILY.reject_reason(FAMILY.problem(rows=4, cols=500), loose)
    # Rows that cannot be read with vectors are not held in registers by vector variants.
    odd = FAMILY.problem(rows=2, cols=4099)
    assert "scalar re-read path" in FAMILY.reject_reason(odd, _config(threads_per_row=1024, unroll=2))
    assert FAMILY.reject_reason(odd, _config(threads_per_row=1024, vector_width=1, unroll=8)) is None


@pytest.mark.parametrize("rows, cols", [(1, 1), (3, 5), (2, 4099), (16384, 1024), (1024, 32768), (32768, 128)])
def test_every_shape_keeps_variants_of_each_strategy(rows, cols):
    problem = FAMILY.problem(rows=rows, cols=cols)
    kept = [c for c in CONFIGS if FAMILY.reject_reason(problem, c) is None]
    assert {c["row_cache"] for c in kept} == {"registers", "global"}
    assert {c["passes"] for c in kept} == {"online", "two_pass"}


def test_host_launcher_uses_the_plan_geometry():
    config = _config(threads_per_row=8)
    source = render(FAMILY, "float16", config, host_launcher=True)
    name = FAMILY.kernel_name("float16", config)
    assert f"cudaError_t {name}_launch(const void* x, void* y, int rows, int cols, cudaStream_t stream)" in source
    assert "+ 16 - 1) / 16)" in source and f"{name}<<<blocks, 128, 0, stream>>>" in source  # 128 / 8 rows per block
    assert f"{name}_launch(" not in render(FAMILY, "float16", config)


@pytest.mark.skipif(not nvrtc_usable(), reason="NVRTC not usable through CuPy here")
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("overrides", [
    {},
    {"threads_per_row": 4, "vector_width": 8, "unroll": 4, "passes": "two_pass"},
    {"threads_per_row": 1024, "vector_width": 2, "unroll": 8, "reduce": "smem", "row_cache": "global"},
    {"threads_per_row": 256, "vector_width": 1, "unroll": 1, "reduce": "smem", "passes": "two_pass"},
])
def test_nvrtc_compiles_sample_variants(dtype, overrides, tmp_path):
    cubin = compile_cubin(render(FAMILY, dtype, _config(**overrides)), "sm_90", str(tmp_path))
    assert len(cubin) > 0
