"""TEST AID: a family whose space holds a correct, a faulting and a hanging variant.

Imported by the GPU worker through WorkSpec.family_module, so the child registers it too.
"""

from __future__ import annotations

import numpy as np

from autogen.families import Family, Launch, register
from autogen.families.base import random_uniform
from autogen.space import Param, Space

TEMPLATE = """
extern "C" __global__ void {{ kernel_name }}(const float* x, float* y, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
{% if behaviour == "fault" %}
    // Write far outside any allocation: an illegal address poisons the CUDA context.
    if (i == 0) ((float*)0x10)[threadIdx.x] = 1.0f;
{% elif behaviour == "hang" %}
    // Never finish (clock64 is volatile, so the loop cannot be optimised away): the tuner must
    // give up on it after its deadline.
    const long long start = clock64();
    while (clock64() - start >= 0) { }
{% endif %}
    if (i < n) y[i] = 2.0f * x[i];
}
"""


class FaultyDouble(Family):
    name = "faulty_double"
    template = ""
    template_source = TEMPLATE
    dims = ("n",)
    dtypes = ("float32",)
    space = Space((Param("behaviour", ("fault", "hang", "ok"), "b"),))
    default_params = {"behaviour": "ok"}
    output = "y"
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


register(FaultyDouble())
