"""concat's kernels run on the CPU: the rendered CUDA source built as host C++ (the thread and
block indices made globals), every block and thread of each launch of the family's own plan run in
turn (the kernels share nothing between threads, so any order is one a GPU may take; a kernel with
barriers, walk=inputs, runs each thread of a block as a fiber switched out at __syncthreads until
all of them reach it, so shared memory is seen as the GPU would order it), inputs and y
placed as the GPU tests place them (256-byte aligned, or one element past), and y compared with
numpy's concatenation bit for bit. It checks the walks' index arithmetic, the unit choice at run
ends and the plan's grids on odd shapes and splits without a GPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from emulated_cuda import build, finite_bits, mismatches, with_flaws

from autogen.core.registry import get_family
from autogen.core.render import render
from autogen.families.concat import SLOTS

CONCAT = get_family("concat")
CONFIGS = [  # (dtype, params): every walk, every unit width, single elements, two launches' worth of slots
    ("float16", {"vector_width": 8, "elements_per_thread": 16, "block_size": 128, "walk": "rows"}),
    ("float16", {"vector_width": 4, "elements_per_thread": 4, "block_size": 128, "walk": "rows"}),
    ("float16", {"vector_width": 2, "elements_per_thread": 2, "block_size": 128, "walk": "rows"}),
    ("float16", {"vector_width": 1, "elements_per_thread": 1, "block_size": 128, "walk": "rows"}),
    ("float32", {"vector_width": 4, "elements_per_thread": 8, "block_size": 128, "walk": "rows"}),
    ("float32", {"vector_width": 1, "elements_per_thread": 32, "block_size": 128, "walk": "rows"}),
    ("float16", {"vector_width": 1, "elements_per_thread": 8, "block_size": 128, "walk": "elements"}),
    ("float16", {"vector_width": 8, "elements_per_thread": 16, "block_size": 128, "walk": "shift"}),
    ("float16", {"vector_width": 8, "elements_per_thread": 8, "block_size": 128, "walk": "shift"}),
    ("float32", {"vector_width": 4, "elements_per_thread": 8, "block_size": 128, "walk": "shift"}),
    ("float16", {"vector_width": 2, "elements_per_thread": 4, "block_size": 128, "walk": "shift"}),  # pruned, yet exact
    ("float16", {"vector_width": 8, "elements_per_thread": 16, "block_size": 128, "walk": "inputs"}),
    ("float32", {"vector_width": 4, "elements_per_thread": 8, "block_size": 128, "walk": "inputs"}),
    ("bfloat16", {"vector_width": 2, "elements_per_thread": 4, "block_size": 128, "walk": "inputs"}),
]  # walk=inputs: offset 1 puts each input off a Pack, so its single-element stage runs too
# Deliberately broken forms of walk=inputs (emulated_cuda.with_flaws).
BROKEN = {
    "carry": ("            col -= (int)width;\n", "            col -= (int)width - 1;\n"),
    "barrier": ("        __syncthreads();\n        scatter(", "        scatter("),
    "tail": ("            for (int v = (int)whole; v < left; ++v)", "            for (int v = (int)whole + 1; v < left; ++v)"),
}
BROKEN_BASE = ("float16", {"vector_width": 8, "elements_per_thread": 16, "block_size": 128, "walk": "inputs"})
# (k, rows, cols): odd widths, more inputs than a launch takes, a wide and a narrow one.
SHAPES = [(1, 1, 1), (3, 7, 33), (9, 67, 301), (17, 40, 33), (3, 5, 4099), (4, 300, 7)]


DRIVER = r"""
// stdin: variant k rows cols axis offset, the k extents, then per launch its grid (x and y);
// input values from argv[1] (all inputs in order), y written to argv[2].
template <class E, class K>
int run(K kernel, int block, bool fibered)
{
    int k, rows, cols, axis, offset;
    if (std::scanf("%d %d %d %d %d", &k, &rows, &cols, &axis, &offset) != 5) return 2;
    std::vector<int> extents(k);
    for (int& e : extents) std::scanf("%d", &e);
    const std::size_t n = (std::size_t)rows * cols, align = 256 / sizeof(E);
    std::vector<E> values(n);
    std::FILE* in = std::fopen(ARGV[1], "rb");
    if (!in || std::fread(values.data(), sizeof(E), n, in) != n) return 3;
    std::fclose(in);
    // Every input at a 256-byte aligned start plus the offset, as a GPU allocation would be.
    std::vector<E> pool(n + k * (align + 1) + 2 * align), out(n + 2 * align);
    E* base = reinterpret_cast<E*>((reinterpret_cast<std::uintptr_t>(pool.data()) + 255) / 256 * 256);
    E* y = reinterpret_cast<E*>((reinterpret_cast<std::uintptr_t>(out.data()) + 255) / 256 * 256) + offset;
    std::memset(y, 0xff, n * sizeof(E));  // poison
    std::vector<const E*> xs;
    std::size_t start = 0, taken = 0;
    for (int s = 0; s < k; ++s) {
        const std::size_t count = (std::size_t)extents[s] * (axis == 0 ? cols : rows);
        E* x = base + start + offset;
        std::memcpy(x, values.data() + taken, count * sizeof(E));
        xs.push_back(x);
        taken += count;
        start += (count + offset + align - 1) / align * align;
    }
    int first = 0;
    for (int group = 0; group < k; group += kSlots) {
        unsigned grid, grid_y;
        if (std::scanf("%u %u", &grid, &grid_y) != 2) return 4;
        const int slots = k - group < kSlots ? k - group : kSlots;
        const E* x[kSlots];
        int e[kSlots];
        for (int s = 0; s < kSlots; ++s) {
            x[s] = s < slots ? xs[group + s] : y;
            e[s] = s < slots ? extents[group + s] : 0;
        }
        blockDim.x = block, gridDim.x = grid, gridDim.y = grid_y;
        for (blockIdx.y = 0; blockIdx.y < grid_y; ++blockIdx.y)
            for (blockIdx.x = 0; blockIdx.x < grid; ++blockIdx.x) {
                if (fibered) {
                    if (!run_fibered_block(block, [&] { kernel(X_ARGS, E_ARGS, slots, first, y, rows, cols, axis); }))
                        return 5;
                    continue;
                }
                for (threadIdx.x = 0; threadIdx.x < (unsigned)block; ++threadIdx.x)
                    kernel(X_ARGS, E_ARGS, slots, first, y, rows, cols, axis);
            }
        for (int s = 0; s < slots; ++s) first += e[s];
    }
    return write_output(y, n);
}
"""


@pytest.fixture(scope="module")
def emulator(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("concat_emulated")
    kernels, cases = [], []
    for index, (dtype, params, name, source) in enumerate(variants()):
        kernels.append(source)
        elem = "float" if dtype == "float32" else "unsigned short"
        fibered = "true" if "__syncthreads" in source else "false"
        cases.append(f"    case {index}: return run<{elem}>({name}, {params['block_size']}, {fibered});")
    driver = (f"\nconstexpr int kSlots = {SLOTS};\n" + DRIVER.replace("X_ARGS", ", ".join(f"x[{s}]" for s in range(SLOTS)))
              .replace("E_ARGS", ", ".join(f"e[{s}]" for s in range(SLOTS))))
    return build(work, kernels, driver, cases)


def variants() -> list[tuple[str, dict, str, str]]:
    """(dtype, params, kernel name, source): CONFIGS, then BROKEN's copies of BROKEN_BASE."""
    found = []
    for dtype, params in CONFIGS:
        config = CONCAT.space.check(params)
        found.append((dtype, params, CONCAT.kernel_name(dtype, config), render(CONCAT, dtype, config)))
    dtype, params = BROKEN_BASE
    return found + [(dtype, params, name, source) for name, source in with_flaws(CONCAT, dtype, params, BROKEN)]


def splits(rng, total: int, k: int) -> list[list[int]]:
    """Nearly equal parts, random ones (at least one each where the axis allows) and, where k > 1,
    one with an empty input."""
    even = [total // k + (1 if s < total % k else 0) for s in range(k)]
    cuts = np.sort(rng.choice(np.arange(1, total), size=k - 1, replace=False)) if 1 < k <= total else []
    random = list(np.diff([0, *cuts, total])) if len(cuts) == k - 1 else even
    parts = [even, [int(e) for e in random]]
    if k > 1 and total >= k - 1:
        parts.append([0, *even[1:-1], even[0] + even[-1]])
    return parts


def cases(variant: int, dtype: str, params: dict):
    """Every launch of the plan on SHAPES along both axes, each split, aligned and one element off:
    (stdin spec, the inputs' values in order, numpy's concatenation)."""
    config = CONCAT.space.check(params)
    rng = np.random.default_rng(variant)
    for k, rows, cols in SHAPES:
        for axis in (0, 1):
            total = rows if axis == 0 else cols
            if k > total:
                continue
            problem = CONCAT.problem(dtype, k=k, rows=rows, cols=cols, axis=str(axis))
            grids = [f"{step.launch.grid[0]} {step.launch.grid[1]}" for step in CONCAT.plan(problem, config)]
            for extents in splits(rng, total, k):
                for offset in (0, 1):
                    values = finite_bits(rng, rows * cols, dtype)
                    pieces, at = [], 0
                    for e in extents:
                        shape = (e, cols) if axis == 0 else (rows, e)
                        pieces.append(values[at:at + e * (cols if axis == 0 else rows)].reshape(shape))
                        at += pieces[-1].size
                    spec = " ".join(map(str, [variant, k, rows, cols, axis, offset, *extents, *grids]))
                    yield spec, values, np.concatenate(pieces, axis=axis)


@pytest.mark.parametrize("variant", range(len(CONFIGS)))
def test_every_launch_of_the_plan_joins_the_inputs_exactly(emulator, tmp_path, variant):
    dtype, params = CONFIGS[variant]
    wrong = mismatches(emulator, tmp_path, cases(variant, dtype, params))
    assert not wrong, f"{CONCAT.kernel_name(dtype, CONCAT.space.check(params))}: {wrong[:3]}"


@pytest.mark.parametrize("flaw", list(BROKEN))
def test_a_broken_input_walk_fails_the_emulation(emulator, tmp_path, flaw):
    dtype, params = BROKEN_BASE
    assert mismatches(emulator, tmp_path, cases(len(CONFIGS) + list(BROKEN).index(flaw), dtype, params), first_only=True)
