"""TEST AID: a family whose space holds a correct, a faulting and a hanging variant.

A user family like any other (registered as fault_family.faulty_double, template beside this
module): the GPU worker re-imports this module by its path, so the child registers it too.
"""

from __future__ import annotations

import numpy as np

from autogen import Param, Space
from autogen.family import Family, Launch, random_uniform, register


@register
class FaultyDouble(Family):
    name = "faulty_double"
    template = "faulty_double.cu.j2"
    dims = ("n",)
    dtypes = ("float32",)
    space = Space((Param("behaviour", ("fault", "hang", "ok"), "b"),))
    default_params = {"behaviour": "ok"}
    outputs = ("y",)
    c_params = "const float* x, float* y, int n"

    def launch(self, problem, config):
        return Launch(grid=(-(-problem["n"] // 256), 1, 1), block=(256, 1, 1))

    def make_inputs(self, problem, xp, rng, case):
        y = xp.full(problem["n"], xp.nan, dtype=xp.float32)
        return {"x": random_uniform(xp, rng, (problem["n"],), xp.float32), "y": y}

    def kernel_args(self, problem, inputs):
        return (inputs["x"], inputs["y"], np.int32(problem["n"]))

    def reference(self, problem, inputs, xp=np):
        return 2.0 * inputs["x"].astype(xp.float64)

    def bytes_moved(self, problem, case=None):
        return 8 * problem["n"]

