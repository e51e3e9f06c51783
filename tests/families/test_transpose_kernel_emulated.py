"""transpose's kernels run on the CPU (tests/support/emulated_cuda.py): the rendered CUDA source
built as host C++, every block of the family's launch run with its threads as fibers that meet at
the barrier, x and y placed as the GPU tests place them (256-byte aligned, or one element past, so
the vector paths and their single-element fallbacks both run), and y compared with numpy's
transpose bit for bit. It checks the staged layouts' index arithmetic (the two-row words of
layout=pairs above all) and the edge tiles on odd shapes without a GPU."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
from emulated_cuda import build

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
    ("float16", {"tile": 32, "vector_width": 8, "elements_per_thread": 16, "layout": "pairs", "raster": "groups"}),
    ("bfloat16", {"tile": 32, "vector_width": 2, "elements_per_thread": 8, "layout": "pad", "raster": "groups"}),
    ("float16", {"tile": 64, "vector_width": 8, "elements_per_thread": 32, "layout": "swizzle"}),
    ("float32", {"tile": 32, "vector_width": 4, "elements_per_thread": 8, "layout": "plain"}),
    ("float32", {"tile": 64, "vector_width": 4, "elements_per_thread": 16, "layout": "pairs"}),
    ("float32", {"tile": 32, "vector_width": 2, "elements_per_thread": 4, "layout": "pairs"}),
    ("float32", {"tile": 64, "vector_width": 1, "elements_per_thread": 8, "layout": "pad"}),
]
# Deliberately broken forms of the first config (a renamed copy of its source, one edit): the
# emulation must catch each, or it proves nothing.
BROKEN = {
    "halves": ("Pair{held[2 * p][v], held[2 * p + 1][v]}", "Pair{held[2 * p + 1][v], held[2 * p][v]}"),
    "words": ("staged_word(band + j * ROW_STEP, col / 2)", "staged_word(band + j * ROW_STEP, col)"),
    "barrier": ("    __syncthreads();\n", "\n"),
}
# rows x cols: single rows and columns, sizes off every tile and pack, a tall and a wide one
# (the emulation runs every variant on every shape, pruned or not: the kernel must be exact anyway).
SHAPES = [(1, 1), (1, 37), (37, 1), (3, 5), (33, 65), (66, 130), (130, 66), (64, 64), (7, 200), (257, 131), (300, 97)]

DRIVER = r"""
// stdin: variant rows cols offset; x's values from argv[1], y written to argv[2]. One block per
// tile of the family's launch, each block's threads as fibers.
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
    std::FILE* result = std::fopen(ARGV[2], "wb");
    std::fwrite(y, sizeof(E), n, result);
    std::fclose(result);
    return 0;
}

int main(int, char** argv)
{
    ARGV = argv;
    int variant = -1;
    if (std::scanf("%d", &variant) != 1) return 2;
    switch (variant) {
CASES
    }
    return 2;
}
"""


def variants() -> list[tuple[str, dict, str, str]]:
    """(dtype, params, kernel name, source): CONFIGS, then BROKEN's copies of the first."""
    found = []
    for dtype, params in CONFIGS:
        config = TRANSPOSE.space.check(params)
        found.append((dtype, params, TRANSPOSE.kernel_name(dtype, config), render(TRANSPOSE, dtype, config)))
    dtype, params, name, source = found[0]
    for flaw, (old, new) in BROKEN.items():
        assert source.count(old) == 1, f"{flaw}: {old!r} is not once in {name}"
        found.append((dtype, params, f"{name}_{flaw}", source.replace(old, new).replace(name, f"{name}_{flaw}")))
    return found


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    kernels, cases = [], []
    for index, (dtype, params, name, source) in enumerate(variants()):
        kernels.append(source)
        elem = "float" if dtype == "float32" else "unsigned short"
        threads = params["tile"] ** 2 // params["elements_per_thread"]
        cases.append(f"    case {index}: return run<{elem}>({name}, {params['tile']}, {threads});")
    driver = DRIVER.replace("CASES", "\n".join(cases))
    return build(tmp_path_factory.mktemp("transpose_emulated"), "static char** ARGV;\n" + "\n".join(kernels) + driver)


def mismatches(emulator, tmp_path, variant: int, dtype: str, first_only: bool = False) -> list[str]:
    """Every shape of SHAPES, aligned and one element off: what differs from numpy's transpose."""
    storage = np.uint32 if dtype == "float32" else np.uint16
    rng = np.random.default_rng(variant)
    wrong_cases = []
    for rows, cols in SHAPES:
        for offset in (0, 1):
            # Random bits with the exponent's top bit clear: finite, never the poison.
            x = rng.integers(0, np.iinfo(storage).max, (rows, cols), dtype=np.uint64).astype(storage)
            x &= storage(0xbfffffff if dtype == "float32" else 0xbfff)
            (tmp_path / "in.bin").write_bytes(x.tobytes())
            spec = f"{variant} {rows} {cols} {offset}"
            done = subprocess.run([str(emulator), str(tmp_path / "in.bin"), str(tmp_path / "out.bin")],
                                  input=spec, capture_output=True, text=True, timeout=60)
            if done.returncode != 0:
                wrong_cases.append(f"{spec}: exit {done.returncode} {done.stderr.strip()}")
            else:
                got = np.frombuffer((tmp_path / "out.bin").read_bytes(), dtype=storage).reshape(cols, rows)
                wrong = np.flatnonzero(got != x.T)
                if wrong.size:
                    wrong_cases.append(f"{spec}: {wrong.size} wrong, first {wrong[:5]}")
            if wrong_cases and first_only:
                return wrong_cases
    return wrong_cases


@pytest.mark.parametrize("variant", range(len(CONFIGS)))
def test_every_tile_of_the_launch_transposes_exactly(emulator, tmp_path, variant):
    dtype, params = CONFIGS[variant]
    wrong = mismatches(emulator, tmp_path, variant, dtype)
    assert not wrong, f"{TRANSPOSE.kernel_name(dtype, TRANSPOSE.space.check(params))}: {wrong[:3]}"


@pytest.mark.parametrize("flaw", list(BROKEN))
def test_a_broken_pairs_layout_fails_the_emulation(emulator, tmp_path, flaw):
    assert mismatches(emulator, tmp_path, len(CONFIGS) + list(BROKEN).index(flaw), CONFIGS[0][0], first_only=True)
