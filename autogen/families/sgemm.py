"""SGEMM: C = alpha * A B + beta * C, fp32, row-major A (m x k), B (k x n), C (m x n).
Template: templates/sgemm/kernel.cu.j2; its space, pruning, seeds and grid are GemmBase's
(autogen.families._gemm, shared with gemm_bias_act); the kernel, its parameters and the
measurements behind the pruning and the seeds: docs/families/sgemm.md.

The block tile, the thread tile and the warp layout are parameters; the number of warps follows
from them. Split-K (split_k > 1) is two steps: `_init` sets C = beta * C (or 0 without reading C
when beta is 0), then split_k blocks per tile add alpha times their partial tiles into C with
atomic adds. No workspace, so the exported launcher allocates none.
"""

from __future__ import annotations

import numpy as np

from autogen.core.family import Peer, Step
from autogen.core.operands import device_array, kernel_scalar, new_output, random_uniform
from autogen.core.problem import Config, Problem
from autogen.core.registry import register
from autogen.core.signature import OpSignature, Output, Scalar, Tensor
from autogen.errors import ArgumentError
from autogen.families._gemm import GemmBase
from autogen.gpu.peers import cublas_handle


@register
class Sgemm(GemmBase):
    name = "sgemm"
    api = "sgemm"
    dims = ("m", "n", "k")
    # Shapes with tails for the export's self-test (Family.tail_shapes).
    tail_shapes = ((1, 1, 1), (3, 5, 7), (17, 33, 9), (1, 300, 17), (300, 1, 17), (100, 37, 129),
                   (129, 65, 300), (257, 255, 33), (64, 64, 4100), (4, 4, 10000))
    outputs = ("C",)
    op_signature = OpSignature(
        (Tensor("A"), Tensor("B"), Scalar("alpha", "float", 1.0), Scalar("beta", "float", 0.0)),
        (Output("C", lambda A, B: (A.shape[0], B.shape[1]), "float32", read_when="beta"),))
    c_params = "const float* A, const float* B, float* C, int m, int n, int k, float alpha, float beta"
    tolerance = 1e-5  # of alpha |A| |B| + beta |C| (reference_magnitude): fp32 k-term sums' error grows with it
    description = "C = alpha * A B + beta * C, fp32, row-major A (m x k), B (k x n), C (m x n)"

    def plan(self, problem: Problem, config: Config) -> list[Step]:
        # The shape arguments are fixed per plan: built once, not on every dispatched call.
        m, n, k = (kernel_scalar(problem[d], np.int32) for d in ("m", "n", "k"))

        def args(inputs: dict) -> tuple:
            return (inputs["A"], inputs["B"], inputs["C"], m, n, k,
                    kernel_scalar(inputs["alpha"]), kernel_scalar(inputs["beta"]))

        main = Step("", self.launch(problem, config), args)
        if config["split_k"] == 1:
            return [main]
        init = Step("_init", self.init_launch(problem),
                    lambda inputs: (inputs["C"], m, n, kernel_scalar(inputs["beta"])))
        return [init, main]

    # --- data -----------------------------------------------------------------------------
    def validation_cases(self, problem: Problem) -> list[dict]:
        # beta = 0 with C poisoned (NaN): every element written and C never read. beta != 0: C honoured.
        return [{"alpha": 1.5, "beta": 0.0}, {"alpha": -0.75, "beta": 1.25}]

    def timing_case(self, problem: Problem) -> dict:
        return {"alpha": 1.0, "beta": 0.0}

    def make_inputs(self, problem: Problem, xp, rng, case: dict) -> dict:
        m, n, k = problem["m"], problem["n"], problem["k"]
        A = random_uniform(xp, rng, (m, k), xp.float32)
        B = random_uniform(xp, rng, (k, n), xp.float32)
        if case["beta"] == 0.0:
            C = xp.full((m, n), xp.nan, dtype=xp.float32)
        else:
            C = random_uniform(xp, rng, (m, n), xp.float32)
        return {"A": A, "B": B, "C": C, "alpha": case["alpha"], "beta": case["beta"]}

    def reference(self, problem: Problem, inputs: dict, xp=np):
        result = inputs["alpha"] * (inputs["A"].astype(xp.float64) @ inputs["B"].astype(xp.float64))
        if inputs["beta"] != 0.0:
            result += inputs["beta"] * inputs["C"].astype(xp.float64)
        return result

    def reference_magnitude(self, problem: Problem, inputs: dict, xp=np):
        A, B = xp.abs(inputs["A"].astype(xp.float64)), xp.abs(inputs["B"].astype(xp.float64))
        result = abs(inputs["alpha"]) * (A @ B)
        if inputs["beta"] != 0.0:
            result += abs(inputs["beta"]) * xp.abs(inputs["C"].astype(xp.float64))
        return result

    def bytes_moved(self, problem: Problem, case: dict | None = None) -> int:
        m, n, k = problem["m"], problem["n"], problem["k"]
        reads_c = case is not None and case.get("beta", 0.0) != 0.0
        return 4 * (m * k + k * n + m * n + (m * n if reads_c else 0))

    def flops(self, problem: Problem) -> int:
        return 2 * problem["m"] * problem["n"] * problem["k"]

    def peer(self, problem: Problem) -> Peer | None:
        handle = cublas_handle()
        if handle is None:
            return None
        import cupy
        m, n, k = problem["m"], problem["n"], problem["k"]

        def run(inputs: dict) -> None:
            handle.sgemm_row_major(cupy.cuda.get_current_stream().ptr, m, n, k, inputs["alpha"],
                                   inputs["A"].data.ptr, inputs["B"].data.ptr, inputs["beta"], inputs["C"].data.ptr)

        return Peer("cuBLAS sgemm (TF32 off)", run)

    # --- calls from Python ----------------------------------------------------------------
    def example_call(self, problem: Problem, cupy):
        rng = cupy.random.default_rng(0)
        m, n, k = problem["m"], problem["n"], problem["k"]
        A = rng.random((m, k), dtype=cupy.float32) - 0.5
        B = rng.random((k, n), dtype=cupy.float32) - 0.5
        return (A, B), {"C": cupy.empty((m, n), dtype=cupy.float32)}

    def bind(self, cupy, device: int, args: tuple, kwargs: dict):
        """autogen.sgemm(A, B, alpha=1.0, beta=0.0, C=None) -> C"""
        A, B, alpha, beta, C = _sgemm_arguments(*args, **kwargs)
        a = device_array(cupy, A, "A", self.dtypes, 2, device)
        m, k = a.shape
        b = device_array(cupy, B, "B", self.dtypes, 2, device)
        if b.shape[0] != k:
            raise ArgumentError(f"B has {b.shape[0]} rows, but A has {k} columns")
        n = b.shape[1]
        if C is None:
            if beta != 0.0:
                raise ArgumentError("beta != 0 needs C: it scales the C that is given")
            C = new_output(cupy, A, (m, n), "float32")
        c = device_array(cupy, C, "C", self.dtypes, 2, device)
        if c.shape != (m, n):
            raise ArgumentError(f"C has shape {tuple(c.shape)}, but A B is {m} x {n}")
        inputs = {"A": a, "B": b, "C": c, "alpha": float(alpha), "beta": float(beta)}
        return self.problem_cached("float32", (("m", m), ("n", n), ("k", k))), inputs, C


def _sgemm_arguments(A, B, alpha=1.0, beta=0.0, C=None):
    return A, B, alpha, beta, C
