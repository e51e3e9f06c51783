"""REDUCE: out[0] = sum(x), x of any length n >= 1, fp32 or fp16 in, fp32 accumulation and
output. Template: templates/reduce/kernel.cu.j2.

Workspace: two_kernel and last_block write one float per block. The inputs dict carries that
buffer (`partials`, NaN-poisoned so a partial read before it is written shows) sized for the
largest grid any config launches on this shape and device, plus a ticket `counter` that starts at
0 and is left at 0 by every last_block launch. The exported host launcher takes its workspace
with cudaMallocAsync/cudaFreeAsync on the caller's stream instead, so every variant keeps the one
signature of `c_params`.
"""

from __future__ import annotations

import functools


import numpy as np

from autogen.core.family import Family, Launch, Peer, Step
from autogen.core.operands import device_array, dtype_name, kernel_scalar, new_output, stream_workspace
from autogen.core.problem import Config, Problem
from autogen.core.registry import register
from autogen.core.signature import OpSignature, Output, Tensor
from autogen.core.space import Param, Space
from autogen.errors import ArgumentError, GpuUnavailableError
from autogen.gpu.device import require_cupy, resident_capacity
from autogen.gpu.peers import ReplayArena

_STORAGE = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16"}
_F32 = np.dtype(np.float32)

# The tails case puts half of the sum in the first and last HEAVY_EDGE elements (where misaligned
# vector starts and partial tiles are handled), so one dropped or doubled element there moves the
# result by far more than the tolerance. fp16 caps the scale to stay inside its range (65504).
HEAVY_EDGE = 1024
FP16_MAX_SCALE = 30000.0


def _loads_fit_registers(p) -> str | None:
    # Elements in flight per thread must fit the registers: 64 per thread at 1024 threads, where
    # fp32 with 32 in flight spills on sm_80 (a full nvcc -Xptxas -v sweep); 32 elsewhere.
    limit = 16 if p["block_size"] == 1024 else 32
    if p["vector_width"] * p["unroll"] > limit:
        return (f"vector_width*unroll={p['vector_width'] * p['unroll']} elements in flight exceeds {limit} "
                f"at block_size={p['block_size']}")
    return None


SPACE = Space(
    params=(
        Param("block_size", (128, 256, 512, 1024), "bs", "threads per block"),
        Param("vector_width", (1, 2, 4, 8), "vw",
              "elements per load: 16-byte loads at 4 (fp32) or 8 (fp16); fp32 at 8 is two 16-byte loads"),
        Param("unroll", (1, 2, 4, 8), "u", "independent loads per thread issued before the adds"),
        Param("elements_per_thread", (8, 32, 128), "ept",
              "sizes the grid: ceil(n / (block_size * ept)) blocks, at most one wave of resident blocks"),
        Param("block_reduce", ("shfl", "smem"), "r",
              "block total by warp shuffles, or by a shared-memory tree with the last warp unrolled"),
        Param("cross_block", ("two_kernel", "atomic", "last_block"), "x",
              "blocks combined by a second kernel, by atomicAdd into the output, or by the last block"),
    ),
    constraints=(_loads_fit_registers,),
)


@register
class Reduce(Family):
    name = "reduce"
    api = "reduce_sum"
    reuse_bound_calls = True  # bind only checks and arranges (autogen.runtime.bound_calls)
    dims = ("n",)
    # Shapes with tails for the export's self-test (Family.tail_shapes).
    tail_shapes = ((1,), (3,), (1000,), (4097,), (1048579,))
    dtypes = ("float32", "float16")
    space = SPACE
    default_params = {"block_size": 256, "vector_width": 4, "unroll": 4, "elements_per_thread": 32,
                      "block_reduce": "shfl", "cross_block": "last_block"}
    outputs = ("out",)
    op_signature = OpSignature((Tensor("x"),), (Output("out", lambda: (), "float32"),))  # a 0-d sum
    # x holds float (f32 variants) or __half (f16 variants), as the kernel name's dtype tag says;
    # `const void*` keeps one signature for both dtypes. out is one float.
    c_params = "const void* x, float* out, int n"
    # fp32 accumulation of fp32 or fp16 inputs against the float64 sum of the same (rounded)
    # inputs: the inputs are positive, so the sum is never near zero and the error is relative
    # rounding of fp32 partial sums, ~1e-7 with per-thread chains of up to a few thousand adds.
    tolerance = 1e-5
    description = "out = sum(x), fp32 accumulation; fp32 or fp16 x of any length"

    # --- geometry -------------------------------------------------------------------------
    def grid_blocks(self, problem: Problem, block_size: int, elements_per_thread: int) -> int:
        """ceil(n / (block * ept)) blocks, capped at one wave of resident blocks (threads stride
        over the rest). The host launcher computes the same from the device's attributes."""
        sm_count, threads_per_sm = resident_capacity()
        wave = max(1, sm_count * (threads_per_sm // block_size))
        wanted = -(-problem["n"] // (block_size * elements_per_thread))
        return max(1, min(wanted, wave))

    def launch(self, problem: Problem, config: Config) -> Launch:
        blocks = self.grid_blocks(problem, config["block_size"], config["elements_per_thread"])
        return Launch(grid=(blocks, 1, 1), block=(config["block_size"], 1, 1))

    @functools.lru_cache(maxsize=1024)  # on every dispatched call: computed once per shape
    def workspace_blocks(self, problem: Problem) -> int:
        """Partials needed by the largest grid any config of the space launches on this shape."""
        return max(self.grid_blocks(problem, bs, ept) for bs in SPACE.param("block_size").choices
                   for ept in SPACE.param("elements_per_thread").choices)

    def plan(self, problem: Problem, config: Config) -> list[Step]:
        main = self.launch(problem, config)
        blocks = main.grid[0]
        n = kernel_scalar(problem["n"], np.int32)
        mode = config["cross_block"]
        if mode == "atomic":
            return [Step("_init", Launch(grid=(1, 1, 1), block=(1, 1, 1)), lambda inputs: (inputs["out"],)),
                    Step("", main, lambda inputs: (inputs["x"], inputs["out"], n))]

        def partials(inputs: dict):
            buffer = inputs["partials"]
            if buffer.size < blocks:  # never write past the workspace
                raise ValueError(f"partials holds {buffer.size} floats; this launch writes {blocks}")
            return buffer

        if mode == "two_kernel":
            return [Step("", main, lambda inputs: (inputs["x"], partials(inputs), n)),
                    Step("_final", Launch(grid=(1, 1, 1), block=(config["block_size"], 1, 1)),
                         lambda inputs, blocks_arg=kernel_scalar(blocks, np.int32):
                         (partials(inputs), inputs["out"], blocks_arg))]
        return [Step("", main, lambda inputs: (inputs["x"], partials(inputs), inputs["counter"], inputs["out"], n))]

    def reject_reason(self, problem: Problem, config: Config) -> str | None:
        # One load step of the block covering over twice n leaves most threads idle.
        n = problem["n"]
        step = config["block_size"] * config["vector_width"] * config["unroll"]
        if step > 2 * max(n, 128) and (config["vector_width"] > 1 or config["unroll"] > 1):
            return f"block_size*vector_width*unroll={step} spans over twice n={n}"
        if config["block_size"] > 128 and config["block_size"] > 2 * n:
            return f"block_size={config['block_size']} is over twice n={n}"
        return None

    # --- data -----------------------------------------------------------------------------
    def validation_cases(self, problem: Problem) -> list[dict]:
        # Uniform [0, 1): every element counts and the sum is never near zero. Heavy edges: the
        # elements where heads and tails are handled carry half of the sum.
        return [{"values": "uniform"}, {"values": "heavy_edges"}]

    def timing_case(self, problem: Problem) -> dict:
        return {"values": "uniform"}

    def make_inputs(self, problem: Problem, xp, rng, case: dict) -> dict:
        n = problem["n"]
        values = rng.random((n,), dtype=xp.float32)
        if case["values"] == "heavy_edges":
            values = _heavy_edges(xp, values, problem.dtype)
        blocks = self.workspace_blocks(problem)
        return {"x": values.astype(problem.dtype, copy=False),
                "out": xp.full((1,), xp.nan, dtype=xp.float32),
                "partials": xp.full((blocks,), xp.nan, dtype=xp.float32),
                "counter": xp.zeros((1,), dtype=xp.uint32)}

    def reference(self, problem: Problem, inputs: dict, xp=np):
        return inputs["x"].astype(xp.float64).sum(keepdims=True)

    def bytes_moved(self, problem: Problem, case: dict | None = None) -> int:
        return problem["n"] * np.dtype(problem.dtype).itemsize + 4

    def flops(self, problem: Problem) -> int:
        return problem["n"]

    # --- calls from Python ----------------------------------------------------------------
    def bind(self, cupy, device: int, args: tuple, kwargs: dict):
        """autogen.reduce_sum(x, out=None) -> 0-d float32 sum (a CuPy array, or a tensor for a
        tensor); `out`, when given, is a float32 array of one element and is returned as given."""
        x, out = _reduce_arguments(*args, **kwargs)
        if type(x) is cupy.ndarray and x.ndim == 1 and x._c_contiguous and x.data.device_id == device \
                and x.dtype in _STORAGE:
            xv, dtype = x, _STORAGE[x.dtype]  # device_array's checks, inline for CuPy operands
        else:
            xv = device_array(cupy, x, "x", self.dtypes, 1, device)
            dtype = dtype_name(xv)
        problem = self.problem_cached(dtype, (("n", xv.shape[0]),))
        if out is None:
            out = new_output(cupy, x, (1,), "float32")
            result = out.reshape(())
        else:
            result = out
        if type(out) is cupy.ndarray and out.size == 1 and out.dtype is _F32 and out.data.device_id == device:
            outv = out.reshape(1) if out.ndim != 1 else out
        else:
            outv = device_array(cupy, out, "out", ("float32",), getattr(out, "ndim", 1), device).reshape(-1)
            if outv.size != 1:
                raise ArgumentError(f"out must hold one float32 element, got shape {tuple(out.shape)}")
        partials, counter = stream_workspace(cupy, device, x, "reduce_sum",
                                             ((self.workspace_blocks(problem), "float32"), (1, "uint32")))
        return problem, {"x": xv, "out": outv, "partials": partials, "counter": counter}, result

    def example_call(self, problem: Problem, cupy):
        x = cupy.random.default_rng(0).random(problem["n"], dtype=cupy.float32).astype(problem.dtype)
        return (x,), {"out": cupy.empty(1, dtype=cupy.float32)}

    def peer(self, problem: Problem) -> Peer | None:
        """cupy.sum (CUB's device reduction for fp32; CuPy's reduction kernel for fp16 in, fp32
        out), under a ReplayArena so that its allocations are safe inside stream capture."""
        try:
                cupy = require_cupy()
        except GpuUnavailableError:
            return None
        accumulate = cupy.float32 if problem.dtype == "float16" else None
        sample = cupy.zeros((problem["n"],), dtype=problem.dtype)
        sample_out = cupy.zeros((), dtype=cupy.float32)
        arena = ReplayArena(cupy, lambda: cupy.sum(sample, dtype=accumulate, out=sample_out))
        del sample, sample_out

        def run(inputs: dict) -> None:
            out = inputs["out"].reshape(())  # a view: no allocation
            arena.run(lambda: cupy.sum(inputs["x"], dtype=accumulate, out=out))

        return Peer("cupy.sum" + (" (CUB)" if problem.dtype == "float32" else " (fp32 accumulation)"), run)


def _reduce_arguments(x, out=None):
    return x, out


# Workspace of dispatched calls, per (device, stream): the partials and the ticket counter that
# every last_block launch leaves at 0. Launches on one stream run in order, so they can share it;
# calls on other streams get their own. Kept for the process: a CUDA graph captured with it
# refers to it for as long as the graph lives.
def _heavy_edges(xp, values, dtype: str):
    """Scale the first and last HEAVY_EDGE elements (into [0.5, 1) x scale) so they hold about
    half of the sum."""
    n = values.size
    edge = min(HEAVY_EDGE, n // 2)
    if edge == 0:
        return values
    scale = max(1.0, (n - 2 * edge) / (3.0 * edge))  # 2 * edge * 0.75 * scale ~ (n - 2 edge) / 2
    if dtype == "float16":
        scale = min(scale, FP16_MAX_SCALE)
    values = values.copy()
    values[:edge] = (0.5 + 0.5 * values[:edge]) * xp.float32(scale)
    values[-edge:] = (0.5 + 0.5 * values[-edge:]) * xp.float32(scale)
    return values
