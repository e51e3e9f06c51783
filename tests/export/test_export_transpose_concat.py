"""`autogen export --self-test` for transpose and concat without a GPU: every entry point gets its
family's hook (templates/<family>/selftest.cu.j2), transpose's small shapes replay the Python
family's data while concat's entry point (host arrays of input pointers) is checked by its hook at
every shape; the kernels and the self-test build for sm_90 with warnings as errors and the
self-test fails cleanly without a GPU. The hooks' host side (where each input element must land,
the values, the splits, the exact check's verdict) runs on the CPU through a small harness and is
checked against numpy. What the kernels compute on a GPU is tests/families/test_gpu_*'s business."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from autogen.core.registry import get_family
from conftest import gpu_unavailable_reason
from nvcc_tools import nvcc_or_skip
from test_export import WERROR, build_libraries, export_winners, run

TRANSPOSE, CONCAT = get_family("transpose"), get_family("concat")
# family -> [(dtype, dims, params)]: one shape too large to ship data for per family, one small.
WINNERS = {
    "transpose": [("float32", {"rows": 4096, "cols": 4096},
                   {"tile": 32, "vector_width": 4, "elements_per_thread": 16, "layout": "pad"}),
                  ("float16", {"rows": 67, "cols": 131},
                   {"tile": 64, "vector_width": 8, "elements_per_thread": 32, "layout": "swizzle"})],
    "concat": [("float16", {"k": 9, "rows": 2047, "cols": 3001, "axis": "1"},
                {"vector_width": 8, "elements_per_thread": 16, "block_size": 128, "walk": "rows"}),
               ("bfloat16", {"k": 5, "rows": 4099, "cols": 3001, "axis": "0"},
                {"vector_width": 1, "elements_per_thread": 8, "block_size": 256, "walk": "elements"}),
               ("float32", {"k": 3, "rows": 4099, "cols": 3001, "axis": "1"},
                {"vector_width": 4, "elements_per_thread": 8, "block_size": 128, "walk": "inputs"})],
}


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, Path]:
    return export_winners(tmp_path_factory.mktemp("export_copy2d"),
                          [(family, *winner) for family, winners in WINNERS.items() for winner in winners])


@pytest.fixture(scope="module")
def libraries(exports, tmp_path_factory) -> dict[str, Path]:
    """family -> the static library of its exported kernels for sm_90, warnings as errors."""
    return build_libraries(exports, "sm_90", tmp_path_factory.mktemp("copy2d_build"))


def namespace_of(selftest: str, symbol: str) -> str:
    return selftest.split(f"namespace {symbol}_test {{", 1)[1].split(f"}}  // namespace {symbol}_test", 1)[0]


@pytest.mark.parametrize("family", ["transpose", "concat"])
def test_every_entry_point_gets_the_hook(exports, family):
    selftest = (exports[family] / f"autogen_{family}_selftest.cu").read_text()
    assert "skipped" not in selftest and "no self-test hook" not in selftest
    symbols = [line.split("// ---- ", 1)[1].split(" ", 1)[0] for line in selftest.splitlines() if line.startswith("// ---- autogen_")]
    assert len(symbols) == len(get_family(family).dtypes) * (2 if family == "concat" else 1)
    for symbol in symbols:
        part = namespace_of(selftest, symbol)
        assert "class Workload {" in part and "static constexpr double kTolerance = 0.0;" in part
        assert f"selftest::run<{symbol}_test::Workload>({symbol}_test::entry(), rng, report);" in selftest
        # transpose replays the Python family's data first; concat's pointer arrays cannot be replayed.
        assert (f"selftest::replay({symbol}_test::entry()," in selftest) == (family == "transpose")
        if family == "concat":
            assert f"kTimingAxis = {symbol[-1]};" in part
            # Every shape goes to the hook, tail shapes included.
            assert "e.checked.push_back({ {1, 1, 1}});" in part and "e.checked.push_back({ {17, 40, 33}});" in part
    big = namespace_of(selftest, "autogen_transpose" if family == "transpose" else "autogen_concat_f16_1")
    tuned = "4096, 4096" if family == "transpose" else "9, 2047, 3001"
    assert f"e.checked.push_back({{ {{{tuned}}}}});" in big  # too large for data: the hook checks it


@pytest.mark.parametrize("family", ["transpose", "concat"])
def test_selftest_builds_for_sm90_and_fails_cleanly_without_a_gpu(harnesses, family):
    # The harness is the self-test built for sm_90 with warnings as errors; with no arguments it
    # runs the self-test's own main.
    if gpu_unavailable_reason() is not None:
        done = subprocess.run([str(harnesses[family])], capture_output=True, text=True, timeout=60)
        assert done.returncode == 1 and "no CUDA GPU available" in done.stdout, done.stdout + done.stderr


# -- the hooks' host side, on the CPU ----------------------------------------------------------------

HARNESS = r"""
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define main autogen_selftest_main
#include "autogen_@FAMILY@_selftest.cu"
#undef main

namespace t = @NAMESPACE@;

// places rows cols k axis random seed: the split, then per input element (in order) where it
// lands in y, then y's values (value_at of every flat index), then the check's text for an
// output with one element wrong and one left poisoned.
int main(int argc, char** argv)
{
    if (argc == 1) return autogen_selftest_main(argc, argv);  // the self-test itself
    if (argc != 7) return 2;
    const int rows = std::atoi(argv[1]), cols = std::atoi(argv[2]), k = std::atoi(argv[3]), axis = std::atoi(argv[4]);
    selftest::Rng rng(std::strtoull(argv[6], nullptr, 10));
    const std::size_t n = (std::size_t)rows * cols;
@PLACES@
    const std::uint64_t key = rng.fill_key();
    for (std::size_t o = 0; o < n; ++o) std::printf("%llu ", (unsigned long long)t::value_at(key, o));
    std::string why;
    std::printf("\n%g|", t::copy_error(0, ~0ull, n, 0, &why));
    const double wrong = t::copy_error(1, 3, n, 5, &why);
    std::printf("%g %s|", wrong, why.c_str());
    const double unwritten = t::copy_error(2, 0, n, t::kPoison, &why);
    std::printf("%g %s\n", unwritten, why.c_str());
    return 0;
}
"""

TRANSPOSE_PLACES = r"""
    (void)k, (void)axis, (void)argv[5];
    std::printf("%d\n", rows);
    const t::Workload::Place place{(std::size_t)rows, (std::size_t)cols};
    for (std::size_t i = 0; i < n; ++i) std::printf("%zu ", place(i));
    std::printf("\n");
"""

CONCAT_PLACES = r"""
    const std::vector<int> extents = t::Workload::split(k, axis == 0 ? rows : cols, std::atoi(argv[5]) != 0, rng);
    for (int e : extents) std::printf("%d ", e);
    std::printf("\n");
    std::size_t before = 0;
    for (int e : extents) {
        const t::Workload::Place place{axis, (std::size_t)e, before, (std::size_t)cols};
        for (std::size_t i = 0; i < (std::size_t)e * (axis == 0 ? cols : rows); ++i) std::printf("%zu ", place(i));
        before += (std::size_t)e;
    }
    std::printf("\n");
"""


@pytest.fixture(scope="module")
def harnesses(exports, libraries, tmp_path_factory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("copy2d_harness")
    made = {}
    for family, namespace, places in (("transpose", "autogen_transpose_bf16_test", TRANSPOSE_PLACES),
                                      ("concat", "autogen_concat_f16_1_test", CONCAT_PLACES)):
        source = work / f"harness_{family}.cu"
        source.write_text(HARNESS.replace("@FAMILY@", family).replace("@NAMESPACE@", namespace)
                          .replace("@PLACES@", places))
        made[family] = work / f"harness_{family}"
        run([nvcc_or_skip(), "-arch=sm_90", "-std=c++17", "-O3", *WERROR, f"-I{exports[family]}", str(source),
             str(libraries[family]), "-o", str(made[family])])
    return made


def harness(binary: Path, *args) -> list[str]:
    return run([str(binary), *map(str, args)]).stdout.splitlines()


def check_values_and_verdicts(lines: list[str], n: int) -> np.ndarray:
    """y's values: n distinct-enough finite 16-bit patterns (exponent's top bit clear, never the
    poison); the exact check's verdicts."""
    values = np.array(lines[0].split(), dtype=np.uint64)
    assert values.size == n and (values & 0x4000).max(initial=0) == 0 and (values < 1 << 16).all()
    assert not np.isnan(values.astype(np.uint16).view(np.float16)).any()
    if n >= 100:
        assert np.unique(values).size > 0.9 * n
    ok, wrong, unwritten = lines[1].split("|")
    assert float(ok) == 0.0
    assert wrong == f"inf 1 of {n} elements differ (first at flat index 3)"
    assert unwritten == f"inf 2 of {n} elements differ (first at flat index 0: poison left, unwritten)"
    return values


@pytest.mark.parametrize("rows, cols", [(1, 1), (1, 37), (37, 1), (33, 65)])
def test_transpose_hook_places_each_element_at_its_transposed_index(harnesses, rows, cols):
    lines = harness(harnesses["transpose"], rows, cols, 0, 0, 0, 5)
    places = np.array(lines[1].split(), dtype=np.int64)
    values = check_values_and_verdicts(lines[2:], rows * cols)
    x = values[places].reshape(rows, cols)  # x as the hook fills it
    assert np.array_equal(x.T.ravel(), values)  # transposed, it is y's values


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("random", [0, 1])
@pytest.mark.parametrize("k, rows, cols", [(1, 1, 1), (3, 7, 33), (9, 19, 23), (17, 40, 33), (5, 3, 4)])
def test_concat_hook_splits_and_places_inputs_so_that_joined_they_are_y(harnesses, axis, random, k, rows, cols):
    lines = harness(harnesses["concat"], rows, cols, k, axis, random, 11 + k)
    extents = [int(e) for e in lines[0].split()]
    total = rows if axis == 0 else cols
    assert len(extents) == k and sum(extents) == total and min(extents) >= 0
    if not random:  # nearly equal, the first total % k one longer, as concat.py's even split
        assert extents == [total // k + (1 if s < total % k else 0) for s in range(k)]
    places = np.array(lines[1].split(), dtype=np.int64)
    values = check_values_and_verdicts(lines[2:], rows * cols)
    pieces, at = [], 0
    for e in extents:
        shape = (e, cols) if axis == 0 else (rows, e)
        pieces.append(values[places[at:at + e * (cols if axis == 0 else rows)]].reshape(shape))
        at += pieces[-1].size
    assert at == rows * cols
    assert np.array_equal(np.concatenate(pieces, axis=axis).ravel(), values)
