"""Validation logic on the CPU: numpy stands in for the GPU (validate is xp-generic)."""

import math

import numpy as np
import pytest

from autogen.core.registry import get_family
from autogen.gpu.measure import Timing, validate
from autogen.core.compare import relative_error
from family_checks import judged_with_output

SGEMV = get_family("sgemv")


def numpy_sgemv(inputs, skip_last_row=False, read_y_when_beta_zero=False):
    A, x, y = inputs["A"], inputs["x"], inputs["y"]
    rows = A.shape[0] - (1 if skip_last_row else 0)
    result = inputs["alpha"] * (A[:rows] @ x)
    if inputs["beta"] != 0.0 or read_y_when_beta_zero:
        result = result + inputs["beta"] * y[:rows]
    y[:rows] = result


def test_a_correct_kernel_passes_every_case():
    check = validate(SGEMV, SGEMV.problem(m=100, n=37), numpy_sgemv, np, np.random.default_rng(0))
    assert check.ok and check.error < 1e-6


def test_an_unwritten_row_is_caught_by_the_poison():
    check = validate(SGEMV, SGEMV.problem(m=100, n=37), lambda i: numpy_sgemv(i, skip_last_row=True),
                     np, np.random.default_rng(0))
    assert not check.ok and "1 of 100 outputs are NaN" in check.reason


def test_reading_y_when_beta_is_zero_is_caught():
    # 0 * NaN is NaN: a kernel that reads y although beta = 0 leaks the poison.
    check = validate(SGEMV, SGEMV.problem(m=10, n=3), lambda i: numpy_sgemv(i, read_y_when_beta_zero=True),
                     np, np.random.default_rng(0))
    assert not check.ok and "NaN" in check.reason


def test_a_slightly_wrong_result_fails_the_tolerance():
    def off_by_a_little(inputs):
        numpy_sgemv(inputs)
        inputs["y"][3] += 1e-3

    check = validate(SGEMV, SGEMV.problem(m=64, n=64), off_by_a_little, np, np.random.default_rng(0))
    assert not check.ok and "relative L2 error" in check.reason


def test_relative_error_handles_special_values():
    ref = np.array([1.0, np.nan, -np.inf])
    assert relative_error(np, np.array([1.0, np.nan, -np.inf], np.float32), ref)[1] == ""
    assert "differ where the reference is NaN/inf" in relative_error(np, np.array([1.0, 0.0, -np.inf]), ref)[1]
    assert "outputs are NaN/inf" in relative_error(np, np.array([np.nan, np.nan, -np.inf]), ref)[1]


def test_magnitude_is_the_denominator_when_given():
    error, _ = relative_error(np, np.array([1e-6]), np.array([0.0]), magnitude=np.array([1.0]))
    assert error == 1e-6  # cancellation to zero does not blow the error up


def test_timing_summary():
    timing = Timing((3.0, 1.0, 2.0))
    assert timing.median_us == 2.0 and timing.spread_us == 2.0


def test_timing_sets_wait_for_their_generation_before_any_timing():
    # The timing graphs replay on non-blocking streams: the sets' kernels must be done first.
    from types import SimpleNamespace

    from autogen.gpu.measure import timing_sets

    events = []
    stream = SimpleNamespace(synchronize=lambda: events.append("synchronize"))
    xp = SimpleNamespace(cuda=SimpleNamespace(get_current_stream=lambda: stream))
    family = SimpleNamespace(timing_case=lambda problem: {}, bytes_moved=lambda problem, case: 100, outputs=(),
                             make_inputs=lambda problem, xp, rng, case: events.append("make") or {})
    sets = timing_sets(family, None, xp, None, cold=True, l2_bytes=100, free_bytes=10**6)
    assert len(sets) == 5 and events == ["make"] * 5 + ["synchronize"]


def test_timing_sets_rotate_cold_inputs_and_recycle_a_few_results():
    # As an allocator hands a freed result's block to the next call: inputs differ per set, the
    # results cycle through RECYCLED_RESULTS buffers.
    from types import SimpleNamespace

    from autogen.gpu.measure import RECYCLED_RESULTS, timing_sets

    family = SimpleNamespace(timing_case=lambda problem: {}, bytes_moved=lambda problem, case: 100, outputs=("y",),
                             make_inputs=lambda problem, xp, rng, case: {"x": object(), "y": object(), "n": 7})
    sets = timing_sets(family, None, np, None, cold=True, l2_bytes=1000, free_bytes=10**6)
    assert len(sets) == 41 > RECYCLED_RESULTS == 3
    assert len({id(s["x"]) for s in sets}) == len(sets)
    assert len({id(s["y"]) for s in sets}) == RECYCLED_RESULTS
    assert all(s["y"] is sets[i % RECYCLED_RESULTS]["y"] for i, s in enumerate(sets))
    hot = timing_sets(family, None, np, None, cold=False, l2_bytes=1000, free_bytes=10**6)
    assert len(hot) == 1


class _DeviceArray:
    """An array on the stand-in device: its NumPy data, reachable only by the stand-in kernel."""

    def __init__(self, data):
        self.data = data


class _UploadsOnly:
    """A stand-in for CuPy that can only upload and download: any array math done on it (what
    compiles CuPy's own kernels on a real GPU) raises AttributeError."""

    def __init__(self):
        self.uploads = 0

    def asarray(self, array):
        self.uploads += 1
        return _DeviceArray(np.array(array))

    def asnumpy(self, array):
        return array.data.copy()


def _device_sgemv(launched: list, **faults):
    def launch(inputs):
        launched.append({k for k, v in inputs.items() if isinstance(v, _DeviceArray)})
        numpy_sgemv({k: v.data if isinstance(v, _DeviceArray) else v for k, v in inputs.items()}, **faults)
    return launch


def test_a_small_problem_is_checked_on_the_host_with_no_array_math_on_the_device():
    from autogen.gpu.measure import checks_on_host

    problem = SGEMV.problem(m=100, n=37)
    assert checks_on_host(SGEMV, problem)
    device, launched = _UploadsOnly(), []
    check = validate(SGEMV, problem, _device_sgemv(launched), device, None, np.random.default_rng(0))
    assert check.ok and check.error < 1e-6
    # Each case: A, x and y uploaded, the kernel saw device arrays only.
    cases = len(SGEMV.validation_cases(problem))
    assert launched == [{"A", "x", "y"}] * cases and device.uploads == 3 * cases


def test_the_host_check_still_catches_an_unwritten_output():
    device = _UploadsOnly()
    check = validate(SGEMV, SGEMV.problem(m=100, n=37), _device_sgemv([], skip_last_row=True), device, None,
                     np.random.default_rng(0))
    assert not check.ok and "1 of 100 outputs are NaN" in check.reason


def test_large_or_heavy_problems_and_families_that_opt_out_are_checked_on_the_gpu(monkeypatch):
    from autogen.gpu.measure import checks_on_host

    assert not checks_on_host(SGEMV, SGEMV.problem(m=16384, n=1024))  # 64 MiB of A
    # 1.1 MB: on the device, where a check after the worker's rehearsal costs a tenth of NumPy's
    assert not checks_on_host(SGEMV, SGEMV.problem(m=16384, n=16))
    assert checks_on_host(SGEMV, SGEMV.problem(m=1024, n=16))  # 70 KB: NumPy is as fast
    sgemm = get_family("sgemm")
    monkeypatch.setattr(sgemm, "host_check_bytes", 4 << 20)  # a family that allows more bytes...
    assert not checks_on_host(sgemm, sgemm.problem(m=512, n=512, k=512))  # ...still not 268 MFLOP
    gelu = get_family("gelu")  # its cases read misaligned views, which an upload would realign
    assert not checks_on_host(gelu, gelu.problem("float32", n=1024, approximate="tanh"))


def test_timing_sets_of_a_small_problem_are_one_host_set_uploaded_to_each_buffer():
    from autogen.gpu.measure import timing_sets

    device = _UploadsOnly()
    problem = SGEMV.problem(m=100, n=37)
    sets = timing_sets(SGEMV, problem, device, None, cold=True, l2_bytes=1 << 20, free_bytes=1 << 30,
                       host_rng=np.random.default_rng(0))
    assert len(sets) > 1 and device.uploads == 3 * len(sets)
    first, last = sets[0], sets[-1]
    assert first["A"] is not last["A"] and np.array_equal(first["A"].data, last["A"].data)


# -- the rule: the family's tolerance plus what the output type costs the reference ----------------


def test_rounding_error_is_the_error_of_the_correctly_rounded_reference():
    from autogen.core.compare import rounding_error

    rng = np.random.default_rng(7)
    ref = rng.uniform(4e-6, 1.3e-5, 50_000)  # fp16 subnormals: a fixed spacing of 2^-24
    want = np.linalg.norm(ref.astype(np.float16).astype(np.float64) - ref) / np.linalg.norm(ref)
    assert rounding_error(np, ref, "float16") == want
    assert 1e-3 < want < 3e-3  # over softmax's fp16 tolerance: no kernel can do better
    # In the normal range the same rounding is a few 1e-4 at most; bfloat16 holds 8 bits.
    assert rounding_error(np, rng.uniform(0.5, 1.0, 10_000), "float16") < 2.0**-11
    assert 2.0**-11 < rounding_error(np, rng.uniform(0.5, 1.0, 10_000), "bfloat16") < 2.0**-8
    # Relative to a magnitude when given, over the finite references only.
    ref = np.array([1e-6, np.nan, 0.25])
    assert rounding_error(np, ref, "float16", np.array([1.0, 1.0, 1.0])) == pytest.approx(
        abs(float(np.float16(1e-6)) - 1e-6) / math.sqrt(2), rel=1e-12)
    # A reference past the type's range leaves no output right: nothing is allowed for it.
    assert rounding_error(np, np.array([1.0, 70000.0]), "float16") == 0.0


def test_only_half_outputs_get_the_rounding_of_their_type():
    softmax = get_family("softmax")
    x = np.zeros((1, 100_003), np.float32)
    for dtype, floor in (("float32", False), ("float16", True)):
        problem = softmax.problem(dtype, rows=1, cols=100_003)
        inputs = {"x": x.astype(dtype), "y": np.full(x.shape, np.nan, dtype)}
        expected = softmax.reference(problem, inputs, np)
        got = softmax.representable_error(problem, inputs, expected, None, np)
        assert (got > 1e-3) if floor else got == 0.0, (dtype, got)
    # reduce sums fp16 values into a float32 output: no half output, no floor.
    reduce = get_family("reduce")
    problem = reduce.problem("float16", n=5)
    inputs = reduce.make_inputs(problem, np, np.random.default_rng(0), reduce.validation_cases(problem)[0])
    assert reduce.output_dtype(problem, inputs, "out", np) == "float32"
    assert reduce.representable_error(problem, inputs, np.array([1e-7]), None, np) == 0.0


def test_a_correctly_rounded_subnormal_output_passes_and_a_chopped_one_fails():
    softmax = get_family("softmax")
    problem = softmax.problem("float16", rows=2, cols=100_003)  # probabilities near 1e-5: subnormals
    rng = np.random.default_rng(1)
    inputs = softmax.make_inputs(problem, np, rng, {"values": "uniform"})
    ref = softmax.reference(problem, inputs, np)
    error, reason = judged_with_output(softmax, problem, inputs, ref)
    assert reason == "" and error > softmax.tolerance_for(problem)  # failed the fixed 1e-3 before
    chopped = ref.astype(np.float16)
    away = np.abs(chopped.astype(np.float64)) > np.abs(ref)
    chopped[away] = np.nextafter(chopped[away], np.float16(0))  # rounded toward zero: twice the error
    error, reason = judged_with_output(softmax, problem, inputs, chopped.astype(np.float64))
    assert "relative L2 error" in reason and "the reference rounded to the output type" in reason
    error, reason = judged_with_output(softmax, problem, inputs, ref * 1.003)
    assert reason, error
    nan = ref.copy()
    nan[1, 7] = np.nan
    error, reason = judged_with_output(softmax, problem, inputs, nan)
    assert math.isnan(error) and "NaN" in reason


def test_fp32_outputs_keep_the_tolerance_alone():
    softmax = get_family("softmax")
    problem = softmax.problem("float32", rows=2, cols=100_003)
    inputs = softmax.make_inputs(problem, np, np.random.default_rng(2), {"values": "uniform"})
    ref = softmax.reference(problem, inputs, np)
    assert judged_with_output(softmax, problem, inputs, ref * (1 + 5e-6)) == (pytest.approx(5e-6), "")
    error, reason = judged_with_output(softmax, problem, inputs, ref * (1 + 2e-5))
    assert reason == f"relative L2 error {error:.3g} > 1e-05"


def test_nan_never_passes_whatever_the_family_compare_says():
    from types import SimpleNamespace

    from autogen.gpu.measure import judge

    family = SimpleNamespace(compare=lambda *args: (math.nan, ""), tolerance_for=lambda problem: 1.0,
                             representable_error=lambda *args: math.inf)
    error, reason = judge(family, None, {}, None, None, np)
    assert math.isnan(error) and "relative L2 error nan" in reason


def test_a_device_reduction_goes_row_by_row_and_adds_the_rows_on_the_host(monkeypatch):
    # _reduce_all hands CuPy's reduction kernel rows of REDUCE_ROW elements (a block each) and a last,
    # shorter row, never the whole array (one block without CUB); a stand-in kernel on NumPy arrays
    # records the shapes it is given and must add up to the whole.
    from autogen.core import compare

    monkeypatch.setattr(compare, "REDUCE_ROW", 8)
    shapes = []

    class Reduced(np.ndarray):
        def get(self):
            return np.asarray(self)

    def kernel(out, ref, axis):
        shapes.append(out.shape)
        return (out * ref).sum(axis=axis).view(Reduced)

    for size, expected_shapes in ((29, [(3, 8), (1, 5)]), (16, [(2, 8)]), (5, [(1, 5)]), (0, [])):
        shapes.clear()
        out, ref = np.arange(size, dtype=np.float64), np.linspace(1.0, 2.0, size)
        assert compare._reduce_all(kernel, out, ref) == pytest.approx((out * ref).sum())
        assert shapes == expected_shapes
