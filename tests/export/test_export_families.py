"""`autogen export --self-test` for reduce and softmax without a GPU: every entry point gets its
family's self-test hook (templates/export/selftest_<family>.cu.j2), the kernels and the self-test
build for sm_90 with warnings as errors and the self-test fails cleanly with no GPU. The hooks'
host side (inputs, fp16 conversion, float64 reference, error check) is run on the CPU through a
small harness that includes the exported self-test and checks it against numpy and the Python
family. What the kernels compute on a GPU is tests/test_gpu_*'s business."""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from autogen.core.registry import get_family
from conftest import gpu_unavailable_reason
from nvcc_tools import nvcc_or_skip
from test_export import WERROR, build_libraries, export_winners, run

ARCH = "sm_90"


def pick(family: str, **wanted) -> dict:
    """The first valid point of the family's space holding every wanted value."""
    for config in get_family(family).space.enumerate():
        params = config.as_dict()
        if all(params[name] == value for name, value in wanted.items()):
            return params
    raise AssertionError(f"no valid {family} config has {wanted}")


REDUCE_DEFAULT = dict(get_family("reduce").default_params)  # last_block, shfl
REDUCE_TWO_KERNEL = pick("reduce", block_size=512, vector_width=8, unroll=4, block_reduce="smem", cross_block="two_kernel")
REDUCE_ATOMIC = pick("reduce", block_size=1024, vector_width=1, unroll=8, block_reduce="shfl", cross_block="atomic")
REDUCE_LAST_BLOCK_SMEM = pick("reduce", block_size=128, vector_width=2, unroll=1, elements_per_thread=128,
                              block_reduce="smem", cross_block="last_block")
SOFTMAX_DEFAULT = dict(get_family("softmax").default_params)  # a warp per row, registers, online
SOFTMAX_PACKED_GLOBAL = pick("softmax", threads_per_row=4, vector_width=1, unroll=1, row_cache="global",
                             passes="two_pass")
SOFTMAX_BLOCK_SMEM = pick("softmax", threads_per_row=1024, vector_width=4, unroll=2, reduce="smem",
                          row_cache="registers", passes="two_pass")
SOFTMAX_CROSS_WARP_SHFL = pick("softmax", threads_per_row=256, vector_width=8, unroll=2, reduce="shfl",
                               row_cache="global", passes="online")

# family -> dtype -> {dims: params}
WINNERS = {
    "reduce": {
        "float32": {(4096,): REDUCE_DEFAULT, (1 << 20,): REDUCE_TWO_KERNEL, (1000,): REDUCE_ATOMIC},
        "float16": {(4096,): REDUCE_ATOMIC, (1 << 22,): REDUCE_LAST_BLOCK_SMEM},
    },
    "softmax": {
        "float32": {(64, 128): SOFTMAX_DEFAULT, (4096, 1000): SOFTMAX_PACKED_GLOBAL, (32, 8192): SOFTMAX_BLOCK_SMEM},
        "float16": {(128, 4096): SOFTMAX_CROSS_WARP_SHFL, (1000, 37): SOFTMAX_DEFAULT},
    },
}
FAMILIES = tuple(WINNERS)
SOFTMAX_TOLERANCES = {"float32": 1e-5, "float16": 1e-3}


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, Path]:
    """family -> its export folder, from one database holding made-up winners for both dtypes."""
    root = tmp_path_factory.mktemp("export_families")
    return export_winners(root, [(family, dtype, dict(zip(get_family(family).dims, shape)), params)
                                 for family, by_dtype in WINNERS.items() for dtype, shapes in by_dtype.items()
                                 for shape, params in shapes.items()])


@pytest.fixture(scope="module")
def libraries(exports, tmp_path_factory) -> dict[str, Path]:
    """family -> the static library of its exported kernels, built for sm_90 with warnings as errors."""
    return build_libraries(exports, ARCH, tmp_path_factory.mktemp("libraries"))


# -- what is written --------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_every_entry_point_gets_the_family_hook(exports, family):
    selftest = (exports[family] / f"autogen_{family}_selftest.cu").read_text()
    assert "skipped" not in selftest and "no self-test hook" not in selftest
    fam = get_family(family)
    for dtype in fam.dtypes:
        symbol = f"autogen_{family}" + ("" if dtype == "float32" else "_f16")
        namespace = selftest.split(f"namespace {symbol}_test {{", 1)[1].split(f"}}  // namespace {symbol}_test", 1)[0]
        assert "class Workload {" in namespace
        assert f"selftest::run<{symbol}_test::Workload>({symbol}_test::entry(), rng, report);" in selftest
        assert f"selftest::replay({symbol}_test::entry()," in selftest  # the Python family's data first
        # The tolerance of the entry's own dtype (softmax: 1e-5 fp32, 1e-3 fp16).
        tolerance = fam.tolerance_for(fam.problem(dtype, **dict.fromkeys(fam.dims, 1)))
        assert f"static constexpr double kTolerance = {tolerance};" in namespace
        if family == "softmax":
            assert tolerance == SOFTMAX_TOLERANCES[dtype]
        else:
            assert tolerance == 1e-5
        # fp16 entries read and write raw 16-bit patterns, converted on the host by hand.
        assert ("typedef std::uint16_t Elem;" in namespace) == (dtype == "float16")
        assert ("float_to_half_bits" in namespace) == (dtype == "float16")
        for params in WINNERS[family][dtype].values():
            name = fam.kernel_name(dtype, fam.space.check(params))
            assert f'e.variants.push_back({{"{name}", {name}_launch}});' in namespace
    assert not re.search(r"#\s*include\s*[<\"]cuda_fp16", selftest)  # plain C++ on the host


@pytest.mark.parametrize("family", FAMILIES)
def test_selftest_builds_for_sm90_and_fails_cleanly_without_a_gpu(harnesses, family):
    # The harness is the self-test built for sm_90 with warnings as errors; with no arguments it
    # runs the self-test's own main.
    binary = harnesses[family]
    assert binary.is_file()
    if gpu_unavailable_reason() is not None:
        # No GPU here: the program must say so and fail, never pass unchecked.
        done = subprocess.run([str(binary)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 1 and "no CUDA GPU available" in done.stdout, done.stdout + done.stderr


# -- the hooks' host side, on the CPU ----------------------------------------------------------------

# Includes the exported self-test with its main renamed and calls the hooks' static members: the
# inputs of a case, the float64 reference, the error check and the fp16 conversions. Host code
# only (no CUDA call), so it runs without a GPU. Values travel as bit patterns.
HARNESS = r"""
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#define main autogen_selftest_main
#include "autogen_@FAMILY@_selftest.cu"
#undef main

template <class E>
unsigned long long bits_of(E value)
{
    if constexpr (sizeof(E) == 2) {
        return value;
    } else {
        std::uint32_t bits;
        std::memcpy(&bits, &value, sizeof bits);
        return bits;
    }
}

template <class E>
E from_bits(unsigned long long bits)
{
    if constexpr (sizeof(E) == 2) {
        return (E)bits;
    } else {
        const std::uint32_t word = (std::uint32_t)bits;
        float value;
        std::memcpy(&value, &word, sizeof value);
        return value;
    }
}

template <class E>
void print_bits(const std::vector<E>& values)
{
    for (std::size_t i = 0; i < values.size(); ++i) std::printf("%s%llu", i ? " " : "", bits_of(values[i]));
    std::printf("\n");
}

void print_doubles(const std::vector<double>& values)
{
    for (std::size_t i = 0; i < values.size(); ++i) std::printf("%s%.17g", i ? " " : "", values[i]);
    std::printf("\n");
}

template <class E>
bool read_bits(std::vector<E>& values)
{
    for (E& value : values) {
        unsigned long long bits = 0;
        if (std::scanf("%llu", &bits) != 1) return false;
        value = from_bits<E>(bits);
    }
    return true;
}

// half_to_float: every fp16 pattern as float bits; float_to_half: float bits on stdin to fp16 bits.
int convert(const std::string& mode)
{
    namespace h = autogen_@FAMILY@_f16_test;
    if (mode == "half_to_float") {
        for (unsigned int bits = 0; bits < 65536u; ++bits)
            std::printf("%llu\n", bits_of(h::half_bits_to_float((std::uint16_t)bits)));
        return 0;
    }
    unsigned long long bits = 0;
    while (std::scanf("%llu", &bits) == 1)
        std::printf("%u\n", (unsigned int)h::float_to_half_bits(from_bits<float>(bits)));
    return 0;
}

@FAMILY_CODE@

int main(int argc, char** argv)
{
    if (argc == 1) return autogen_selftest_main(argc, argv);  // the self-test itself
    const std::string mode = argv[1];
    if (mode == "half_to_float" || mode == "float_to_half") return convert(mode);
    if (argc < 3) return 2;
    const bool half = std::string(argv[2]) == "float16";
    std::vector<long long> args;
    for (int i = 3; i < argc; ++i) args.push_back(std::strtoll(argv[i], nullptr, 10));
    return half ? family<autogen_@FAMILY@_f16_test::Workload, std::uint16_t>(mode, args)
                : family<autogen_@FAMILY@_test::Workload, float>(mode, args);
}
"""

REDUCE_CODE = r"""
// inputs n case seed: x, then the reference.
template <class W, class E>
int family(const std::string& mode, const std::vector<long long>& args)
{
    if (mode != "inputs" || args.size() != 3) return 2;
    selftest::Rng rng((std::uint64_t)args[2]);
    std::vector<E> x((std::size_t)args[0]);
    W::make_inputs((int)args[1], rng, x);
    print_bits(x);
    std::printf("%.17g\n", W::reference(x));
    return 0;
}
"""

SOFTMAX_CODE = r"""
// inputs rows cols case seed: x, the poisoned y, the reference.
// error rows cols case seed < y: the error of y against the inputs of that case, why, the rounding
// floor the check adds to kTolerance, and kTolerance.
template <class W, class E>
int family(const std::string& mode, const std::vector<long long>& args)
{
    if (args.size() != 4) return 2;
    const int rows = (int)args[0], cols = (int)args[1], c = (int)args[2];
    selftest::Rng rng((std::uint64_t)args[3]);
    std::vector<E> x((std::size_t)rows * cols), y(x.size());
    W::make_inputs(c, rng, rows, cols, x);
    if (mode == "inputs") {
        W::poison(c, rows, cols, y);
        print_bits(x);
        print_bits(y);
        print_doubles(W::reference(x, rows, cols));
        return 0;
    }
    if (mode != "error" || !read_bits(y)) return 2;
    std::string why;
    double floor = -1.0;
    const double error = W::output_error(x, y, rows, cols, &why, &floor);
    std::printf("%.17g\n%s\n%.17g %.17g\n", error, why.c_str(), floor, W::kTolerance);
    return 0;
}
"""


@pytest.fixture(scope="module")
def harnesses(exports, libraries, tmp_path_factory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("harness")
    built = {}
    for family, code in (("reduce", REDUCE_CODE), ("softmax", SOFTMAX_CODE)):
        source = work / f"harness_{family}.cu"
        source.write_text(HARNESS.replace("@FAMILY_CODE@", code).replace("@FAMILY@", family))
        built[family] = work / f"harness_{family}"
        # Built as the self-test is built (it holds the whole self-test, main renamed): one host
        # compile of the self-test's code checks it builds and serves the hook's tests.
        run([nvcc_or_skip(), f"-arch={ARCH}", "-std=c++17", "-O3", *WERROR, f"-I{exports[family]}", str(source),
             str(libraries[family]), "-o", str(built[family])])
    return built


def harness(binary: Path, *args, stdin: str | None = None) -> list[str]:
    return run([str(binary), *map(str, args)], input=stdin).stdout.splitlines()


def decode(line: str, dtype: str) -> np.ndarray:
    """A line of bit patterns as float64 values of dtype."""
    bits = np.array([int(b) for b in line.split()], dtype=np.uint16 if dtype == "float16" else np.uint32)
    return bits.view(np.float16 if dtype == "float16" else np.float32).astype(np.float64)


def encode(values: np.ndarray, dtype: str) -> str:
    with np.errstate(over="ignore", invalid="ignore"):
        cast = np.asarray(values).astype(dtype)
    return " ".join(map(str, cast.view(np.uint16 if dtype == "float16" else np.uint32).ravel().tolist()))


def float_probes() -> np.ndarray:
    """float32 bit patterns that exercise every rounding decision of float -> half: each finite
    half, the midpoint to the next one (a tie) and the floats just either side of both, the
    overflow threshold 65520, zeros, infinities, NaNs, both signs, plus random patterns."""
    halves = np.arange(0x7c00, dtype=np.uint16).view(np.float16).astype(np.float32)
    above = np.append(halves[1:], np.float32(65536.0))
    mids = ((halves.astype(np.float64) + above) / 2).astype(np.float32)  # exact: 12 significant bits
    exact = np.concatenate([halves, mids]).view(np.uint32)
    near = np.concatenate([exact, exact + 1, exact[exact > 0] - 1])
    specials = np.array([0x7f800000, 0x7fc00000, 0x7f800001, 0x7fffffff, 0x33000000, 0x33000001, 0x32ffffff,
                         0x38800000, 0x387fffff, 0x477fe000, 0x477ff000, 0x477fefff, 0x47800000, 0x7f7fffff, 1],
                        dtype=np.uint32)
    rng = np.random.default_rng(3)
    randoms = rng.integers(0, 2**32, 50_000, dtype=np.uint64).astype(np.uint32)
    positive = np.concatenate([near, specials])
    return np.concatenate([positive, positive | np.uint32(0x80000000), randoms])


@pytest.mark.parametrize("family", FAMILIES)
def test_fp16_host_conversion_matches_numpy(harnesses, family):
    # half -> float: exact for all 65536 patterns (NaN stays NaN).
    got = np.array(harness(harnesses[family], "half_to_float"), dtype=np.uint64).astype(np.uint32).view(np.float32)
    want = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
    # float -> half: round to nearest even, as numpy's astype(float16), zeros' signs included.
    probes = float_probes()
    lines = harness(harnesses[family], "float_to_half", stdin="\n".join(map(str, probes.tolist())) + "\n")
    got_half = np.array(lines, dtype=np.uint32).astype(np.uint16)
    with np.errstate(over="ignore", invalid="ignore"):
        want_half = probes.view(np.float32).astype(np.float16)
    nan = np.isnan(want_half)
    assert np.array_equal(np.isnan(got_half.view(np.float16)), nan)
    wrong = np.flatnonzero(got_half[~nan] != want_half[~nan].view(np.uint16))
    assert wrong.size == 0, [(hex(int(probes[~nan][i])), hex(int(got_half[~nan][i])),
                              hex(int(want_half[~nan].view(np.uint16)[i]))) for i in wrong[:10]]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_reduce_inputs_and_reference(harnesses, dtype):
    family = get_family("reduce")
    for n in (1, 3, 1000, 4097, 100_003):
        for case in range(3):
            lines = harness(harnesses["reduce"], "inputs", dtype, n, case, 11 + case)
            x = decode(lines[0], dtype)
            assert x.size == n and np.isfinite(x).all() and (x >= 0).all()
            want = float(family.reference(family.problem(dtype, n=n), {"x": x.astype(dtype)})[0])
            assert float(lines[1]) == pytest.approx(want, rel=1e-12)
            assert want == pytest.approx(math.fsum(x), rel=1e-12)
            if case == 1 and n >= 4097:
                # Heavy edges: the first and last 1024 elements hold about half of the sum.
                share = (math.fsum(x[:1024]) + math.fsum(x[-1024:])) / math.fsum(x)
                assert 0.35 < share < 0.65, (n, share)
                if n > 5 * 1024:  # scaled past 1: the middle stays in [0, 1)
                    assert min(x[:1024].min(), x[-1024:].min()) > 1 >= x[1024:-1024].max()
            else:
                # [0, 1) in float32; fp16 rounds the largest of them to 1, as the Python family's cast does.
                assert (x < 1).all() if dtype == "float32" else (x <= 1).all()
                if n >= 1000 and case != 1:
                    assert 0.45 < x.mean() < 0.55
    # The same seed gives the same inputs (AUTOGEN_SELFTEST_SEED repeats a run); another does not.
    first = harness(harnesses["reduce"], "inputs", dtype, 1000, 0, 5)
    assert first == harness(harnesses["reduce"], "inputs", dtype, 1000, 0, 5)
    assert first != harness(harnesses["reduce"], "inputs", dtype, 1000, 0, 6)


SOFTMAX_SHAPES = [(1, 1), (3, 5), (7, 33), (40, 257)]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_softmax_inputs_poison_and_reference(harnesses, dtype):
    family = get_family("softmax")
    for rows, cols in SOFTMAX_SHAPES:
        for case in range(4):
            lines = harness(harnesses["softmax"], "inputs", dtype, rows, cols, case, 21 + case)
            x = decode(lines[0], dtype).reshape(rows, cols)
            y = decode(lines[1], dtype).reshape(rows, cols)
            ref = np.array([float(v) for v in lines[2].split()]).reshape(rows, cols)
            want = family.reference(family.problem(dtype, rows=rows, cols=cols), {"x": x.astype(dtype)})
            assert np.array_equal(np.isnan(ref), np.isnan(want))
            assert np.allclose(ref[~np.isnan(ref)], want[~np.isnan(want)], rtol=1e-12, atol=0)
            dead = rows // 2
            if case == 2:
                assert np.isneginf(x[dead]).all() and np.isnan(ref[dead]).all()
                # The all -inf row is poisoned with +inf (NaN is its right answer), the rest NaN.
                assert np.isposinf(y[dead]).all() and np.isnan(np.delete(y, dead, axis=0)).all()
                others = np.delete(x, dead, axis=0)
                if others.size >= 200:
                    assert 0.15 < np.isneginf(others).mean() < 0.35
                assert np.isfinite(ref[~np.isneginf(x).all(axis=1)]).all()
            else:
                assert np.isnan(y).all() and np.isfinite(x).all()
                bound = 5000 if case == 1 else 0.5
                assert (np.abs(x) <= bound).all()
                if case == 1 and x.size >= 100:
                    assert np.abs(x).max() > 1000


def softmax_error(binary: Path, dtype: str, rows: int, cols: int, case: int, seed: int, y: np.ndarray):
    return softmax_judged(binary, dtype, rows, cols, case, seed, y)[:2]


def softmax_judged(binary: Path, dtype: str, rows: int, cols: int, case: int, seed: int, y: np.ndarray):
    """(error, why, rounding floor, kTolerance) of the hook's check of y."""
    lines = harness(binary, "error", dtype, rows, cols, case, seed, stdin=encode(y, dtype) + "\n")
    floor, tolerance = map(float, lines[2].split())
    return float(lines[0]), lines[1], floor, tolerance


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_softmax_error_passes_right_outputs_and_catches_wrong_ones(harnesses, dtype):
    family = get_family("softmax")
    binary = harnesses["softmax"]
    tolerance = SOFTMAX_TOLERANCES[dtype]
    rows, cols = 7, 33
    for case in range(4):
        seed = 31 + case
        lines = harness(binary, "inputs", dtype, rows, cols, case, seed)
        x = decode(lines[0], dtype).reshape(rows, cols)
        poison = decode(lines[1], dtype).reshape(rows, cols)
        with np.errstate(invalid="ignore"):
            ref = family.reference(family.problem(dtype, rows=rows, cols=cols), {"x": x.astype(dtype)})
        # The reference rounded to the dtype passes, NaN rows included.
        error, why = softmax_error(binary, dtype, rows, cols, case, seed, ref)
        assert why == "" and error <= tolerance, (case, error, why)
        # Left unwritten: caught, including the all -inf row (poisoned +inf there).
        error, why = softmax_error(binary, dtype, rows, cols, case, seed, poison)
        assert error == math.inf and why, (case, why)
        # One element NaN where the reference is finite.
        bad = ref.copy()
        bad[0, 0] = np.nan
        error, why = softmax_error(binary, dtype, rows, cols, case, seed, bad)
        assert error == math.inf and "NaN/inf" in why, (case, why)
        # Off by 1%: over the tolerance.
        error, why = softmax_error(binary, dtype, rows, cols, case, seed, ref * 1.01)
        assert why == "" and tolerance < error < 0.02, (case, error)
        if case == 2:
            # The all -inf row left at its +inf poison, or given zeros: not the NaN PyTorch gives.
            for wrong in (np.inf, 0.0):
                bad = ref.copy()
                bad[rows // 2] = wrong
                error, why = softmax_error(binary, dtype, rows, cols, case, seed, bad)
                assert error == math.inf and "reference is NaN" in why, (wrong, why)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_softmax_selftest_allows_fp16_outputs_their_rounding_on_vocabulary_rows(harnesses, dtype):
    # A tuned 32 x 128256 fp16 shape is checked by the self-test too: its probabilities are fp16
    # subnormals, and the hook adds the reference's own fp16 rounding to kTolerance, as autogen's
    # validation does (the same floor); fp32 outputs get nothing added.
    family = get_family("softmax")
    binary = harnesses["softmax"]
    rows, cols, seed = 2, 128256, 41
    x = decode(harness(binary, "inputs", dtype, rows, cols, 0, seed)[0], dtype).reshape(rows, cols)
    problem = family.problem(dtype, rows=rows, cols=cols)
    inputs = {"x": x.astype(dtype), "y": np.full((rows, cols), np.nan, dtype)}
    ref = family.reference(problem, inputs)
    error, why, floor, tolerance = softmax_judged(binary, dtype, rows, cols, 0, seed, ref)
    assert why == "" and floor == pytest.approx(family.representable_error(problem, inputs, ref, None, np), rel=1e-9)
    if dtype == "float32":
        assert floor == 0.0 and error <= tolerance
        return
    assert tolerance < error <= tolerance + floor  # passes only with the floor
    chopped = ref.astype(np.float16)
    away = np.abs(chopped.astype(np.float64)) > ref
    chopped[away] = np.nextafter(chopped[away], np.float16(0))
    error, why, floor, tolerance = softmax_judged(binary, dtype, rows, cols, 0, seed, chopped.astype(np.float64))
    assert why == "" and error > tolerance + floor
