"""Kernel Tuner's tiled matrix-multiply example, ported: the same tunable parameters (block
sizes, tile sizes), grid divisors and restriction, with `kernel_tuner.tune_kernel` replaced by
`autogen.tune_kernel`. The kernel's WIDTH is 4096 as in Kernel Tuner's example; a -DWIDTH=N
compiler option (given to NVRTC, as Kernel Tuner gives it) tunes another size."""

from pathlib import Path

import numpy as np

import autogen

SOURCE = Path(__file__).with_name("matmul.cu")
NAME = "kt_examples.matmul"
WIDTH = 4096
TUNE_PARAMS = {"block_size_x": [16 * 2**i for i in range(3)], "block_size_y": [2**i for i in range(6)],
               "tile_size_x": [2**i for i in range(4)], "tile_size_y": [2**i for i in range(4)]}
GRID_DIV_X = ["block_size_x", "tile_size_x"]
GRID_DIV_Y = ["block_size_y", "tile_size_y"]
RESTRICTIONS = ["block_size_x==block_size_y*tile_size_y"]
# Each output sums WIDTH products in float32: its distance from the float64 answer grows with
# WIDTH, past the default atol of 1e-6 for outputs near zero.
ATOL = 1e-3


def arguments(width: int = WIDTH, seed: int = 0):
    """(arguments, answer): A and B random, C to be written, the answer in float64."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((width, width), dtype=np.float32)
    b = rng.standard_normal((width, width), dtype=np.float32)
    c = np.zeros_like(a)
    return [c, a, b], [(a.astype(np.float64) @ b.astype(np.float64)), None, None]


def tune(width: int = WIDTH, **options):
    args, answer = arguments(width)
    return autogen.tune_kernel("matmul_kernel", SOURCE, (width, width), args, TUNE_PARAMS, grid_div_x=GRID_DIV_X,
                               grid_div_y=GRID_DIV_Y, restrictions=RESTRICTIONS, answer=answer, atol=ATOL, name=NAME,
                               compiler_options=[f"-DWIDTH={width}"] if width != WIDTH else None, **options)


FAMILY = autogen.kernel_family("matmul_kernel", SOURCE, (WIDTH, WIDTH), "out:float32[size_y,size_x] "
                               "float32[size_y,size_x] float32[size_y,size_x]", TUNE_PARAMS, grid_div_x=GRID_DIV_X,
                               grid_div_y=GRID_DIV_Y, restrictions=RESTRICTIONS, name=NAME)
