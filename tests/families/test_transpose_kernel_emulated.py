"""transpose's kernels run on the CPU (tests/support/emulated_cuda.py): the rendered CUDA source
built as host C++, every block of the family's launch run with its threads as fibers that meet at
the barrier, x and y placed as the GPU tests place them (256-byte aligned, or one element past, so
the vector paths and their single-element fallbacks both run), and y compared with numpy's
transpose bit for bit. It checks the staged layouts' index arithmetic (the two-row words of
layout=pairs above all) and the edge tiles on odd shapes without a GPU."""

from __future__ import annotations

import numpy as np
import pytest
from emulated_cuda import build, finite_bits, mismatches, with_flaws

from autogen.core.registry import get_family
from autogen.core.render import render

TRANSPOSE = get_family("transpose")
CONFIGS = [  # (dtype, params): every layout and raster, pairs at every pack width and tile
    ("float16", {"tile": 32, "vector_width": 8, "elements_per_thread": 16, "layout": "pairs"}),
    ("float16", {"tile": 64, "vector_width": 8, "elements_per_thread": 32, "layout": "pairs"}),
    ("bfloat16", {"tile": 64, "vector_width": 4, "elements_per_thread": 8, "layout": "pairs"}),
    ("float16", {"tile": 32, "vector_width": 2, "elements_per_thread": 4, "layout": "pairs"}),
    ("float16", {"tile": 64, "vector_width": 2, "elements_per_thread": 16, "layout": "pairs"}),
    ("float16", {"tile": 32, "vector_width": 8, "elements_per_thread": 8, "layout": "pad"}),
    ("float16", {"tile": 64, "vector_width": 8, "elements_per_thread": 16, "layout": "pairs", "raster": "cols"}),
    ("float32", {"tile": 32, "vector_width": 1, "elements_per_thread": 8, "layout": "pad", "raster": "cols"}),
    ("float16", {"tile": 64, "vector_width": 8, "elements_per_thread": 32, "layout": "swizzle"}),
    ("float32", {"tile": 32, "vector_width": 4, "elements_per_thread": 8, "layout": "plain"}),
    ("float32", {"tile": 64, "vector_width": 4, "elements_per_thread": 16, "layout": "pairs"}),
    ("float32", {"tile": 32, "vector_width": 2, "elements_per_thread": 4, "layout": "pairs"}),
    ("float32", {"tile": 64, "vector_width": 1, "elements_per_thread": 8, "layout": "pad"}),
]
# Deliberately broken forms of the first config (emulated_cuda.with_flaws).
BROKEN = {
    "halves": ("Pair{held[2 * p][v], held[2 * p + 1][v]}", "Pair{held[2 * p + 1][v], held[2 * p][v]}"),
    "words": ("staged_word(band + j * ROW_STEP, col / 2)", "staged_word(band + j * ROW_STEP, col)"),
    "barrier": ("    __syncthreads();\n", "\n"),
}
# rows x cols: single rows and columns, sizes off every tile and pack, a tall and a wide one
# (the emulation runs every variant on every shape, pruned or not: the kernel must be exact anyway).
SHAPES = [(1, 1), (1, 37), (37, 1), (3, 5), (33, 65), (66, 130), (130, 66), (64, 64), (7, 200), (257, 131)]

DRIVER = r"""
// stdin: (the variant, read by MAIN) rows cols offset; x's values from argv[1], y written to
// argv[2]. One block per tile of the family's launch, each block's threads as fibers.
template <class E, class K>
int run(K kernel, int tile, int threads)
{
    int rows, cols, offset;
    if (std::scanf("%d %d %d", &rows, &cols, &offset) != 3) return 2;
    const std::size_t n = (std::size_t)rows * cols, align = 256 / sizeof(E);
    std::vector<E> xs(n + 2 * align), ys(n + 2 * align);
    E* x = reinterpret_cast<E*>((reinterpret_cast<std::uintptr_t>(xs.data()) + 255) / 256 * 256) + offset;
    E* y = reinterpret_cast<E*>((reinterpret_cast<std::uintptr_t>(ys.data()) + 255) / 256 * 256) + offset;
    std::FILE* in = std::fopen(ARGV[1], "rb");
    if (!in || std::fread(x, sizeof(E), n, in) != n) return 3;
    std::fclose(in);
    std::memset(y, 0xff, n * sizeof(E));  // poison
    const unsigned grid = (unsigned)(((rows + tile - 1) / tile) * ((cols + tile - 1) / tile));
    blockDim.x = threads, gridDim.x = grid, gridDim.y = 1;
    for (blockIdx.x = 0; blockIdx.x < grid; ++blockIdx.x)
        if (!run_fibered_block(threads, [&] { kernel(x, y, rows, cols); })) return 5;
    return write_output(y, n);
}
"""


def variants() -> list[tuple[str, dict, str, str]]:
    """(dtype, params, kernel name, source): CONFIGS, then BROKEN's copies of the first."""
    found = []
    for dtype, params in CONFIGS:
        config = TRANSPOSE.space.check(params)
        found.append((dtype, params, TRANSPOSE.kernel_name(dtype, config), render(TRANSPOSE, dtype, config)))
    dtype, params = CONFIGS[0]
    return found + [(dtype, params, name, source) for name, source in with_flaws(TRANSPOSE, dtype, params, BROKEN)]


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    kernels, cases = [], []
    for index, (dtype, params, name, source) in enumerate(variants()):
        kernels.append(source)
        elem = "float" if dtype == "float32" else "unsigned short"
        threads = params["tile"] ** 2 // params["elements_per_thread"]
        cases.append(f"    case {index}: return run<{elem}>({name}, {params['tile']}, {threads});")
    return build(tmp_path_factory.mktemp("transpose_emulated"), kernels, DRIVER, cases)


def cases(variant: int, dtype: str):
    """Every shape of SHAPES, aligned and one element off: (stdin spec, x, numpy's transpose)."""
    rng = np.random.default_rng(variant)
    for rows, cols in SHAPES:
        for offset in (0, 1):
            x = finite_bits(rng, rows * cols, dtype).reshape(rows, cols)
            yield f"{variant} {rows} {cols} {offset}", x, np.ascontiguousarray(x.T)


@pytest.mark.parametrize("variant", range(len(CONFIGS)))
def test_every_tile_of_the_launch_transposes_exactly(emulator, tmp_path, variant):
    dtype, params = CONFIGS[variant]
    wrong = mismatches(emulator, tmp_path, cases(variant, dtype))
    assert not wrong, f"{TRANSPOSE.kernel_name(dtype, TRANSPOSE.space.check(params))}: {wrong[:3]}"


@pytest.mark.parametrize("flaw", list(BROKEN))
def test_a_broken_pairs_layout_fails_the_emulation(emulator, tmp_path, flaw):
    assert mismatches(emulator, tmp_path, cases(len(CONFIGS) + list(BROKEN).index(flaw), CONFIGS[0][0]), first_only=True)
