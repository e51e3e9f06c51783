"""out = alpha * x + y, fp32, any length: a kernel family of your own, tuned by autogen.

This module and axpy.cu.j2 beside it are the whole family. @autogen.register makes it known as
`mykernels.axpy` (its package, then its name) to `autogen tune`, `list`, `show`, `bench`,
`export`, autogen.lookup and autogen.call; the tuner's GPU worker re-imports this module.
"""

from __future__ import annotations

import numpy as np

import autogen
from autogen.errors import ArgumentError
from autogen.family import device_array, new_output, random_uniform
from autogen.family import OpSignature, Output, Scalar, Tensor


@autogen.register
class Axpy(autogen.Family):
    name = "axpy"
    template = "axpy.cu.j2"  # beside this module
    selftest_template = "axpy_selftest.cu.j2"  # the C++ hook of `autogen export --self-test`
    description = "out = alpha * x + y, fp32, any length"
    dims = ("n",)
    dtypes = ("float32",)
    space = autogen.Space(params=(
        autogen.Param("vector_width", (1, 2, 4), "vw", "floats per access (4: 16-byte loads and stores)"),
        autogen.Param("block_size", (128, 256, 512), "bs", "threads per block"),
        autogen.Param("items_per_thread", (1, 2, 4), "ipt", "vectors each thread handles, loads issued together"),
    ))
    default_params = {"vector_width": 4, "block_size": 256, "items_per_thread": 2}
    outputs = ("out",)
    # Its torch op, torch.ops.autogen.mykernels_axpy(x, y, alpha) (import autogen.torch.ops)
    op_signature = OpSignature((Tensor("x"), Tensor("y"), Scalar("alpha", "float", 1.0)),
                               (Output("out", lambda x: tuple(x.shape), "float32"),))
    c_params = "const float* x, const float* y, float* out, int n, float alpha"

    def launch(self, problem, config):
        per_block = config["block_size"] * config["vector_width"] * config["items_per_thread"]
        return autogen.Launch(grid=(-(-problem["n"] // per_block), 1, 1), block=(config["block_size"], 1, 1))

    def validation_cases(self, problem):
        return [{"alpha": 1.5}, {"alpha": -0.25}]

    def make_inputs(self, problem, xp, rng, case):
        n = problem["n"]
        return {"x": random_uniform(xp, rng, (n,), xp.float32), "y": random_uniform(xp, rng, (n,), xp.float32),
                "out": xp.full((n,), xp.nan, dtype=xp.float32), "alpha": case["alpha"]}

    def kernel_args(self, problem, inputs):
        return (inputs["x"], inputs["y"], inputs["out"], np.int32(problem["n"]), np.float32(inputs["alpha"]))

    def reference(self, problem, inputs, xp=np):
        return inputs["alpha"] * inputs["x"].astype(xp.float64) + inputs["y"].astype(xp.float64)

    def bytes_moved(self, problem, case=None):
        return 12 * problem["n"]  # read x and y, write out

    def peer(self, problem):
        """CuPy's elementwise kernels, out= so nothing is allocated inside the timing graph."""
        import cupy

        def run(inputs):
            cupy.multiply(inputs["x"], np.float32(inputs["alpha"]), out=inputs["out"])
            cupy.add(inputs["out"], inputs["y"], out=inputs["out"])

        return autogen.Peer("cupy multiply + add", run)

    def bind(self, cupy, device, args, kwargs):
        """autogen.call("mykernels.axpy", x, y, alpha=1.0, out=None) -> out"""
        x, y, alpha, out = _arguments(*args, **kwargs)
        xv = device_array(cupy, x, "x", self.dtypes, 1, device)
        yv = device_array(cupy, y, "y", self.dtypes, 1, device)
        if yv.shape != xv.shape:
            raise ArgumentError(f"y has length {yv.shape[0]}, x has {xv.shape[0]}")
        out = new_output(cupy, x, xv.shape, "float32") if out is None else out
        outv = device_array(cupy, out, "out", self.dtypes, 1, device)
        if outv.shape != xv.shape:
            raise ArgumentError(f"out has length {outv.shape[0]}, x has {xv.shape[0]}")
        problem = self.problem(n=xv.shape[0])
        return problem, {"x": xv, "y": yv, "out": outv, "alpha": alpha}, out


def _arguments(x, y, alpha=1.0, out=None):
    return x, y, alpha, out
