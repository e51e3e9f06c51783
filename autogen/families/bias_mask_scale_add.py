"""BIAS_MASK_SCALE_ADD: y[i] = (x[i] + bias[i % bias_size]) * (mask[i] ? scale : 0) + addend[i], the
fused bias-dropout-residual step of a transformer layer. x, bias, addend, y in one dtype (fp32,
fp16, bf16), mask uint8 (nonzero keeps), n >= 1 elements, bias_size dividing n.
Template: templates/bias_mask_scale_add/kernel.cu.j2 (shared pieces in templates/elementwise.cuh.j2 and
_elementwise.py).
"""

from __future__ import annotations

import functools

import numpy as np

from autogen.core.dtypes import DTYPES, to_float64, to_storage
from autogen.core.family import Family, Launch, Peer, Step
from autogen.core.operands import dtype_name, kernel_scalar, new_output
from autogen.core.problem import Config, Problem
from autogen.core.registry import register
from autogen.core.signature import OpSignature, Output, Scalar, Tensor
from autogen.errors import ArgumentError, UsageError
from autogen.families import _elementwise as ew
from autogen.gpu.peers import torch_cuda, torch_stream_peer

X_RANGE = 2.0  # x and addend uniform in [-2, 2), bias in [-0.5, 0.5)
BIAS_RANGE = 0.5

# The earlier H200 winners (docs/history/sessions.md), seeded after the vendor-like points: fp32
# took the scalar path (vw1 ept4 bs256) at 2^24 and 2^28, fp16 half2 with 8-byte packs.
EARLIER_WINNERS = {
    "float32": ({"vector_width": 1, "elements_per_thread": 4, "block_size": 256, "loop": "one_pass",
                 "math": "float", "cache": "ldg"},),
    "half": ({"vector_width": 4, "elements_per_thread": 4, "block_size": 512, "loop": "one_pass",
              "math": "half2", "cache": "ldg"},),
}

# What torch.compile (Inductor, autotuned) runs for the fp32 expression: 256 threads, two scalar
# loads per input with an L1 and L2 evict_last policy, plain stores (its PTX). The template's
# config for it was level with it at 2^28, where the searches' ldg winners were behind, and no
# search had measured it (docs/families/elementwise.md).
INDUCTOR_FP32 = {"vector_width": 1, "elements_per_thread": 2, "block_size": 256, "loop": "one_pass",
                 "math": "float", "cache": "last"}


@register
class BiasMaskScaleAdd(Family):
    name = "bias_mask_scale_add"
    api = "bias_mask_scale_add"
    reuse_bound_calls = True  # bind only checks and arranges (autogen.runtime.bound_calls)
    dims = ("n", "bias_size")
    # Shapes with tails for the export's self-test (Family.tail_shapes).
    tail_shapes = ((1, 1), (3, 1), (6, 3), (8, 8), (12, 4), (1000, 8), (4104, 8), (49152, 4096), (1048578, 2))
    dtypes = ew.DTYPES
    # Four loads per element in flight (x, bias, addend, mask): fp32 at 16 elements per thread and
    # step spills on sm_90 (nvcc -Xptxas -v); 8 compiles clean on sm_80 and sm_90.
    space = ew.make_space(max_ept=8)
    default_params = ew.DEFAULT_PARAMS
    outputs = ("y",)
    op_signature = OpSignature(
        (Tensor("x"), Tensor("bias"), Tensor("mask"), Scalar("scale", "float"), Tensor("addend")),
        (Output("out", lambda x: tuple(x.shape), "x"),))
    # x, bias, addend and y hold float, fp16 or bf16 bit patterns as the kernel name's dtype tag
    # says; mask one byte per element.
    c_params = ("const void* x, const void* bias, const unsigned char* mask, float scale, const void* addend, "
                "void* y, int n, int bias_size")
    tolerance = ew.TOLERANCES["float32"]
    roofline = "memory"
    # Checked on the GPU at every size: its cases read views one element past an aligned address
    # (ew.offset_view), which an upload from the host would realign.
    host_check_bytes = 0
    description = ("y = (x + bias[i % bias_size]) * (mask ? scale : 0) + addend, fp32, fp16 or bf16, "
                   "mask uint8")

    def tolerance_for(self, problem: Problem) -> float:
        return ew.tolerance(problem)

    def check_problem(self, problem: Problem) -> None:
        if problem["n"] % problem["bias_size"]:
            raise UsageError(f"{self.name}: bias_size={problem['bias_size']} must divide n={problem['n']}")

    # --- geometry -------------------------------------------------------------------------
    @staticmethod
    def staged_bytes(dtype: str) -> int:
        """Bytes per element that loop=bulk stages in shared memory: x, mask and addend (y is
        written over x; the bias stays in the caches)."""
        return 2 * DTYPES[dtype].itemsize + 1

    def template_vars(self, dtype: str, config: Config, host_launcher: bool = False, traits=()) -> dict:
        return {**super().template_vars(dtype, config, host_launcher, traits),
                **ew.bulk_template_vars(config, self.staged_bytes(dtype))}

    def launch(self, problem: Problem, config: Config) -> Launch:
        blocks = ew.grid_blocks(problem["n"], config, self.staged_bytes(problem.dtype))
        return Launch(grid=(blocks, 1, 1), block=(config["block_size"], 1, 1))

    def plan(self, problem: Problem, config: Config) -> list[Step]:
        # Converted once (kernel_scalar): a dispatched call converts nothing on the hot path.
        n, bias_size = kernel_scalar(problem["n"], np.int32), kernel_scalar(problem["bias_size"], np.int32)

        def args(inputs: dict) -> tuple:
            return (inputs["x"], inputs["bias"], inputs["mask"], kernel_scalar(inputs["scale"]), inputs["addend"],
                    inputs["y"], n, bias_size)

        return [Step("", self.launch(problem, config), args)]

    def seed_configs(self, problem: Problem) -> list[Config]:
        """Up to ew.SEEDS points measured first (ew.seed_params: 16-byte one-pass points, half2
        arithmetic in fp16/bf16), then for fp32 torch.compile's layout (INDUCTOR_FP32), then the
        earlier H200 winner of the dtype; those the pruning rejects (a bias_size that is no
        multiple of the pack) are left out; the default config where nothing is left."""
        half = problem.dtype in ew.HALF_TYPES
        own = EARLIER_WINNERS["half"] if half else (INDUCTOR_FP32, *EARLIER_WINNERS["float32"])
        seeds = ew.seed_params(problem, 8, half, self.staged_bytes(problem.dtype), own)
        return ew.fitting_seeds(self, problem, seeds)

    def reject_reason(self, problem: Problem, config: Config) -> str | None:
        if config["vector_width"] > 1 and problem["bias_size"] % config["vector_width"]:
            return (f"bias_size={problem['bias_size']} is not a multiple of vector_width={config['vector_width']}: "
                    "every element takes the scalar path")
        return ew.reject_reason(problem, config, self.staged_bytes(problem.dtype))

    # --- data -----------------------------------------------------------------------------
    def validation_cases(self, problem: Problem) -> list[dict]:
        # Dropout 0.1 (scale 1/0.9); half dropped with mask bytes of any nonzero value; every
        # array one element past an aligned address (vector variants take their scalar path).
        return [{"keep": 0.9, "scale": 1.0 / 0.9, "mask": "ones", "offset": 0},
                {"keep": 0.5, "scale": 2.0, "mask": "bytes", "offset": 0},
                {"keep": 0.8, "scale": 1.25, "mask": "ones", "offset": 1}]

    def timing_case(self, problem: Problem) -> dict:
        return self.validation_cases(problem)[0]

    def make_inputs(self, problem: Problem, xp, rng, case: dict) -> dict:
        n, bias_size, dtype = problem["n"], problem["bias_size"], problem.dtype
        offset = case.get("offset", 0)

        def uniform(size: int, half_range: float):
            values = (rng.random((size,), dtype=xp.float32) - xp.float32(0.5)) * xp.float32(2 * half_range)
            return ew.offset_view(xp, to_storage(xp, values, dtype), offset)

        keep = rng.random((n,), dtype=xp.float32) < xp.float32(case["keep"])
        if case["mask"] == "bytes":  # any nonzero byte keeps the element
            kept = (rng.random((n,), dtype=xp.float32) * xp.float32(254.99) + xp.float32(1)).astype(xp.uint8)
            mask = xp.where(keep, kept, xp.uint8(0)).astype(xp.uint8)
        else:
            mask = keep.astype(xp.uint8)
        poison = to_storage(xp, xp.full((n,), xp.nan, dtype=xp.float32), dtype)
        return {"x": uniform(n, X_RANGE), "bias": uniform(bias_size, BIAS_RANGE),
                "mask": ew.offset_view(xp, mask, offset), "addend": uniform(n, X_RANGE),
                "y": ew.offset_view(xp, poison, offset), "scale": float(case["scale"])}

    def _terms(self, problem: Problem, inputs: dict, xp):
        n, bias_size, dtype = problem["n"], problem["bias_size"], problem.dtype
        x = to_float64(xp, inputs["x"], dtype)
        bias = xp.tile(to_float64(xp, inputs["bias"], dtype), n // bias_size)
        multiplier = xp.where(inputs["mask"] != 0, float(np.float32(inputs["scale"])), 0.0)
        return x + bias, multiplier, to_float64(xp, inputs["addend"], dtype)

    def reference(self, problem: Problem, inputs: dict, xp=np):
        biased, multiplier, addend = self._terms(problem, inputs, xp)
        return biased * multiplier + addend

    def reference_magnitude(self, problem: Problem, inputs: dict, xp=np):
        # (x + bias) * m and addend may cancel: rounding is relative to their magnitudes.
        biased, multiplier, addend = self._terms(problem, inputs, xp)
        return xp.abs(biased) * xp.abs(multiplier) + xp.abs(addend)

    def bytes_moved(self, problem: Problem, case: dict | None = None) -> int:
        size = DTYPES[problem.dtype].itemsize
        return problem["n"] * (3 * size + 1) + problem["bias_size"] * size

    def flops(self, problem: Problem) -> int:
        return 3 * problem["n"]

    # --- peers ----------------------------------------------------------------------------
    peer_imports = ("torch",)

    def peer(self, problem: Problem) -> Peer | None:
        """torch eager, the composed expression (x + bias) * mask * scale + addend as eager runs
        it (four kernels, the same roundings), with out= into one temporary taken here, outside
        capture: nothing is allocated inside CuPy's stream capture. scripts/bench_elementwise.py
        also times the literal expression (allocating its temporaries) and torch.compile of it in
        torch's own CUDA graphs."""
        torch = torch_cuda()
        if torch is None:
            return None
        n, bias_size = problem["n"], problem["bias_size"]
        temporary = torch.empty((n // bias_size, bias_size), dtype=getattr(torch, problem.dtype), device="cuda")
        scale = {"value": 1.0}

        def composed(t: dict) -> None:
            torch.add(t["x"].view(-1, bias_size), t["bias"], out=temporary)
            torch.mul(temporary, t["mask"].view(-1, bias_size), out=temporary)
            torch.mul(temporary, scale["value"], out=temporary)
            torch.add(temporary.view(-1), t["addend"], out=t["y"])

        dtypes = {"x": problem.dtype, "bias": problem.dtype, "mask": "uint8", "addend": problem.dtype,
                  "y": problem.dtype}
        inner = torch_stream_peer("torch eager (x + bias) * mask * scale + addend (out=)", dtypes, composed)
        if inner is None:
            return None

        def run(inputs: dict) -> None:
            scale["value"] = float(inputs["scale"])  # read at capture, baked into the graph
            inner.run(inputs)

        return Peer(inner.name, run)

    # --- calls from Python ----------------------------------------------------------------
    def example_call(self, problem: Problem, cupy):
        rng = cupy.random.default_rng(0)
        n, size, dtype = problem["n"], problem["bias_size"], problem.dtype
        x = to_storage(cupy, rng.random(n, dtype=cupy.float32) - 0.5, dtype)
        bias = to_storage(cupy, rng.random(size, dtype=cupy.float32) - 0.5, dtype)
        addend = to_storage(cupy, rng.random(n, dtype=cupy.float32) - 0.5, dtype)
        mask = (rng.random(n, dtype=cupy.float32) < 0.9).astype(cupy.uint8)
        return (x, bias, mask, 1.25, addend), {"out": cupy.empty_like(x)}

    def bind(self, cupy, device: int, args: tuple, kwargs: dict):
        """autogen.bias_mask_scale_add(x, bias, mask, scale, addend, out=None) -> y, x's dtype
        and shape: (x + bias[i % bias.size]) * (mask[i] ? scale : 0) + addend[i] over the
        flattened arrays. bias.size must divide x.size; mask uint8 (or bool), x.size elements."""
        x, bias, mask, scale, addend, out = _arguments(*args, **kwargs)
        xv = ew.flat_operand(cupy, x, "x", self.dtypes, device)
        dtype = dtype_name(xv)
        bv = ew.flat_operand(cupy, bias, "bias", (dtype,), device)
        mv = ew.flat_operand(cupy, mask, "mask", ("uint8",), device, bool_as_uint8=True)
        av = ew.flat_operand(cupy, addend, "addend", (dtype,), device)
        n = xv.size
        if n == 0 or bv.size == 0:
            raise ArgumentError("x and bias need at least one element")
        for name, array in (("mask", mv), ("addend", av)):
            if array.size != n:
                raise ArgumentError(f"{name} has {array.size} elements, but x has {n}")
        if n % bv.size:
            raise ArgumentError(f"bias has {bv.size} elements, which does not divide x's {n}")
        if out is None:
            out = new_output(cupy, x, tuple(x.shape), dtype)
        ov = ew.flat_operand(cupy, out, "out", (dtype,), device)
        if ov.size != n:
            raise ArgumentError(f"out has {ov.size} elements, but x has {n}")
        inputs = {"x": xv, "bias": bv, "mask": mv, "addend": av, "y": ov, "scale": float(scale)}
        return self._problem_of(dtype, n, bv.size), inputs, out

    @functools.lru_cache(maxsize=1024)
    def _problem_of(self, dtype: str, n: int, bias_size: int) -> Problem:
        return self.problem(dtype, n=n, bias_size=bias_size)


def _arguments(x, bias, mask, scale, addend, out=None):
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)):
        raise ArgumentError(f"scale must be a number, not {type(scale).__name__}")
    return x, bias, mask, scale, addend, out
