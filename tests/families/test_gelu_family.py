"""gelu on the CPU: space and constraints, pruning, problems, the float64 reference against an
independent formula, poisoned and misaligned inputs, the launch geometry (a model of the kernels'
sweep visits every element once), and the export self-test hook built with nvcc and run on the
host. What the kernels compute on a GPU is tests/families/test_gpu_elementwise.py's business."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import numpy as np
import pytest

from autogen.export import writer as export_module
from autogen.core.dtypes import to_float64, to_storage
from autogen.errors import UsageError
from autogen.core.registry import get_family
from autogen.families import _elementwise as ew
from autogen.families.gelu import gelu_reference, pack_constants
from autogen.core.render import render
from family_checks import checked_seeds, held, judged_with_output
from nvcc_tools import nvcc_or_skip
from test_export import H100, WERROR, build_library, run

FAMILY = get_family("gelu")
DTYPES = ("float32", "float16", "bfloat16")


def config(**params):
    return FAMILY.space.check({**FAMILY.default_params, **params})


# -- space and pruning --------------------------------------------------------------------------


def test_space_size_and_constraints():
    configs = list(FAMILY.space.enumerate())
    # 88 shapes (vw, ept, bs, math) per loop: grid_stride and one_pass x erf (erff, logistic) x cache (ldg,
    # last), and loop=bulk x erf with cache=ldg only (it moves data by bulk copies)
    assert len(configs) == 88 * 2 * 2 * 2 + 88 * 2 == FAMILY.space.size()
    assert {c["cache"] for c in configs if c["loop"] == "bulk"} == {"ldg"}
    assert "cache choice changes nothing" in FAMILY.space.violations({**FAMILY.default_params, "loop": "bulk",
                                                                      "cache": "last"})[0]
    assert FAMILY.space.violations({**FAMILY.default_params, "cache": "stream"})  # no streaming policy
    pairs = {(c["vector_width"], c["elements_per_thread"]) for c in configs}
    assert pairs == {(1, 1), (1, 2), (1, 4), (2, 2), (2, 4), (2, 8), (4, 4), (4, 8), (4, 16), (8, 8), (8, 16)}
    assert FAMILY.space.violations({**FAMILY.default_params, "vector_width": 8, "elements_per_thread": 4})
    assert FAMILY.space.violations({**FAMILY.default_params, "vector_width": 1, "elements_per_thread": 8})
    assert FAMILY.space.violations({**FAMILY.default_params, "elements_per_thread": 32})  # not a choice


def test_reject_reasons():
    tanh16 = FAMILY.problem("float16", n=2**24, approximate="tanh")
    erf16 = FAMILY.problem("float16", n=2**24, approximate="none")
    assert FAMILY.reject_reason(tanh16, config(math="half2")) is None
    assert "erf" in FAMILY.reject_reason(erf16, config(math="half2"))
    assert "fp16 and bf16" in FAMILY.reject_reason(FAMILY.problem("float32", n=2**24), config(math="half2"))
    small = FAMILY.problem("float32", n=5)
    assert "exceeds n=5" in FAMILY.reject_reason(small, config(vector_width=8, loop="one_pass"))
    assert "covers over twice" in FAMILY.reject_reason(FAMILY.problem(n=1000), config(block_size=1024, loop="one_pass"))
    # A grid that covers n in one step: grid_stride would launch the one_pass grid.
    assert "one_pass" in FAMILY.reject_reason(FAMILY.problem(n=2**20), config(block_size=256))
    assert FAMILY.reject_reason(FAMILY.problem(n=2**28), config(block_size=256)) is None
    assert FAMILY.reject_reason(FAMILY.problem(n=2**20), config(block_size=256, loop="one_pass")) is None


def test_bulk_reject_reasons(monkeypatch):
    bf16 = FAMILY.problem("bfloat16", n=2**24)
    bulk = config(loop="bulk", vector_width=8, elements_per_thread=16, block_size=256)
    assert FAMILY.reject_reason(bf16, bulk) is None
    # 4096 elements a chunk: a smaller n stages nothing
    assert "under one chunk" in FAMILY.reject_reason(FAMILY.problem("bfloat16", n=4095), bulk)
    # 1024 x 16 fp32 elements are 64 KB a stage: not two in 48 KB of shared memory
    wide = config(loop="bulk", vector_width=4, elements_per_thread=16, block_size=1024)
    assert "two stages exceed 48 KB" in FAMILY.reject_reason(FAMILY.problem("float32", n=2**24), wide)
    monkeypatch.setattr(ew, "compute_capability", lambda: (8, 0))
    assert "sm_90" in FAMILY.reject_reason(bf16, bulk)


def test_problems_and_traits():
    assert FAMILY.problem(n=7)["approximate"] == "tanh"  # torch's name, tanh first (the default)
    assert FAMILY.problem("bfloat16", n=7, approximate=" None ").shape_key == "n=7,approximate=none"
    with pytest.raises(UsageError, match="approximate must be one of tanh, none"):
        FAMILY.problem(n=7, approximate="erf")
    with pytest.raises(UsageError, match="between 1 and"):
        FAMILY.problem(n=0)
    with pytest.raises(UsageError, match="supports dtype"):
        FAMILY.problem("float64", n=7)
    assert FAMILY.tolerance_for(FAMILY.problem("float32", n=7)) == 1e-5
    assert FAMILY.tolerance_for(FAMILY.problem("float16", n=7)) == 1e-3
    assert FAMILY.tolerance_for(FAMILY.problem("bfloat16", n=7)) == 1e-2


# -- data and reference ---------------------------------------------------------------------------


def test_reference_matches_an_independent_formula():
    x = np.concatenate([np.linspace(-12, 12, 997), [-1000.0, -30.0, -0.0, 1e-30, 30.0, 1000.0]])
    tanh = gelu_reference(np, x, "tanh")
    erf = gelu_reference(np, x, "none")
    c = math.sqrt(2 / math.pi)
    for v, t, e in zip(x, tanh, erf):
        assert t == pytest.approx(v * 0.5 * (1 + math.tanh(c * (v + 0.044715 * v ** 3))), rel=1e-12, abs=1e-13)
        assert e == pytest.approx(v * 0.5 * math.erfc(-v / math.sqrt(2)), rel=1e-12, abs=1e-15)
    # The forms differ by at most ~5e-4 (where GELU curves), and agree in the tails.
    assert 1e-4 < np.abs(tanh - erf).max() < 1e-3
    assert tanh[-1] == erf[-1] == 1000.0 and tanh[-6] == erf[-6] == 0.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_inputs_poisoned_spanning_the_tails_and_misaligned(dtype):
    problem = FAMILY.problem(dtype, n=20_000)
    rng = np.random.default_rng(1)
    cases = FAMILY.validation_cases(problem)
    assert [c["values"] for c in cases] == ["uniform", "tails", "uniform"] and cases[2]["offset"] == 1
    for case in cases:
        inputs = FAMILY.make_inputs(problem, np, rng, case)
        x = to_float64(np, inputs["x"], dtype)
        y = to_float64(np, inputs["y"], dtype)
        assert np.isnan(y).all() and np.isfinite(x).all() and x.size == y.size == 20_000
        if case["values"] == "tails":
            assert np.abs(x).max() > 500 and (np.abs(x) > 10).mean() > 0.1 and (x < -10).any()
            assert ((np.abs(x) <= 12) | (np.abs(x) >= 9.9)).all()
        else:
            assert (np.abs(x) <= 4).all() and x.min() < -3.9 and x.max() > 3.9
        # The reference reads the values as stored (bf16 bit patterns decoded).
        ref = FAMILY.reference(FAMILY.problem(dtype, n=20_000, approximate="none"), inputs, np)
        assert ref.dtype == np.float64 and np.allclose(ref, gelu_reference(np, x, "none"), rtol=0, atol=0)
        for name in ("x", "y"):
            address = inputs[name].__array_interface__["data"][0]
            if case["offset"]:
                assert address % 16 == inputs[name].itemsize % 16 and inputs[name].base is not None
            else:
                assert address % 16 == 0


# Inputs whose GELU is below the half type's smallest normal (fp16 2^-14, bf16 2^-126), where
# outputs are stored with a fixed spacing: the correctly rounded reference is then further from
# float64 than the dtype's tolerance allows.
SUBNORMAL_X = {"float16": 2e-5, "bfloat16": 2.0**-128}


@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_outputs_in_the_subnormal_range_pass_when_correctly_rounded(dtype, approximate):
    problem = FAMILY.problem(dtype, n=4096, approximate=approximate)
    inputs = FAMILY.make_inputs(problem, np, np.random.default_rng(5), {"values": "uniform", "offset": 0})
    tiny = (np.random.default_rng(6).random(4096) - 0.5) * 2 * SUBNORMAL_X[dtype]
    inputs["x"][...] = to_storage(np, tiny, dtype)
    ref = FAMILY.reference(problem, inputs, np)
    error, reason = judged_with_output(FAMILY, problem, inputs, ref)
    assert reason == "" and error > FAMILY.tolerance_for(problem), error  # failed the fixed tolerance before
    # Off by three times what the rule allows: fails.
    magnitude = FAMILY.reference_magnitude(problem, inputs, np)
    allowed = FAMILY.tolerance_for(problem) + FAMILY.representable_error(problem, inputs, ref, magnitude, np)
    error, reason = judged_with_output(FAMILY, problem, inputs, ref * (1 + 3 * allowed))
    assert "the reference rounded to the output type" in reason, error
    nan = ref.copy()
    nan[100] = np.nan
    assert "NaN" in judged_with_output(FAMILY, problem, inputs, nan)[1]


def test_pack_constants_are_the_rounded_values_twice():
    assert set(pack_constants("float32")) == {"c0", "c1", "q0", "q1", "q2"}
    for dtype in ("float16", "bfloat16"):
        words = pack_constants(dtype)
        for name, value in (("k0", math.sqrt(2 / math.pi)), ("k0k1", math.sqrt(2 / math.pi) * 0.044715), ("half", 0.5)):
            word = int(words[name], 16)
            assert word >> 16 == word & 0xFFFF
            decoded = float(to_float64(np, np.array([word & 0xFFFF], dtype=np.uint16), dtype)[0]) if dtype == "bfloat16" \
                else float(np.array([word & 0xFFFF], dtype=np.uint16).view(np.float16)[0])
            assert decoded == pytest.approx(value, rel=2 ** -8 if dtype == "bfloat16" else 2 ** -11)
    assert pack_constants("float16")["half"] == "0x38003800" and pack_constants("bfloat16")["half"] == "0x3f003f00"


def test_float_constants_are_the_folded_exponents():
    constants = pack_constants("float16")
    value = {name: float(constants[name].rstrip("f")) for name in ("c0", "c1", "q0", "q1", "q2")}
    log2e = 1 / math.log(2)
    assert value["c0"] == pytest.approx(-2 * log2e * math.sqrt(2 / math.pi), rel=1e-7)
    assert value["c1"] == pytest.approx(-2 * log2e * math.sqrt(2 / math.pi) * 0.044715, rel=1e-7)
    # The tanh form as the kernel computes it: x / (1 + 2^(x (c0 + c1 x^2))).
    x = np.linspace(-12, 12, 4001)
    ours = x / (1 + np.exp2(x * (value["c0"] + value["c1"] * x * x)))
    assert np.abs(ours - gelu_reference(np, x, "tanh")).max() < 1e-6


def logistic_gelu(x):
    """The erf=logistic kernel's formula in float64: x / (1 + 2^(x Q(min(x^2, 64))))."""
    c = pack_constants("float16")
    q0, q1, q2 = (float(c[name].rstrip("f")) for name in ("q0", "q1", "q2"))
    t = np.minimum(x * x, 64.0)
    with np.errstate(over="ignore"):
        return x / (1 + np.exp2(x * (q0 + t * (q1 + t * q2))))


def test_logistic_erf_is_accurate_for_half_outputs():
    # Within 3e-5 of GELU relative to its magnitude (16x under half an fp16 ulp) everywhere,
    # the right limits far out (the clamp keeps the exponent's sign), and far inside the
    # fp16 and bf16 tolerances as a relative L2 error.
    x = np.concatenate([np.linspace(-12, 12, 240001), [-1000.0, -30.0, -0.0, 30.0, 1000.0]])
    ours, exact = logistic_gelu(x), gelu_reference(np, x, "none")
    magnitude = ew_magnitude(x)
    assert (np.abs(ours - exact) <= 3e-5 * magnitude + 1e-300).all()
    assert ours[-1] == 1000.0 and ours[-2] == 30.0 and abs(ours[-5]) < 1e-300
    assert np.sqrt(((ours - exact) ** 2).sum() / (magnitude ** 2).sum()) < 1e-5


def ew_magnitude(x):
    from autogen.families.gelu import gelu_magnitude
    return gelu_magnitude(np, x, "none")


def test_erf_choice_is_pruned_where_it_changes_nothing():
    erf16 = FAMILY.problem("float16", n=2**24, approximate="none")
    assert FAMILY.reject_reason(erf16, config(erf="logistic", loop="one_pass")) is None
    assert "erf form only" in FAMILY.reject_reason(FAMILY.problem("float16", n=2**24), config(erf="logistic"))
    assert "fp16 and bf16" in FAMILY.reject_reason(FAMILY.problem("float32", n=2**24, approximate="none"),
                                                    config(erf="logistic"))
    # fp32 renders erff whatever erf says; fp16 renders the logistic form only when asked.
    assert "erff(" in render(FAMILY, "float32", config(erf="logistic"))
    assert "erff(" not in render(FAMILY, "float16", config(erf="logistic"))
    assert "erff(" in render(FAMILY, "float16", config(erf="erff"))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ("tanh", "none"))
@pytest.mark.parametrize("n", (1, 1000, 2**20, 2**24, 2**28))
def test_seed_configs_are_valid_unpruned_and_few(dtype, approximate, n):
    seeds = checked_seeds(FAMILY, FAMILY.problem(dtype, n=n, approximate=approximate), large=n >= 2**20)
    if n >= 2**20:
        assert len(seeds) >= 2
        wide = 8 if dtype != "float32" else 4
        first = seeds[0]
        # the vendor-like point first: 16-byte packs, one pass, 128 threads
        assert (first["vector_width"], first["loop"], first["block_size"]) == (wide, "one_pass", 128)
        if dtype != "float32" and approximate == "none":
            assert all(s["erf"] == "logistic" for s in seeds)
        if dtype != "float32" and approximate == "tanh":
            assert all(s["math"] == "half2" for s in seeds)
        # the bulk pipeline second where it won (fp16 / bf16 at 2^24: 32 MiB staged), nowhere else
        bulk = [s for s in seeds if s["loop"] == "bulk"]
        if dtype != "float32" and n == 2**24:
            assert seeds[1] == bulk[0] and (bulk[0]["vector_width"], bulk[0]["block_size"]) == (8, 256)
        else:
            assert not bulk
        # evict_last loads beyond 2^26 (Inductor's) and for fp32 up to 2^22 (16 bytes a thread
        # as four single accesses, in 512 threads); else one pack per thread in 512 threads
        hints = {s["cache"] for s in seeds} - {"ldg"}
        assert hints == ({"last"} if n > 2**26 or (n <= 2**22 and dtype == "float32") else set())
        if n <= 2**22:
            scalar = {"vector_width": 1, "cache": "last"} if dtype == "float32" else {}
            assert seeds[2].as_dict() == {**seeds[0].as_dict(), "block_size": 512, **scalar}
        if 2**22 < n <= 2**26:
            bs512 = [s for s in seeds if s["block_size"] == 512]
            assert bs512 and (bs512[0]["vector_width"], bs512[0]["elements_per_thread"], bs512[0]["loop"]) == (
                wide, wide, "one_pass")


# -- geometry: a model of the sweep in templates/elementwise.cuh.j2 --------------------------------


def sweep_visits(n: int, pack: int, ept: int, block: int, blocks: int, loop: str) -> np.ndarray:
    """How often the kernels' sweep (elementwise.cuh.j2) touches each element: the same index
    arithmetic, vectorised over every thread of the grid."""
    counts = np.zeros(n, dtype=np.int64)
    packs_in_flight = ept // pack
    span = block * packs_in_flight
    packs = n // pack
    threads = np.arange(blocks * block)
    first = (threads // block) * span + threads % block
    stride = blocks * span
    while True:
        live = first < packs
        if not live.any():
            break
        for u in range(packs_in_flight):
            p = first[live] + u * block
            p = p[p < packs]
            for k in range(pack):
                np.add.at(counts, p * pack + k, 1)
        if loop == "one_pass":
            break
        first = first + stride
    if pack > 1:
        element = packs * pack + (threads // block) * block + threads % block
        np.add.at(counts, element[element < n], 1)
    return counts


def bulk_visits(n: int, pack: int, ept: int, block: int, blocks: int) -> np.ndarray:
    """The same for bulk_sweep (elementwise.cuh.j2): chunk c of block * ept elements to block
    c % blocks, each thread's packs block apart in it; then the tail, one element per thread."""
    counts = np.zeros(n, dtype=np.int64)
    chunk = block * ept
    chunks = n // chunk
    for c in range(chunks):
        for tid in range(block):
            for u in range(ept // pack):
                first = c * chunk + (tid + u * block) * pack
                counts[first:first + pack] += 1
    element = chunks * chunk + np.arange(blocks * block)
    while (element < n).any():
        np.add.at(counts, element[element < n], 1)
        element = element + blocks * block
    return counts


@pytest.mark.parametrize("n", [1, 3, 8, 9, 1000, 4097, 70_001])
def test_every_element_is_visited_once_on_both_paths(n, monkeypatch):
    # A small device, so that grid_stride really strides at these sizes.
    monkeypatch.setattr(ew, "resident_capacity", lambda: (2, 512))
    for c in FAMILY.space.enumerate():
        if c["math"] == "half2" or (c["block_size"] not in (128, 1024)):
            continue
        blocks = FAMILY.launch(FAMILY.problem(n=n), c).grid[0]
        if c["loop"] == "one_pass":
            assert blocks * c["block_size"] * c["elements_per_thread"] >= n
        else:
            assert blocks <= 2 * max(1, 512 // c["block_size"])
        ept = c["elements_per_thread"]
        for pack in {c["vector_width"], 1}:  # the vector path, and the scalar one
            # (loop=bulk falls back to the grid-stride sweep where it cannot stage)
            visits = sweep_visits(n, pack, ept, c["block_size"], blocks, "grid_stride" if c["loop"] == "bulk" else c["loop"])
            assert (visits == 1).all(), (c, pack, np.flatnonzero(visits != 1)[:5])
        if c["loop"] == "bulk":
            visits = bulk_visits(n, c["vector_width"], ept, c["block_size"], blocks)
            assert (visits == 1).all(), (c, np.flatnonzero(visits != 1)[:5])


def test_launch_on_the_h100_figures_and_the_host_launcher_agree():
    problem = FAMILY.problem(n=2**28)
    stride = config(block_size=256, elements_per_thread=8)
    # One wave of resident blocks on 132 SMs x 2048 threads (the off-GPU fallback).
    assert FAMILY.launch(problem, stride).grid == (132 * 8, 1, 1)
    assert FAMILY.launch(problem, config(loop="one_pass")).grid == (2**28 // (256 * 8), 1, 1)
    host = render(FAMILY, "float16", stride, host_launcher=True)
    assert "((long long)n + 2048 - 1) / 2048" in host and "threads_per_sm / 256" in host
    one_pass = render(FAMILY, "float16", config(loop="one_pass"), host_launcher=True)
    assert "cudaDevAttrMultiProcessorCount" not in one_pass
    # The plan passes the form: 1 for tanh, 0 for erf.
    for form, flag in (("tanh", 1), ("none", 0)):
        (step,) = FAMILY.plan(FAMILY.problem(n=10, approximate=form), stride)
        assert held(step.args({"x": "X", "y": "Y"}))[2:] == (10, flag)


def test_bulk_launch_on_the_h100_figures_and_the_host_launcher_agree():
    # bf16, 256 x 16 elements a chunk: 8 KB a stage, 4 stages (32 KB + the barriers), so 6 blocks a
    # SM in 228 KB (33 KB each with the 1 KB reservation): 132 x 6, promised by the launch bounds.
    problem = FAMILY.problem("bfloat16", n=2**24)
    bulk = config(loop="bulk", vector_width=8, elements_per_thread=16, block_size=256)
    assert ew.bulk_stages(bulk, 2) == 4 and ew.bulk_shared_bytes(bulk, 2) == 4 * 8192 + 128
    assert FAMILY.launch(problem, bulk).grid == (132 * 6, 1, 1)
    # one block per whole chunk at most
    assert FAMILY.launch(FAMILY.problem("bfloat16", n=5 * 4096 + 7), bulk).grid == (5, 1, 1)
    source = render(FAMILY, "bfloat16", bulk, host_launcher=True)
    assert "__launch_bounds__(256, 6)" in source and "STAGES = 4," in source
    assert "cudaDevAttrMaxSharedMemoryPerMultiprocessor" in source and ": 6;" in source
    assert "sweep<GeluTanh, 8>" in source and "bulk_sweep<GeluTanh, 8>" in source  # the fallback kept
    # fp32 at 512 x 8: 16 KB a stage, two stages, 1536 threads a SM at most: 3 blocks
    wide = config(loop="bulk", vector_width=4, elements_per_thread=8, block_size=512)
    assert ew.bulk_stages(wide, 4) == 2 and FAMILY.launch(FAMILY.problem("float32", n=2**24), wide).grid == (132 * 3, 1, 1)
    # fp32 at 1024 x 16: 64 KB a stage, none fits: the grid_stride variant, pruned from searches
    unfit = config(loop="bulk", vector_width=4, elements_per_thread=16, block_size=1024)
    f32 = FAMILY.problem("float32", n=2**24)
    assert FAMILY.launch(f32, unfit) == FAMILY.launch(f32, config(**{**unfit.as_dict(), "loop": "grid_stride"}))
    assert "bulk_sweep" not in render(FAMILY, "float32", unfit) and FAMILY.reject_reason(f32, unfit)


def test_half2_renders_only_for_half_types():
    fp32 = render(FAMILY, "float32", config(math="float")).replace("mfloat", "mX")
    assert fp32 == render(FAMILY, "float32", config(math="half2")).replace("mhalf2", "mX").replace(
        "math=half2", "math=float")
    packed = render(FAMILY, "bfloat16", config(math="half2"))
    assert "tanh.approx.bf16x2" in packed and "#if __CUDA_ARCH__ >= 900" in packed and "fma.rn.bf16x2" in packed
    assert "tanh.approx.f16x2" in render(FAMILY, "float16", config(math="half2"))



def test_cache_policies_render_their_load_instructions():
    # No streaming (.cs) accesses: they lost in torch's graphs (docs/families/elementwise.md);
    # last is Inductor's evict_last loads with plain stores. The instructions as inline PTX opens them.
    sources = {cache: render(FAMILY, "float16", config(loop="one_pass", cache=cache)) for cache in ("ldg", "last")}
    assert '"ld.global.L1::evict_last' in sources["last"] and "{ return load_last(" in sources["last"]
    assert "{ return __ldg(reinterpret_cast<const T*>(p)); }" in sources["ldg"] and "evict_last" not in sources["ldg"]
    assert not any('"ld.global.cs' in s or '"st.global.cs' in s for s in sources.values())


# -- the export self-test hook ----------------------------------------------------------------------

HARNESS = r"""
#define main autogen_selftest_main
#include "autogen_gelu_selftest.cu"
#undef main

template <class W, class E>
int run(const char* mode, int n, int c, unsigned long long seed)
{
    selftest::Rng rng(seed);
    std::vector<E> x((std::size_t)n), y((std::size_t)n);
    W::make_inputs(c, rng, x);
    if (std::string(mode) == "inputs") {
        for (const E& v : x) std::printf("%.17g ", (double)W::from_elem_value(v));
        std::printf("\n");
        for (double r : W::reference(x, W::form_of(c))) std::printf("%.17g ", r);
        std::printf("\n%d %d %.9g\n", W::form_of(c), W::kTimingForm, W::kTolerance);
        return 0;
    }
    for (E& v : y) {  // the outputs to judge, as float text
        float value = 0.0f;
        if (std::scanf("%f", &value) != 1) return 2;
        v = W::to_elem_value(value);
    }
    std::string why;
    double floor = 0.0;
    const double error = W::output_error(x, y, W::form_of(c), &why, &floor);  // before why is read
    if (std::string(mode) == "terms") {  // the GPU check's per-element sums, here on the host
        std::string term_why;
        const double term_error = selftest::l2_sums(x.size(), typename W::DeviceTerm{x.data(), y.data(), W::form_of(c)}).error(&term_why);
        const double term_floor = selftest::rounding_error(selftest::l2_sums(x.size(), typename W::DeviceTerm{x.data(), nullptr, W::form_of(c)}));
        std::printf("%.17g %.17g %.17g %.17g\n%s|%s\n", error, term_error, floor, term_floor, why.c_str(), term_why.c_str());
        return 0;
    }
    std::printf("%.17g\n%s\n", error, why.c_str());
    return 0;
}

int main(int argc, char** argv)
{
    if (argc == 1) return autogen_selftest_main(argc, argv);  // the self-test itself
    if (argc != 6) return 2;
    const std::string dtype = argv[2];
    const int n = std::atoi(argv[3]), c = std::atoi(argv[4]);
    const unsigned long long seed = std::strtoull(argv[5], nullptr, 10);
    if (dtype == "float32") return run<Probe<autogen_gelu_test::Workload>, float>(argv[1], n, c, seed);
    if (dtype == "float16") return run<Probe<autogen_gelu_f16_test::Workload>, std::uint16_t>(argv[1], n, c, seed);
    return run<Probe<autogen_gelu_bf16_test::Workload>, std::uint16_t>(argv[1], n, c, seed);
}
"""

# Element conversions live in each entry's namespace: a probe type forwards to them.
PROBE = r"""
template <class W> struct Probe;
#define AUTOGEN_PROBE(NS)                                                               \
    template <> struct Probe<NS::Workload> : NS::Workload {                             \
        static float from_elem_value(NS::Elem v) { return NS::from_elem(v); }           \
        static NS::Elem to_elem_value(float v) { return NS::to_elem(v); }               \
    };
AUTOGEN_PROBE(autogen_gelu_test)
AUTOGEN_PROBE(autogen_gelu_f16_test)
AUTOGEN_PROBE(autogen_gelu_bf16_test)
"""


def default_export(family, out: Path) -> Path:
    """An export of the family's default variant for every dtype, with the self-test: built from
    the export model directly (no tuned shapes, so no trait reaches the dispatch table)."""
    entries, variants = [], []
    for dtype in family.dtypes:
        variant = export_module._variant(family, dtype, family.default_config())
        variants.append(variant)
        c_params = family.c_params_for(dtype)
        entries.append(export_module.EntryPoint(export_module.entry_symbol(family, dtype), dtype, c_params,
                                                export_module.c_arg_names(c_params, family), (), variant))
    software = {"driver": "13.0", "runtime": "13.0", "nvrtc": "13.0", "autogen": "0.1.0"}
    model = export_module.ExportModel(family, H100, "sm_90", tuple(entries), tuple(variants),
                                      "2026-11-22T00:00:00+00:00", software, True)
    export_module.write_files(export_module.render_files(model), out)
    return out


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Path:
    nvcc = nvcc_or_skip()
    work = tmp_path_factory.mktemp("gelu_export")
    out = default_export(FAMILY, work / "export")
    library = build_library(out / "autogen_gelu.cu", "sm_90", work)
    source = work / "harness.cu"
    text = HARNESS.replace("#undef main\n", "#undef main\n" + PROBE)
    source.write_text("#include <cstdio>\n#include <cstdlib>\n#include <string>\n#include <vector>\n" + text)
    built = work / "harness"
    # Built as the self-test is built (it holds the whole self-test, main renamed): one host
    # compile of the self-test's code checks it builds and serves the hook's tests.
    run([nvcc, "-arch=sm_90", "-std=c++17", "-O3", *WERROR, f"-I{out}", str(source), str(library), "-o", str(built)])
    return built


def harness_lines(binary: Path, *args, stdin: str | None = None) -> list[str]:
    return run([str(binary), *map(str, args)], input=stdin).stdout.splitlines()


@pytest.mark.parametrize("dtype", DTYPES)
def test_selftest_hook_inputs_reference_and_error(harness, dtype):
    tolerance = FAMILY.tolerance_for(FAMILY.problem(dtype, n=1))
    for case in range(6):
        form = "tanh" if case < 3 else "none"
        lines = harness_lines(harness, "inputs", dtype, 3001, case, 40 + case)
        x = np.array(lines[0].split(), dtype=np.float64)
        ref = np.array(lines[1].split(), dtype=np.float64)
        flag, timing_form, hook_tolerance = lines[2].split()
        assert int(flag) == (form == "tanh") and int(timing_form) == 1 and float(hook_tolerance) == tolerance
        assert np.allclose(ref, gelu_reference(np, x, form), rtol=1e-12, atol=1e-13)
        if case % 3 == 1:
            assert np.abs(x).max() > 100 and (x < -10).any()
        else:
            assert (np.abs(x) <= 4).all()
        # The reference rounded to the dtype passes; 3% off fails (above the 1e-2 of bf16); one NaN fails.
        rounded = ref.astype(np.float32)
        error, why = judge(harness, dtype, case, 40 + case, rounded)
        assert why == "" and error <= tolerance, (case, error)
        error, why = judge(harness, dtype, case, 40 + case, rounded * 1.03)
        assert why == "" and error > tolerance, (case, error)
        bad = rounded.copy()
        bad[7] = np.nan
        error, why = judge(harness, dtype, case, 40 + case, bad)
        assert error == math.inf and "NaN/inf" in why


def judge(binary, dtype, case, seed, values) -> tuple[float, str]:
    lines = harness_lines(binary, "error", dtype, values.size, case, seed,
                          stdin=" ".join("nan" if np.isnan(v) else repr(float(v)) for v in values) + "\n")
    return float(lines[0]), (lines[1] if len(lines) > 1 else "")


@pytest.mark.parametrize("dtype", DTYPES)
def test_selftest_gpu_check_terms_give_the_host_error_and_floor(harness, dtype):
    """Large shapes are checked on the GPU from per-element sums (DeviceTerm): the same error,
    rounding floor and NaN verdict as the host's output_error."""
    for case in (0, 1, 3, 4):
        lines = harness_lines(harness, "inputs", dtype, 5001, case, 70 + case)
        ref = np.array(lines[1].split(), dtype=np.float64)
        for scale in (1.0, 1.002, 1.03):
            values = ref.astype(np.float32) * np.float32(scale)
            out = harness_lines(harness, "terms", dtype, values.size, case, 70 + case,
                                stdin=" ".join(repr(float(v)) for v in values) + "\n")
            error, term_error, floor, term_floor = map(float, out[0].split())
            assert term_error == pytest.approx(error, rel=1e-9, abs=1e-15), (case, scale)
            if dtype == "float32":  # no floor for float outputs (the GPU check makes none either)
                assert floor == 0.0
            else:
                assert floor > 0 and term_floor == pytest.approx(floor, rel=1e-9), (case, scale)
        values[11] = np.nan
        out = harness_lines(harness, "terms", dtype, values.size, case, 70 + case,
                            stdin=" ".join("nan" if np.isnan(v) else repr(float(v)) for v in values) + "\n")
        assert out[0].split()[:2] == ["inf", "inf"] and out[1] == "1 of 5001 outputs are NaN/inf|1 of 5001 outputs are NaN/inf"


def test_selftest_without_a_gpu_fails_cleanly(harness):
    from conftest import gpu_unavailable_reason
    if gpu_unavailable_reason() is None:
        pytest.skip("a GPU is present: tests/families/test_gpu_elementwise.py runs the self-test")
    done = subprocess.run([str(harness)], capture_output=True, text=True, timeout=60)  # with no arguments: the self-test
    assert done.returncode == 1 and "no CUDA GPU available" in done.stdout
