"""histogram on the CPU: space and constraints, shape pruning, geometry and the shared-memory
fallback, inputs and poison, the exact reference and comparison, the Python call's arguments, and
the export self-test hook compiled with nvcc and run on the CPU (its inputs and reference against
the Python family)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from autogen.core.problem import shape_distance
from autogen.errors import ArgumentError, UsageError
from autogen.families.histogram import (HOT_BINS, POISON, SHARED_LIMIT_BYTES, exact_counts, histogram_values)
from autogen.core.registry import get_family
from autogen.core.problem import Problem

FAMILY = get_family("histogram")


def config(**changes):
    return FAMILY.space.check({**FAMILY.default_params, **changes})


def test_space_size_and_constraints():
    assert FAMILY.space.size() == 1800
    assert FAMILY.space.violations({**FAMILY.default_params, "target": "global", "copies": 2})
    assert FAMILY.space.violations({**FAMILY.default_params, "block_size": 1024, "blocks_per_sm": 4})
    assert FAMILY.space.violations({**FAMILY.default_params, "block_size": 1024, "blocks_per_sm": 1,
                                    "items_per_thread": 32})
    for point in FAMILY.space.enumerate():
        assert point["target"] == "shared" or point["copies"] == 1
        assert point["block_size"] * point["blocks_per_sm"] <= 2048


def test_problem_traits_and_key():
    problem = FAMILY.problem(n=2**28, bins=256, distribution="skewed")
    assert problem.shape_key == "n=268435456,bins=256,distribution=skewed"
    assert FAMILY.problem(n=10, bins=3).shape_key == "n=10,bins=3,distribution=uniform"
    with pytest.raises(UsageError, match="distribution"):
        FAMILY.problem(n=10, bins=3, distribution="zipf")
    with pytest.raises(UsageError, match="bins"):
        FAMILY.problem(n=10)
    with pytest.raises(UsageError):
        FAMILY.problem("float32", n=10, bins=3)
    # A kernel tuned on skewed data is no neighbour of a uniform problem (dispatcher, warm start).
    assert math.isinf(shape_distance(problem, FAMILY.problem(n=2**28, bins=256)))


def test_shared_memory_fits_or_falls_back_to_global():
    small = FAMILY.problem(n=100_000, bins=4096)
    assert FAMILY.launch(small, config(copies=2)).shared_bytes == 4096 * 2 * 4
    assert FAMILY.reject_reason(small, config(copies=2)) is None
    # 4096 bins x 4 copies = 64 KiB: no shared memory given, pruned, still a valid launch.
    assert FAMILY.launch(small, config(copies=4)).shared_bytes == 0
    assert "exceed" in FAMILY.reject_reason(small, config(copies=4))
    assert FAMILY.launch(small, config(target="global")).shared_bytes == 0
    assert FAMILY.launch(FAMILY.problem(n=5, bins=SHARED_LIMIT_BYTES // 4), config(copies=1)).shared_bytes == SHARED_LIMIT_BYTES
    huge = FAMILY.problem(n=5, bins=2**31 - 1)
    assert FAMILY.launch(huge, config()).shared_bytes == 0


def test_plan_zeroes_then_counts_and_grid_is_one_wave_at_most():
    problem = FAMILY.problem(n=2**28, bins=256)
    steps = FAMILY.plan(problem, config(block_size=256, items_per_thread=16, blocks_per_sm=4))
    assert [s.suffix for s in steps] == ["_init", ""]
    assert steps[0].launch.grid == (1, 1, 1) and steps[0].launch.block == (256, 1, 1)
    assert steps[1].launch.grid == (132 * 4, 1, 1)
    tiny = FAMILY.problem(n=5, bins=10**7)
    steps = FAMILY.plan(tiny, config())
    assert steps[0].launch.grid[0] == 1024  # capped; the init kernel strides
    assert steps[1].launch.grid == (1, 1, 1)


def test_reject_reasons():
    assert "spans" in FAMILY.reject_reason(FAMILY.problem(n=100, bins=4), config(block_size=1024, items_per_thread=8,
                                                                                  blocks_per_sm=1))
    assert FAMILY.reject_reason(FAMILY.problem(n=100, bins=4), config(block_size=128, items_per_thread=4)) is None
    assert FAMILY.reject_reason(FAMILY.problem(n=2**24, bins=256), config()) is None


@pytest.mark.parametrize("kind", ["uniform", "skewed", "one_bin", "out_of_range"])
def test_values_of_each_case(kind):
    rng = np.random.default_rng(1)
    n, bins = 200_000, 256
    x = histogram_values(np, rng, n, bins, kind)
    assert x.dtype == np.int32 and x.shape == (n,)
    inside = (x >= 0) & (x < bins)
    if kind == "uniform":
        assert inside.all() and np.bincount(x, minlength=bins).min() > 0.7 * n / bins
    elif kind == "skewed":
        counts = np.sort(np.bincount(x, minlength=bins))[::-1]
        assert inside.all() and counts[:HOT_BINS].sum() > 0.88 * n
    elif kind == "one_bin":
        assert inside.all() and np.unique(x).size == 1
    else:
        assert 0.25 < inside.mean() < 0.42
        for value in (-2**31, 2**31 - 1, -1, bins):
            assert value in x[:6] and value in x[-6:]


def test_out_of_range_values_of_huge_bins_stay_int32():
    x = histogram_values(np, np.random.default_rng(2), 10_000, 2**31 - 1, "out_of_range")
    assert x.dtype == np.int32 and x.max() == 2**31 - 1 and x.min() == -2**31


def test_inputs_are_poisoned_and_reference_ignores_outside_values():
    problem = FAMILY.problem(n=1000, bins=7)
    inputs = FAMILY.make_inputs(problem, np, np.random.default_rng(3), {"values": "out_of_range"})
    assert inputs["counts"].dtype == np.uint32 and (inputs["counts"] == POISON).all()
    reference = FAMILY.reference(problem, inputs, np)
    x = inputs["x"]
    want = np.array([(x == b).sum() for b in range(7)], dtype=np.float64)
    assert reference.dtype == np.float64 and np.array_equal(reference, want)
    assert reference.sum() == ((x >= 0) & (x < 7)).sum() < 1000
    # The poisoned counts fail; the right ones pass; one count off by one fails.
    assert FAMILY.compare(problem, inputs, reference, None, np)[0] == math.inf
    inputs["counts"][:] = want.astype(np.uint32)
    assert FAMILY.compare(problem, inputs, reference, None, np) == (0.0, "")
    inputs["counts"][3] += 1
    error, reason = FAMILY.compare(problem, inputs, reference, None, np)
    assert error == math.inf and "bin 3" in reason and "1 of 7" in reason


def test_exact_counts_reads_int32_and_uint32_alike():
    want = np.array([0, 5, 2**31 - 1], dtype=np.float64)
    assert exact_counts(np, np.array([0, 5, 2**31 - 1], dtype=np.int32), want) == (0.0, "")
    assert exact_counts(np, np.array([0, 5, 2**31 - 1], dtype=np.uint32), want) == (0.0, "")
    assert exact_counts(np, np.array([0, 5, 2**31 - 2], dtype=np.uint32), want)[0] == math.inf


def test_validation_and_timing_cases_follow_the_distribution():
    skewed = FAMILY.problem(n=10, bins=3, distribution="skewed")
    assert FAMILY.validation_cases(skewed)[0] == {"values": "skewed"}
    assert FAMILY.timing_case(skewed) == {"values": "skewed"}
    assert {"values": "out_of_range"} in FAMILY.validation_cases(skewed)
    assert FAMILY.bytes_moved(skewed) == 4 * 10 + 4 * 3


def test_trait_names_reach_the_database_key():
    problem = Problem("histogram", "int32", (("n", 5), ("bins", 2), ("distribution", "skewed")))
    assert problem.traits == (("distribution", "skewed"),) and problem.sizes == (("n", 5), ("bins", 2))


# -- the export self-test hook, compiled with nvcc and run on the CPU ---------------------------------

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
#include "autogen_histogram_selftest.cu"
#undef main

namespace t = autogen_histogram_test;

// inputs n bins case seed: x, then the reference counts. compare bins < counts want: the verdict.
int main(int argc, char** argv)
{
    if (argc == 1) return autogen_selftest_main(argc, argv);  // the self-test itself
    const std::string mode = argv[1];
    if (mode == "inputs") {
        const int n = std::atoi(argv[2]), bins = std::atoi(argv[3]), c = std::atoi(argv[4]);
        selftest::Rng rng(std::strtoull(argv[5], nullptr, 10));
        std::vector<int> x((std::size_t)n);
        t::Workload::make_inputs(c, rng, bins, x);
        for (int v : x) std::printf("%d ", v);
        std::printf("\n");
        for (std::uint32_t v : t::Workload::reference(x, bins)) std::printf("%u ", v);
        std::printf("\n");
        return 0;
    }
    const int bins = std::atoi(argv[2]);
    std::vector<std::uint32_t> got((std::size_t)bins), want((std::size_t)bins);
    for (auto& v : got) std::scanf("%u", &v);
    for (auto& v : want) std::scanf("%u", &v);
    std::string why;
    const double error = t::Workload::compare(got, want, &why);
    std::printf("%g\n%s\n", error, why.c_str());
    return 0;
}
"""


def export_with_defaults(family_name: str, out: Path, tuned: dict | None = None) -> dict[str, str]:
    """The export files of a family, built from checked values without a database: every dtype
    gets its entry point with the default variant, or the variants of `tuned` ({dtype: [(sizes,
    params)]}, keyed by sizes only). Until `autogen export` takes families with traits (the
    database key holds them), this is how the hooks are rendered."""
    from autogen.export.writer import (
        EntryPoint,
        ExportModel,
        TunedShape,
        _variant,
        c_arg_names,
        entry_symbol,
        render_files,
        write_files,
    )
    from test_export import H100

    family = get_family(family_name)
    entries, variants = [], {}
    for dtype in family.dtypes:
        shapes, default = [], None
        for sizes, params in (tuned or {}).get(dtype, []):
            config = family.space.check(params)
            name = family.kernel_name(dtype, config)
            variants.setdefault(name, _variant(family, dtype, config))
            problem = Problem(family.name, dtype, tuple(zip(family.dims, sizes)))
            shapes.append(TunedShape(problem, config, name, 10.0, "", None, "cold", "test"))
        shapes.sort(key=lambda s: s.problem.shape_key)
        if not shapes:
            default = variants.setdefault(family.kernel_name(dtype, family.default_config()),
                                          _variant(family, dtype, family.default_config()))
        c_params = family.c_params_for(dtype)
        entries.append(EntryPoint(entry_symbol(family, dtype), dtype, c_params, c_arg_names(c_params, family),
                                  tuple(shapes), default))
    model = ExportModel(family, H100, "sm_90", tuple(entries), tuple(variants.values()), "2026-01-01T00:00:00+00:00",
                        {"driver": "-", "runtime": "-", "nvrtc": "-", "autogen": "-"}, self_test=True)
    files = render_files(model)
    write_files(files, out)
    return files


def build_harness(out: Path, family_name: str, harness: str, tmp: Path) -> Path:
    from nvcc_tools import nvcc_or_skip
    from test_export import WERROR, build_library, run

    library = build_library(out / f"autogen_{family_name}.cu", "sm_90", tmp)
    # The harness holds the whole self-test (its main renamed), so building it as the self-test
    # is built (sm_90, -O3, warnings as errors) checks the self-test builds: one host compile of
    # the self-test's code, not two.
    source = tmp / "harness.cu"
    source.write_text(harness)
    binary = tmp / "harness"
    run([nvcc_or_skip(), "-arch=sm_90", "-std=c++17", "-O3", *WERROR, f"-I{out}", str(source), str(library),
         "-o", str(binary)])
    return binary


@pytest.fixture(scope="module")
def hook(tmp_path_factory):
    root = tmp_path_factory.mktemp("histogram_hook")
    tuned = {"int32": [((4096, 256), dict(FAMILY.default_params)),
                       ((2**20, 4096), {**FAMILY.default_params, "target": "global", "aggregate": "warp"})]}
    export_with_defaults("histogram", root / "out", tuned)
    return build_harness(root / "out", "histogram", HARNESS, root)


def test_selftest_hook_is_rendered_for_the_entry_point(tmp_path):
    files = export_with_defaults("histogram", tmp_path)
    selftest = files["autogen_histogram_selftest.cu"]
    assert "class Workload {" in selftest and "no self-test hook" not in selftest
    assert "static constexpr double kTolerance = 1e-12;" in selftest
    source = files["autogen_histogram.cu"]
    name = FAMILY.kernel_name("int32", FAMILY.default_config())
    assert f"cudaError_t {name}_launch(const int* x, void* counts, int n, int bins, cudaStream_t stream)" in source


@pytest.mark.parametrize("case", range(5))
def test_hook_inputs_and_reference_match_the_family(hook, case):
    from test_export import run

    for n, bins in ((1, 1), (37, 5), (5000, 256), (3000, 20000)):
        lines = run([str(hook), "inputs", str(n), str(bins), str(case), str(7 + case)]).stdout.splitlines()
        x = np.array(lines[0].split(), dtype=np.int64)
        counts = np.array(lines[1].split(), dtype=np.int64)
        assert x.size == n and counts.size == bins and x.min() >= -2**31 and x.max() < 2**31
        problem = FAMILY.problem(n=n, bins=bins)
        want = FAMILY.reference(problem, {"x": x.astype(np.int32)}, np)
        assert np.array_equal(counts, want.astype(np.int64))
        inside = (x >= 0) & (x < bins)
        if case in (0, 1, 3, 4):
            assert inside.all()
        if case == 3:
            assert np.unique(x).size == 1
        if case == 1 and n >= 5000:
            assert np.sort(counts)[::-1][:4].sum() > 0.85 * n
        if case == 2 and n >= 5000:
            assert 0.2 < inside.mean() < 0.45 and x.min() == -2**31 and x.max() == 2**31 - 1


def test_hook_compare_is_exact(hook):
    from test_export import run

    want = [3, 0, 7]
    ok = run([str(hook), "compare", "3"], input="3 0 7 " + " ".join(map(str, want))).stdout.splitlines()
    assert float(ok[0]) == 0.0
    bad = run([str(hook), "compare", "3"], input="3 1 7 " + " ".join(map(str, want))).stdout.splitlines()
    assert bad[0] == "inf" and "bin 1" in bad[1]
    poisoned = run([str(hook), "compare", "3"], input=f"{POISON} {POISON} {POISON} 3 0 7").stdout.splitlines()
    assert poisoned[0] == "inf" and "3 of 3" in poisoned[1]
