"""SGEMV: y = alpha * A x + beta * y (autogen.families._gemv), fp32, A row-major m x n.
Template: templates/sgemv/kernel.cu.j2."""

from __future__ import annotations

import functools

import numpy as np

from autogen.core.family import Launch, Peer, Step
from autogen.core.operands import device_array, kernel_scalar, new_output, random_uniform
from autogen.core.problem import Config, Problem
from autogen.core.registry import register
from autogen.core.signature import OpSignature, Output, Scalar, Tensor
from autogen.core.space import Param, Space
from autogen.errors import ArgumentError
from autogen.families._gemv import (gemv_arguments, GemvFamily, overshoot_reason, reduce_only_across_warps,
                                    row_fits_block)
from autogen.gpu.peers import cublas_handle

_F32 = np.dtype(np.float32)


SPACE = Space(
    params=(
        Param("threads_per_row", (1, 2, 4, 8, 16, 32, 64, 128, 256), "tpr",
              "threads cooperating on one row: <32 packs several rows in a warp, >32 spans warps"),
        Param("vector_width", (1, 2, 4), "vw", "floats per load (4: 16-byte float4 loads)"),
        Param("warps_per_block", (1, 2, 4, 8), "wpb", "block size in warps"),
        Param("rows_per_group", (1, 2), "rpg", "rows each thread group computes, sharing x loads"),
        Param("unroll", (1, 2, 4), "u", "column-loop unroll: loads in flight per thread"),
        Param("x_path", ("ldg", "smem"), "x", "x through the read-only cache or staged in shared memory"),
        Param("reduce", ("shfl", "smem"), "r", "cross-warp reduction: shuffles or a shared-memory tree"),
    ),
    constraints=(row_fits_block, reduce_only_across_warps),
)


@register
class Sgemv(GemvFamily):
    name = "sgemv"
    api = "sgemv"
    reuse_bound_calls = True  # bind only checks and arranges (autogen.runtime.bound_calls)
    # The template's `pdl` variable (render(..., pdl=True)): griddepcontrol.wait after the
    # weights' prefetch, for chains of small kernels launched with programmatic stream
    # serialization (autogen.gpu.launch). Not a searched parameter: one kernel timed alone
    # cannot show what it gains.
    pdl_capable = True
    dims = ("m", "n")
    # Shapes with tails for the export's self-test (Family.tail_shapes).
    tail_shapes = ((1, 1), (1, 3), (3, 1), (3, 3), (1, 4099), (3, 70), (1000, 37), (37, 1000), (4099, 70), (16384, 16),
                   (513, 257))
    dtypes = ("float32",)
    space = SPACE
    default_params = {"threads_per_row": 32, "vector_width": 4, "warps_per_block": 4,
                      "rows_per_group": 1, "unroll": 2, "x_path": "ldg", "reduce": "shfl"}
    op_signature = OpSignature(
        (Tensor("A"), Tensor("x"), Scalar("alpha", "float", 1.0), Scalar("beta", "float", 0.0)),
        (Output("y", lambda A: (A.shape[0],), "float32", read_when="beta"),))
    c_params = "const float* A, const float* x, float* y, int m, int n, float alpha, float beta"
    tolerance = 1e-5
    description = "y = alpha * A x + beta * y, fp32, A row-major m x n"

    def launch(self, problem: Problem, config: Config) -> Launch:
        rows = self.rows_per_block(config)
        return Launch(grid=(-(-problem["m"] // rows), 1, 1), block=(32 * config["warps_per_block"], 1, 1))

    def reject_reason(self, problem: Problem, config: Config) -> str | None:
        return overshoot_reason(problem["n"], config["threads_per_row"], config["vector_width"],
                                config["unroll"], "vector_width")

    def validation_cases(self, problem: Problem) -> list[dict]:
        # beta = 0 with y poisoned: every row written and y never read. beta != 0: y honoured.
        return [{"alpha": 1.5, "beta": 0.0}, {"alpha": -0.75, "beta": 1.25}]

    def timing_case(self, problem: Problem) -> dict:
        return {"alpha": 1.0, "beta": 0.0}

    def make_inputs(self, problem: Problem, xp, rng, case: dict) -> dict:
        m, n = problem["m"], problem["n"]
        y = random_uniform(xp, rng, (m,), xp.float32)
        if case["beta"] == 0.0:
            y[...] = xp.nan
        return {"A": random_uniform(xp, rng, (m, n), xp.float32),
                "x": random_uniform(xp, rng, (n,), xp.float32),
                "y": y, "alpha": case["alpha"], "beta": case["beta"]}

    def plan(self, problem: Problem, config: Config) -> list[Step]:
        # The shape arguments are fixed per plan, and alpha and beta converted once per value
        # (kernel_scalar): a dispatched call converts nothing on the hot path.
        m, n = kernel_scalar(problem["m"], np.int32), kernel_scalar(problem["n"], np.int32)
        one, zero = kernel_scalar(1.0), kernel_scalar(0.0)

        def args(inputs: dict) -> tuple:
            alpha, beta = inputs["alpha"], inputs["beta"]
            return (inputs["A"], inputs["x"], inputs["y"], m, n,
                    one if alpha == 1.0 else kernel_scalar(alpha), zero if beta == 0.0 else kernel_scalar(beta))

        return [Step("", self.launch(problem, config), args)]

    def reference_magnitude(self, problem: Problem, inputs: dict, xp=np):
        # The error's scale, not the reference: |A| @ |x| in float32 (relative error about
        # n * 2^-24) is exact enough for it and spares converting A to float64 a second time,
        # which took half of each variant's check on the host.
        result = abs(inputs["alpha"]) * (xp.abs(inputs["A"]) @ xp.abs(inputs["x"])).astype(xp.float64)
        if inputs["beta"] != 0.0:
            result += abs(inputs["beta"]) * xp.abs(inputs["y"].astype(xp.float64))
        return result

    def peer(self, problem: Problem) -> Peer | None:
        handle = cublas_handle()
        if handle is None:
            return None
        import cupy
        m, n = problem["m"], problem["n"]

        def run(inputs: dict) -> None:
            handle.sgemv_row_major(cupy.cuda.get_current_stream().ptr, m, n, inputs["alpha"],
                                   inputs["A"].data.ptr, inputs["x"].data.ptr, inputs["beta"],
                                   inputs["y"].data.ptr)

        return Peer("cuBLAS sgemv", run)

    def bind(self, cupy, device: int, args: tuple, kwargs: dict):
        """autogen.sgemv(A, x, alpha=1.0, beta=0.0, y=None) -> y"""
        A, x, alpha, beta, y = gemv_arguments(*args, **kwargs)
        ndarray = cupy.ndarray
        if type(A) is ndarray and type(x) is ndarray and (y is None or type(y) is ndarray):
            # CuPy operands: device_array's checks (dtype, rank, layout, device, shape) inline;
            # anything off goes the long way below, which names the argument at fault.
            if (A.dtype is _F32 and x.dtype is _F32 and A.ndim == 2 and x.ndim == 1 and A._c_contiguous
                    and x._c_contiguous and A.data.device_id == device and x.data.device_id == device):
                m, n = A.shape
                if x.shape[0] == n and (y is not None or beta == 0.0):
                    if y is None:
                        y = new_output(cupy, A, (m,), "float32", "y")
                    if (y.dtype is _F32 and y.ndim == 1 and y.shape[0] == m and y._c_contiguous
                            and y.data.device_id == device):
                        return self._problem_of(m, n), {"A": A, "x": x, "y": y, "alpha": alpha, "beta": beta}, y
        a = device_array(cupy, A, "A", self.dtypes, 2, device)
        m, n = a.shape
        xv = device_array(cupy, x, "x", self.dtypes, 1, device)
        if xv.shape[0] != n:
            raise ArgumentError(f"x has length {xv.shape[0]}, but A has {n} columns")
        if y is None:
            if beta != 0.0:
                raise ArgumentError("beta != 0 needs y: it scales the y that is given")
            y = new_output(cupy, A, (m,), "float32", "y")
        yv = device_array(cupy, y, "y", self.dtypes, 1, device)
        if yv.shape[0] != m:
            raise ArgumentError(f"y has length {yv.shape[0]}, but A has {m} rows")
        inputs = {"A": a, "x": xv, "y": yv, "alpha": alpha, "beta": beta}
        return self._problem_of(m, n), inputs, y

    @functools.lru_cache(maxsize=1024)
    def _problem_of(self, m: int, n: int) -> Problem:
        # Cached: the hot path of a dispatched call should not re-validate the same shape.
        return self.problem("float32", m=m, n=n)
