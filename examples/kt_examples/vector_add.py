"""Kernel Tuner's vector_add example, ported: the same kernel semantics, tune_params and call,
with `kernel_tuner.tune_kernel` replaced by `autogen.tune_kernel`. Importing this module defines
the family (kt_examples.vector_add), so `PYTHONPATH=examples autogen show kt_examples.vector_add
--size-x N` and autogen.lookup serve what tune() stored."""

from pathlib import Path

import numpy as np

import autogen

SOURCE = Path(__file__).with_name("vector_add.cu")
NAME = "kt_examples.vector_add"
SIZE = 10_000_000
TUNE_PARAMS = {"block_size_x": [32, 64, 128, 256, 512, 1024]}


def arguments(size: int = SIZE, seed: int = 0):
    """(arguments, answer) as Kernel Tuner's script makes them."""
    rng = np.random.default_rng(seed)
    a = rng.random(size, dtype=np.float32)
    b = rng.random(size, dtype=np.float32)
    c = np.zeros_like(b)
    return [c, a, b, np.int32(size)], [a + b, None, None, None]


def tune(size: int = SIZE, **options):
    args, answer = arguments(size)
    return autogen.tune_kernel("vector_add", SOURCE, size, args, TUNE_PARAMS, answer=answer, name=NAME, **options)


# The family's definition, for a process that serves what was tuned (the argument types and the
# rule; the data are tune()'s).
FAMILY = autogen.kernel_family("vector_add", SOURCE, SIZE, "out:float32[size_x] float32[size_x] float32[size_x] "
                               "int32=size_x", TUNE_PARAMS, name=NAME)
