"""gemm_bias_act: C[b] = act(A[b] B[b] + bias), fp32, batched; act none, relu or gelu (erf form).
Row-major contiguous A (batch x m x k), B (batch x k x n), C (batch x m x n), bias (n). Batch 1 is
the MatmulAndBiasAndRelu of a linear layer, batch > 1 a batched matmul with the same epilogue.

sgemm's kernel with its tiles, pipelines and search space (a subclass of GemmBase, shared with
sgemm in autogen.families._gemm, and a template that extends sgemm's through its hooks:
templates/gemm_bias_act/kernel.cu.j2): the batch is
grid.z, the bias and the activation are applied to the accumulators in registers before sgemm's
store. split_k is 1: an activation of partial sums would not be the activation of their sum.
The activation is a trait (part of the database key and of the kernel's name; the CLI takes
--act). Docs: docs/families/gemm_bias_act.md.
"""

from __future__ import annotations

import numpy as np

from autogen.core.family import Launch, Peer, Step, Trait
from autogen.core.operands import device_array, kernel_scalar, new_output, random_uniform
from autogen.core.problem import Config, Problem
from autogen.core.registry import register
from autogen.core.signature import OpSignature, Output, Scalar, Tensor
from autogen.core.space import Space
from autogen.errors import ArgumentError, UsageError
from autogen.families._elementwise import erf64
from autogen.families._gemm import _warp_tiles_fit, GemmBase, geometry, SMALL_TILE, SPACE as GEMM_SPACE
from autogen.gpu.device import sm_count
from autogen.gpu.peers import cublas_handle

ACTIVATIONS = ("relu", "gelu", "none")  # the first is the default (CLI and Python call)
MAX_BATCH = 65535  # grid.z


# The epilogue (bias, activation, batch strides) keeps registers live past sgemm's estimate: of
# 100 sampled points compiled with nvcc 13.0 for sm_90, the one estimated at 196 registers (a
# 32-thread block of 8x8 thread tiles) reached ptxas' 255 and spilled 64 bytes; sgemm's twin does not.
EPILOGUE_REGISTER_LIMIT = 190


def _epilogue_registers_fit(p) -> str | None:
    if _warp_tiles_fit(p):
        return None  # reported by sgemm's own constraint; the geometry is undefined
    estimate = geometry(p)["registers"]
    if estimate > EPILOGUE_REGISTER_LIMIT:
        return f"about {estimate} registers per thread before the epilogue's (over {EPILOGUE_REGISTER_LIMIT}: it would spill)"
    return None


def _without_split_k(space: Space) -> Space:
    """sgemm's space with split_k fixed at 1, its constraints and the epilogue's register limit."""
    params = tuple(p if p.name != "split_k" else type(p)(p.name, (1,), p.abbrev, p.help) for p in space.params)
    return Space(params=params, constraints=space.constraints + (_epilogue_registers_fit,))


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@register
class GemmBiasAct(GemmBase):
    name = "gemm_bias_act"
    template = "gemm_bias_act/kernel.cu.j2"
    api = "gemm_bias_act"
    dims = ("batch", "m", "n", "k")
    example_dims = {"batch": 3, "m": 130, "n": 257, "k": 67}  # with tails; 1000 each would be 4 GB an operand
    dim_defaults = {"batch": 1}
    traits = (Trait("act", ACTIVATIONS, "activation of the epilogue: relu, gelu (the erf form, as "
                    "torch.nn.functional.gelu's default) or none (bias only)", code=True),)
    tail_shapes = ((1, 1, 1, 1), (2, 3, 5, 7), (3, 17, 33, 9), (1, 100, 37, 129), (2, 129, 65, 300),
                   (5, 1, 300, 17), (4, 257, 255, 33), (1, 64, 64, 4100))
    space = _without_split_k(GEMM_SPACE)
    outputs = ("C",)
    op_signature = OpSignature(
        (Tensor("A"), Tensor("B"), Tensor("bias"), Scalar("act", "str", ACTIVATIONS[0])),
        (Output("out", lambda A, B: (*A.shape[:-1], B.shape[-1]), "float32"),))
    c_params = "const float* A, const float* B, const float* bias, float* C, int batch, int m, int n, int k"
    tolerance = 1e-5  # of |A| |B| + |bias| (reference_magnitude), as sgemm's; relu and gelu keep it
    description = ("C[b] = act(A[b] B[b] + bias), act relu, gelu (erf) or none, fp32, batched row-major A (b x m x k), "
                   "B (b x k x n), bias (n)")

    # --- geometry -------------------------------------------------------------------------
    def tiles(self, problem: Problem, config: Config) -> int:
        """Blocks of the grid: the tiles of one C times the batch (what fills the GPU)."""
        return problem["batch"] * self.matrix_tiles(problem, config)

    def matrix_tiles(self, problem: Problem, config: Config) -> int:
        return _ceil(problem["m"], config["block_m"]) * _ceil(problem["n"], config["block_n"])

    def check_problem(self, problem: Problem) -> None:
        super().check_problem(problem)
        if problem["batch"] > MAX_BATCH:
            raise UsageError(f"gemm_bias_act: batch={problem['batch']} is over {MAX_BATCH} (one grid.z per entry)")

    def launch(self, problem: Problem, config: Config) -> Launch:
        return Launch(grid=(self.matrix_tiles(problem, config), 1, problem["batch"]),
                      block=(geometry(config)["threads"], 1, 1))

    def plan(self, problem: Problem, config: Config) -> list[Step]:
        m, n, k = (problem[d] for d in ("m", "n", "k"))
        sizes = tuple(kernel_scalar(v, np.int32) for v in (m, n, k))
        strides = tuple(kernel_scalar(v, np.int64) for v in (m * k, k * n, m * n))

        def args(inputs: dict) -> tuple:
            return (inputs["A"], inputs["B"], inputs["bias"], inputs["C"], *sizes, *strides)

        return [Step("", self.launch(problem, config), args)]

    def reject_reason(self, problem: Problem, config: Config) -> str | None:
        reason = super().reject_reason(problem, config)
        if reason is None and config["block_m"] * config["block_n"] < SMALL_TILE:
            full = problem["batch"] * _ceil(problem["m"], 128) * _ceil(problem["n"], 128)
            if full >= 4 * sm_count():
                return (f"block tile {config['block_m']}x{config['block_n']} is small: 128x128 tiles of the "
                        "batch fill 4 waves")
        return reason

    # --- data -----------------------------------------------------------------------------
    def validation_cases(self, problem: Problem) -> list[dict]:
        return [{}]  # C poisoned with NaN: every element written, none read

    def timing_case(self, problem: Problem) -> dict:
        return {}

    def make_inputs(self, problem: Problem, xp, rng, case: dict) -> dict:
        b, m, n, k = (problem[d] for d in self.dims)
        return {"A": random_uniform(xp, rng, (b, m, k), xp.float32),
                "B": random_uniform(xp, rng, (b, k, n), xp.float32), "bias": random_uniform(xp, rng, (n,), xp.float32),
                "C": xp.full((b, m, n), xp.nan, dtype=xp.float32)}

    def reference(self, problem: Problem, inputs: dict, xp=np):
        x = xp.matmul(inputs["A"].astype(xp.float64), inputs["B"].astype(xp.float64))
        x += inputs["bias"].astype(xp.float64)
        act = problem["act"]
        if act == "relu":
            return xp.maximum(x, 0.0)
        return 0.5 * x * (1.0 + erf64(xp, x * (1.0 / np.sqrt(2.0)))) if act == "gelu" else x

    def reference_magnitude(self, problem: Problem, inputs: dict, xp=np):
        # The pre-activation's sum of |terms|: relu and gelu change an error by at most about
        # their slope (gelu's is under 1.13), and gelu's own fp32 rounding is relative to |x|.
        A, B = xp.abs(inputs["A"].astype(xp.float64)), xp.abs(inputs["B"].astype(xp.float64))
        return xp.matmul(A, B) + xp.abs(inputs["bias"].astype(xp.float64))

    def bytes_moved(self, problem: Problem, case: dict | None = None) -> int:
        b, m, n, k = (problem[d] for d in self.dims)
        return 4 * (b * (m * k + k * n + m * n) + n)

    def flops(self, problem: Problem) -> int:
        return 2 * problem["batch"] * problem["m"] * problem["n"] * problem["k"]

    def peer(self, problem: Problem) -> Peer | None:
        """cuBLAS's strided batched sgemm (torch.bmm's call, TF32 off), without bias and activation:
        the GEMM alone. The torch peers with the epilogue (baddbmm + activation, torch.compile) are
        timed by scripts/bench_gemm_bias_act.py."""
        handle = cublas_handle()
        if handle is None:
            return None
        import cupy
        b, m, n, k = (problem[d] for d in self.dims)

        def run(inputs: dict) -> None:
            handle.sgemm_strided_batched_row_major(cupy.cuda.get_current_stream().ptr, b, m, n, k,
                                                   inputs["A"].data.ptr, inputs["B"].data.ptr, inputs["C"].data.ptr)

        return Peer("cuBLAS sgemm strided batched (TF32 off), no bias or activation", run)

    # --- calls from Python ----------------------------------------------------------------
    def example_call(self, problem: Problem, cupy):
        rng = cupy.random.default_rng(0)
        b, m, n, k = (problem[d] for d in self.dims)
        A = rng.random((b, m, k), dtype=cupy.float32) - 0.5
        B = rng.random((b, k, n), dtype=cupy.float32) - 0.5
        bias = rng.random((n,), dtype=cupy.float32) - 0.5
        return (A, B, bias), {"act": problem["act"], "out": cupy.empty((b, m, n), dtype=cupy.float32)}

    def bind(self, cupy, device: int, args: tuple, kwargs: dict):
        """autogen.gemm_bias_act(A, B, bias, act="relu", out=None) -> act(A @ B + bias): A (batch, m, k)
        and B (batch, k, n), or A (m, k) and B (k, n) for one product; bias (n); float32, contiguous.
        act: "relu", "gelu" (the erf form) or "none"."""
        A, B, bias, act, out = _gemm_bias_act_arguments(*args, **kwargs)
        rank = len(getattr(A, "shape", ()))
        if rank not in (2, 3):
            shape = tuple(getattr(A, "shape", ()))
            raise ArgumentError(f"A must be 2-D (m, k) or 3-D (batch, m, k), not of shape {shape}")
        a = device_array(cupy, A, "A", self.dtypes, rank, device)
        b = device_array(cupy, B, "B", self.dtypes, rank, device)
        batch = a.shape[0] if rank == 3 else 1
        m, k = a.shape[-2:]
        if b.shape[-2] != k or (rank == 3 and b.shape[0] != batch):
            raise ArgumentError(f"B has shape {tuple(b.shape)}, but A {tuple(a.shape)} needs "
                                f"{'(%d, %d, n)' % (batch, k) if rank == 3 else '(%d, n)' % k}")
        n = b.shape[-1]
        v = device_array(cupy, bias, "bias", self.dtypes, 1, device)
        if v.shape[0] != n:
            raise ArgumentError(f"bias has {v.shape[0]} elements, but B has n={n} columns")
        shape = tuple(a.shape[:-1]) + (n,)
        if out is None:
            out = new_output(cupy, A, shape, "float32")
        c = device_array(cupy, out, "out", self.dtypes, rank, device)
        if tuple(c.shape) != shape:
            raise ArgumentError(f"out has shape {tuple(c.shape)}, but A @ B is {shape}")
        inputs = {"A": a, "B": b, "bias": v, "C": c}
        dims = (("batch", batch), ("m", m), ("n", n), ("k", k), ("act", act))
        return self.problem_cached("float32", dims), inputs, out


def _gemm_bias_act_arguments(A, B, bias, act=ACTIVATIONS[0], out=None):
    if act not in ACTIVATIONS:
        raise ArgumentError(f"act must be one of {', '.join(ACTIVATIONS)}, not {act!r}")
    return A, B, bias, act, out
