"""bias_mask_scale_add on the CPU: space, pruning, problem checks (bias_size divides n), the
float64 reference against an element-by-element formula, poisoned and misaligned inputs, the
launch geometry, and `autogen export --self-test` (through the database) built with nvcc with the
hook's host side run on the CPU. GPU behaviour: tests/families/test_gpu_elementwise.py."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from autogen.core.dtypes import to_float64, to_storage
from autogen.errors import UsageError
from autogen.core.registry import get_family
from autogen.core.render import render
from family_checks import checked_seeds, held, judged_with_output
from nvcc_tools import nvcc_or_skip
from test_export import H100, WERROR, build_library, run, run_export, store_winner
from test_gelu_family import bulk_visits, sweep_visits
from tuning_db import TuningDB

FAMILY = get_family("bias_mask_scale_add")
DTYPES = ("float32", "float16", "bfloat16")


def config(**params):
    return FAMILY.space.check({**FAMILY.default_params, **params})


def test_space_size_and_constraints():
    configs = list(FAMILY.space.enumerate())
    # 72 shapes (vw, ept, bs, math) per loop: grid_stride and one_pass x cache (ldg, last), bulk x ldg
    assert len(configs) == 72 * 2 * 2 + 72 == FAMILY.space.size()
    assert {(c["vector_width"], c["elements_per_thread"]) for c in configs} == {
        (1, 1), (1, 2), (1, 4), (2, 2), (2, 4), (2, 8), (4, 4), (4, 8), (8, 8)}
    assert FAMILY.space.param("elements_per_thread").choices == (1, 2, 4, 8)


@pytest.mark.parametrize("dtype", ("float32", "float16", "bfloat16"))
@pytest.mark.parametrize("n, bias_size", ((7, 7), (2**20, 4096), (2**24, 4096), (2**28, 4096), (1000 * 1024, 1000)))
def test_seed_configs_are_valid_unpruned_and_few(dtype, n, bias_size):
    seeds = checked_seeds(FAMILY, FAMILY.problem(dtype, n=n, bias_size=bias_size), large=n >= 2**20)
    if bias_size == 4096:
        assert len(seeds) >= 2 and seeds[0]["vector_width"] == (4 if dtype == "float32" else 8)
    # torch.compile's own fp32 layout is measured at the large sizes (at 2^20 the bulk seed comes first)
    from autogen.families.bias_mask_scale_add import INDUCTOR_FP32
    assert (INDUCTOR_FP32 in [s.as_dict() for s in seeds]) == (dtype == "float32" and n >= 2**24)


def test_problems_need_a_bias_size_dividing_n():
    assert FAMILY.problem("float16", n=2**28, bias_size=4096).shape_key == "n=268435456,bias_size=4096"
    with pytest.raises(UsageError, match="bias_size=3 must divide n=10"):
        FAMILY.problem(n=10, bias_size=3)
    with pytest.raises(UsageError, match="between 1 and"):
        FAMILY.problem(n=10, bias_size=0)
    assert FAMILY.problem(n=7, bias_size=7)["bias_size"] == 7


def test_reject_reasons():
    problem = FAMILY.problem("float16", n=3 * 2**20, bias_size=3 * 1024)
    assert FAMILY.reject_reason(problem, config(vector_width=8, elements_per_thread=8)) is None
    odd = FAMILY.problem("float16", n=3 * 2**20, bias_size=3)
    assert "scalar path" in FAMILY.reject_reason(odd, config(vector_width=2, elements_per_thread=4))
    assert FAMILY.reject_reason(odd, config(vector_width=1, elements_per_thread=4, loop="one_pass")) is None
    assert "fp16 and bf16" in FAMILY.reject_reason(FAMILY.problem(n=2**20, bias_size=4096), config(math="half2"))
    assert FAMILY.reject_reason(problem, config(math="half2", loop="one_pass")) is None
    # loop=bulk stages x, mask and addend: 9 bytes an fp32 element, so 512 x 8 is 36 KB a stage
    bulk = {"loop": "bulk", "cache": "ldg", "vector_width": 4}
    f32 = FAMILY.problem("float32", n=2**24, bias_size=4096)
    assert FAMILY.reject_reason(f32, config(**bulk, elements_per_thread=4, block_size=256)) is None
    assert "two stages exceed" in FAMILY.reject_reason(f32, config(**bulk, elements_per_thread=8, block_size=512))


@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_inputs_and_poison(dtype):
    n, bias_size = 6000, 40
    problem = FAMILY.problem(dtype, n=n, bias_size=bias_size)
    rng = np.random.default_rng(2)
    cases = FAMILY.validation_cases(problem)
    assert FAMILY.timing_case(problem) == cases[0] and cases[2]["offset"] == 1
    for case in cases:
        inputs = FAMILY.make_inputs(problem, np, rng, case)
        x, bias, addend = (to_float64(np, inputs[k], dtype) for k in ("x", "bias", "addend"))
        mask, y = inputs["mask"], to_float64(np, inputs["y"], dtype)
        assert np.isnan(y).all() and y.size == n and bias.size == bias_size and mask.dtype == np.uint8
        assert (np.abs(x) <= 2).all() and (np.abs(bias) <= 0.5).all() and (np.abs(addend) <= 2).all()
        kept = (mask != 0).mean()
        assert abs(kept - case["keep"]) < 0.05
        if case["mask"] == "bytes":
            assert len(np.unique(mask[mask != 0])) > 100  # any nonzero byte keeps
        else:
            assert set(np.unique(mask)) <= {0, 1}
        if case["offset"]:
            for key in ("x", "bias", "mask", "addend", "y"):
                assert inputs[key].base is not None
                assert inputs[key].__array_interface__["data"][0] % 16 == inputs[key].itemsize % 16
        ref = FAMILY.reference(problem, inputs)
        magnitude = FAMILY.reference_magnitude(problem, inputs)
        scale = float(np.float32(case["scale"]))
        for i in (0, 1, bias_size - 1, bias_size, n // 2 + 3, n - 1):
            m = scale if mask[i] else 0.0
            want = (x[i] + bias[i % bias_size]) * m + addend[i]
            assert ref[i] == pytest.approx(want, rel=1e-15, abs=1e-15)
            assert magnitude[i] == pytest.approx(abs(x[i] + bias[i % bias_size]) * m + abs(addend[i]), rel=1e-15)
        assert ref.dtype == np.float64 and (magnitude >= np.abs(ref) - 1e-12).all()


def _rounded_toward_zero(values: np.ndarray, dtype: str) -> np.ndarray:
    """float64 values stored as `dtype` by truncation (a kernel that chops instead of rounding)."""
    nearest = to_float64(np, to_storage(np, values, dtype), dtype)
    away = np.abs(nearest) > np.abs(values)
    bits = to_storage(np, nearest, dtype).view(np.uint16) if dtype == "float16" else to_storage(np, nearest, dtype)
    bits = np.where(away, bits - np.uint16(1), bits).astype(np.uint16)  # one unit toward zero, either sign
    return to_float64(np, bits.view(np.float16) if dtype == "float16" else bits, dtype)


@pytest.mark.parametrize("dtype, limit", [("float16", 5e-6), ("bfloat16", 2.0**-130), ("bfloat16", 2.0)])
def test_half_outputs_are_judged_against_their_types_rounding(dtype, limit):
    # Operands within +-limit: fp16 and bf16 subnormal outputs (a fixed spacing, where the correct
    # rounding is further from float64 than the dtype's tolerance), and bf16's normal range.
    problem = FAMILY.problem(dtype, n=6000, bias_size=40)
    case = FAMILY.validation_cases(problem)[0]  # scale 1/0.9: outputs off the inputs' grid
    inputs = FAMILY.make_inputs(problem, np, np.random.default_rng(8), case)
    rng = np.random.default_rng(9)
    for name in ("x", "bias", "addend"):
        inputs[name][...] = to_storage(np, (rng.random(inputs[name].size) - 0.5) * 2 * limit, dtype)
    ref = FAMILY.reference(problem, inputs)
    tolerance = FAMILY.tolerance_for(problem)
    error, reason = judged_with_output(FAMILY, problem, inputs, ref)
    assert reason == "" and (error > tolerance) == (limit < 1), error
    # Truncated instead of rounded: twice the rounding error, over the rule where rounding is
    # what counts (subnormals); within the bf16 tolerance in the normal range, as before.
    error, reason = judged_with_output(FAMILY, problem, inputs, _rounded_toward_zero(ref, dtype))
    assert bool(reason) == (limit < 1), (error, reason)
    magnitude = FAMILY.reference_magnitude(problem, inputs)
    allowed = tolerance + FAMILY.representable_error(problem, inputs, ref, magnitude, np)
    assert judged_with_output(FAMILY, problem, inputs, ref * (1 + 3 * allowed))[1]
    nan = ref.copy()
    nan[-1] = np.nan
    assert "NaN" in judged_with_output(FAMILY, problem, inputs, nan)[1]


def test_kernel_arguments_carry_the_scale_as_float32():
    problem = FAMILY.problem(n=8, bias_size=4)
    (step,) = FAMILY.plan(problem, config())
    args = held(step.args({"x": "X", "bias": "B", "mask": "M", "addend": "A", "y": "Y", "scale": 1 / 0.9}))
    assert args[0:3] == ("X", "B", "M") and args[4:6] == ("A", "Y") and args[6:] == (8, 4)
    assert args[3].dtype == np.float32 and args[3] == np.float32(1 / 0.9)


@pytest.mark.parametrize("n, bias_size", [(1, 1), (9, 3), (1000, 8), (70_016, 64)])
def test_every_element_is_visited_once(n, bias_size, monkeypatch):
    from autogen.families import _elementwise as ew
    monkeypatch.setattr(ew, "resident_capacity", lambda: (2, 512))
    for c in FAMILY.space.enumerate():
        if c["math"] == "half2" or c["block_size"] not in (128, 512):
            continue
        blocks = FAMILY.launch(FAMILY.problem(n=n, bias_size=bias_size), c).grid[0]
        loop = "grid_stride" if c["loop"] == "bulk" else c["loop"]  # bulk's fallback
        for pack in {c["vector_width"], 1}:
            visits = sweep_visits(n, pack, c["elements_per_thread"], c["block_size"], blocks, loop)
            assert (visits == 1).all(), (c, pack)
        if c["loop"] == "bulk":
            visits = bulk_visits(n, c["vector_width"], c["elements_per_thread"], c["block_size"], blocks)
            assert (visits == 1).all(), c


def test_templates_check_every_pointer_and_the_bias_period():
    source = render(FAMILY, "float16", config(vector_width=8, math="half2"))
    assert "bias_size % VW == 0" in source and "reinterpret_cast<unsigned long long>(mask) % VW == 0" in source
    for pointer in ("x", "bias", "addend", "y"):
        assert f"reinterpret_cast<unsigned long long>({pointer})" in source
    assert "pack_fma(pack_add(xw[j], bw[j]), lo | hi, aw[j])" in source
    host = render(FAMILY, "bfloat16", config(), host_launcher=True)
    assert f"{FAMILY.kernel_name('bfloat16', config())}_launch({FAMILY.c_params}, cudaStream_t stream)" in host


# -- the export, through the database, and its self-test hook --------------------------------------

WINNERS = {  # dtype -> {(n, bias_size): params}
    "float32": {(1 << 20, 4096): {**FAMILY.default_params, "vector_width": 4, "elements_per_thread": 8},
                (4096, 1024): {**FAMILY.default_params, "vector_width": 1, "elements_per_thread": 4, "loop": "one_pass"}},
    "float16": {(1 << 24, 4096): {**FAMILY.default_params, "math": "half2"}},
    "bfloat16": {(1 << 20, 4096): {**FAMILY.default_params, "vector_width": 2, "elements_per_thread": 8,
                                   "block_size": 1024, "math": "half2"}},
}

HARNESS = r"""
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#define main autogen_selftest_main
#include "autogen_bias_mask_scale_add_selftest.cu"
#undef main

template <class W, class E>
int run(const char* mode, int n, int bias_size, int c, unsigned long long seed, float (*from)(E), E (*to)(float))
{
    selftest::Rng rng(seed);
    std::vector<E> x((std::size_t)n), bias((std::size_t)bias_size), addend((std::size_t)n), y((std::size_t)n);
    std::vector<unsigned char> mask((std::size_t)n);
    W::make_inputs(c, rng, x, bias, mask, addend);
    if (std::string(mode) == "inputs") {
        for (const E& v : x) std::printf("%.17g ", (double)from(v));
        std::printf("\n");
        for (const E& v : bias) std::printf("%.17g ", (double)from(v));
        std::printf("\n");
        for (unsigned char m : mask) std::printf("%d ", (int)m);
        std::printf("\n");
        for (const E& v : addend) std::printf("%.17g ", (double)from(v));
        std::printf("\n%.9g %.9g\n", (double)W::scale_of(c), W::kTolerance);
        return 0;
    }
    for (E& v : y) {
        float value = 0.0f;
        if (std::scanf("%f", &value) != 1) return 2;
        v = to(value);
    }
    std::string why;
    const double error = W::output_error(x, bias, mask, W::scale_of(c), addend, y, &why);
    std::printf("%.17g\n%s\n", error, why.c_str());
    return 0;
}

#define ENTRY(NS) NS::Workload, NS::Elem
#define CONVERT(NS) [](NS::Elem v) { return NS::from_elem(v); }, [](float v) { return NS::to_elem(v); }

int main(int argc, char** argv)
{
    if (argc == 1) return autogen_selftest_main(argc, argv);  // the self-test itself
    if (argc != 7) return 2;
    const std::string dtype = argv[2];
    const int n = std::atoi(argv[3]), bias_size = std::atoi(argv[4]), c = std::atoi(argv[5]);
    const unsigned long long seed = std::strtoull(argv[6], nullptr, 10);
    if (dtype == "float32")
        return run<ENTRY(autogen_bias_mask_scale_add_test)>(argv[1], n, bias_size, c, seed, CONVERT(autogen_bias_mask_scale_add_test));
    if (dtype == "float16")
        return run<ENTRY(autogen_bias_mask_scale_add_f16_test)>(argv[1], n, bias_size, c, seed, CONVERT(autogen_bias_mask_scale_add_f16_test));
    return run<ENTRY(autogen_bias_mask_scale_add_bf16_test)>(argv[1], n, bias_size, c, seed, CONVERT(autogen_bias_mask_scale_add_bf16_test));
}
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bmsa_export")
    url = f"sqlite:///{root / 'tuning.db'}"
    with TuningDB(url) as db:
        for dtype, shapes in WINNERS.items():
            for i, ((n, bias_size), params) in enumerate(shapes.items()):
                store_winner(db, H100, FAMILY.name, {"n": n, "bias_size": bias_size}, params, 5.0 + i, 12.0 + i,
                             dtype=dtype)
    out = root / "export"
    assert run_export(FAMILY.name, "--out", str(out), "--gpu", H100.name, "--db", url, "--self-test") == 0
    return out


@pytest.fixture(scope="module")
def built(exported, tmp_path_factory) -> dict[str, Path]:
    nvcc = nvcc_or_skip()
    work = tmp_path_factory.mktemp("bmsa_build")
    library = build_library(exported / "autogen_bias_mask_scale_add.cu", "sm_90", work)
    source = work / "harness.cu"
    source.write_text(HARNESS)
    harness = work / "harness"
    # Built as the self-test is built (it holds the whole self-test, main renamed): one host
    # compile of the self-test's code checks it builds and serves the hook's tests.
    run([nvcc, "-arch=sm_90", "-std=c++17", "-O3", *WERROR, f"-I{exported}", str(source), str(library),
         "-o", str(harness)])
    return {"harness": harness}


def test_export_has_one_entry_per_dtype_with_the_hook(exported):
    selftest = (exported / "autogen_bias_mask_scale_add_selftest.cu").read_text()
    header = (exported / "autogen_bias_mask_scale_add.h").read_text()
    for symbol, dtype in (("autogen_bias_mask_scale_add", "float32"), ("autogen_bias_mask_scale_add_f16", "float16"),
                          ("autogen_bias_mask_scale_add_bf16", "bfloat16")):
        assert f"cudaError_t {symbol}({FAMILY.c_params}, cudaStream_t stream);" in header
        namespace = selftest.split(f"namespace {symbol}_test {{", 1)[1].split(f"}}  // namespace {symbol}_test", 1)[0]
        assert "class Workload {" in namespace and "skipped" not in namespace
        tolerance = FAMILY.tolerance_for(FAMILY.problem(dtype, n=1, bias_size=1))
        assert f"static constexpr double kTolerance = {tolerance};" in namespace
        for params in WINNERS[dtype].values():
            name = FAMILY.kernel_name(dtype, FAMILY.space.check(params))
            assert f'e.variants.push_back({{"{name}", {name}_launch}});' in namespace


def harness_lines(binary: Path, *args, stdin: str | None = None) -> list[str]:
    return run([str(binary), *map(str, args)], input=stdin).stdout.splitlines()


@pytest.mark.parametrize("dtype", DTYPES)
def test_selftest_hook_inputs_reference_and_error(built, dtype):
    tolerance = FAMILY.tolerance_for(FAMILY.problem(dtype, n=1, bias_size=1))
    n, bias_size = 2000, 16
    for case in range(3):
        seed = 60 + case
        lines = harness_lines(built["harness"], "inputs", dtype, n, bias_size, case, seed)
        x, bias, mask, addend = (np.array(line.split(), dtype=np.float64) for line in lines[:4])
        scale, hook_tolerance = map(float, lines[4].split())
        assert hook_tolerance == tolerance and scale == pytest.approx(FAMILY.validation_cases(None)[case]["scale"], rel=1e-7)
        keep = FAMILY.validation_cases(None)[case]["keep"]
        assert abs((mask != 0).mean() - keep) < 0.06 and (np.abs(x) <= 2).all() and (np.abs(bias) <= 0.5).all()
        assert (len(np.unique(mask[mask != 0])) > 50) == (case == 1)
        ref = (x + np.tile(bias, n // bias_size)) * np.where(mask != 0, scale, 0.0) + addend
        rounded = ref.astype(np.float32)
        error, why = judge(built["harness"], dtype, n, bias_size, case, seed, rounded)
        assert why == "" and error <= tolerance, (case, error)
        error, why = judge(built["harness"], dtype, n, bias_size, case, seed, rounded * 1.02)
        assert why == "" and error > tolerance, (case, error)
        # A dropped mask (every element kept) is caught.
        wrong = ((x + np.tile(bias, n // bias_size)) * scale + addend).astype(np.float32)
        assert judge(built["harness"], dtype, n, bias_size, case, seed, wrong)[0] > 10 * tolerance
        bad = rounded.copy()
        bad[n - 1] = np.nan
        error, why = judge(built["harness"], dtype, n, bias_size, case, seed, bad)
        assert error == math.inf and "NaN/inf" in why


def judge(binary, dtype, n, bias_size, case, seed, values) -> tuple[float, str]:
    lines = harness_lines(binary, "error", dtype, n, bias_size, case, seed,
                          stdin=" ".join("nan" if np.isnan(v) else repr(float(v)) for v in values) + "\n")
    return float(lines[0]), (lines[1] if len(lines) > 1 else "")
