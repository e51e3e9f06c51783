"""SOFTMAX over the last dimension of a row-major rows x cols matrix, fp32 arithmetic; x and y
both fp32 or both fp16. Template: templates/softmax/kernel.cu.j2."""

from __future__ import annotations

import numpy as np

from autogen.core.family import Family, Launch, Peer, Step
from autogen.core.operands import device_array, dtype_name, kernel_scalar, new_output, random_uniform
from autogen.core.problem import Config, Problem
from autogen.core.registry import register
from autogen.core.signature import OpSignature, Output, Tensor
from autogen.core.space import Param, Space
from autogen.errors import ArgumentError
from autogen.gpu.peers import torch_cuda, torch_stream_peer

_STORAGE = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16"}

MIN_BLOCK = 128  # threads per block when a row takes fewer: rows_per_block = block / threads_per_row

# Relative L2 error allowed per dtype. fp32: the kernels use accurate expf and one division per
# row, ~1e-7 from float64. fp16: the output itself is rounded to fp16, up to 2^-11 = 4.9e-4
# relative per element, so 1e-3 allows that rounding and the fp32 arithmetic under it and little
# else. Probabilities under fp16's smallest normal (2^-14: rows of over ~16,000 columns) are
# stored with a fixed spacing; from ~60,000 columns that rounding alone exceeds 1e-3, and
# validation adds it (measure.judge, Family.representable_error).
# tolerance_for gives measure.validate the bound of the problem's dtype.
TOLERANCES = {"float32": 1e-5, "float16": 1e-3}

LARGE_SCALE = 1e4  # |x| < 5000: far past exp's fp32 range without max subtraction, inside fp16's 65504
NEG_INF_FRACTION = 0.25


def _smem_only_across_warps(p) -> str | None:
    # A row inside one warp is reduced with shuffles only; reduce=smem would duplicate a variant.
    if p["reduce"] == "smem" and p["threads_per_row"] <= 32:
        return "reduce=smem only differs from shfl when threads_per_row > 32"
    return None


def _values_fit_registers(p) -> str | None:
    # Kernels are built for up to 64 registers per thread (1024 / block blocks per SM). A row
    # held in registers fits 32 values in that; the re-read path (vector and scalar access
    # paths and the running state) spilled with 32 in a full nvcc -Xptxas -v sweep, not with 16.
    limit = 32 if p["row_cache"] == "registers" else 16
    if p["vector_width"] * p["unroll"] > limit:
        return (f"vector_width*unroll={p['vector_width'] * p['unroll']} values per thread exceeds "
                f"{limit} with row_cache={p['row_cache']}")
    return None


SPACE = Space(
    params=(
        Param("threads_per_row", (4, 8, 16, 32, 64, 128, 256, 512, 1024), "tpr",
              "threads on one row: <32 packs rows in a warp, 32 is a warp per row, 1024 a block per row"),
        Param("vector_width", (1, 2, 4, 8), "vw",
              "elements per access: 16 bytes at 4 (fp32) or 8 (fp16); fp32 at 8 is two 16-byte accesses"),
        Param("unroll", (1, 2, 4, 8, 16), "u",
              "loads per thread per step; with row_cache=registers also the row's register capacity"),
        Param("reduce", ("shfl", "smem"), "r", "cross-warp row reductions: shuffles or a shared-memory tree"),
        Param("row_cache", ("registers", "global"), "rc",
              "keep the row in registers (when cols <= tpr*vw*unroll) or read it again for each pass"),
        Param("passes", ("online", "two_pass"), "p",
              "one running (max, sum) pass, or a max pass then a sum pass"),
    ),
    constraints=(_smem_only_across_warps, _values_fit_registers),
)


@register
class Softmax(Family):
    name = "softmax"
    api = "softmax"
    reuse_bound_calls = True  # bind only checks and arranges (autogen.runtime.bound_calls)
    dims = ("rows", "cols")
    # Shapes with tails for the export's self-test (Family.tail_shapes).
    tail_shapes = ((1, 1), (3, 5), (7, 33), (1000, 37), (2, 4099))
    dtypes = ("float32", "float16")
    space = SPACE
    default_params = {"threads_per_row": 32, "vector_width": 4, "unroll": 8, "reduce": "shfl",
                      "row_cache": "registers", "passes": "online"}
    outputs = ("y",)
    op_signature = OpSignature((Tensor("x"),), (Output("out", lambda x: tuple(x.shape), "x"),))
    # x and y hold float (f32 variants) or __half (f16 variants), as the kernel name's dtype tag
    # says; `void*` keeps one signature for both dtypes.
    c_params = "const void* x, void* y, int rows, int cols"
    tolerance = TOLERANCES["float32"]
    description = "y = softmax(x) over the last dimension, rows x cols, fp32 or fp16"

    def tolerance_for(self, problem: Problem) -> float:
        return TOLERANCES[problem.dtype]

    # --- geometry -------------------------------------------------------------------------
    def block_threads(self, config: Config) -> int:
        return max(config["threads_per_row"], MIN_BLOCK)

    def rows_per_block(self, config: Config) -> int:
        return self.block_threads(config) // config["threads_per_row"]

    def register_capacity(self, config: Config) -> int:
        """Columns a row group holds in registers: one step of every thread."""
        return config["threads_per_row"] * config["vector_width"] * config["unroll"]

    def launch(self, problem: Problem, config: Config) -> Launch:
        rows = self.rows_per_block(config)
        return Launch(grid=(-(-problem["rows"] // rows), 1, 1), block=(self.block_threads(config), 1, 1))

    def reject_reason(self, problem: Problem, config: Config) -> str | None:
        cols = problem["cols"]
        capacity = self.register_capacity(config)
        step = config["threads_per_row"] * config["vector_width"]
        if step > 2 * max(cols, 32):
            return f"threads_per_row*vector_width={step} spans over twice cols={cols}"
        if config["row_cache"] == "registers":
            if config["vector_width"] > 1 and cols % config["vector_width"]:
                return (f"cols={cols} is not a multiple of vector_width={config['vector_width']}: rows are "
                        "not held in registers, the variant takes the scalar re-read path")
            if cols > capacity:
                return (f"cols={cols} does not fit the {capacity} register slots: the variant would "
                        "read the row again for each pass, as row_cache=global does")
            if config["unroll"] > 1 and capacity // 2 >= cols:
                return f"unroll={config['unroll']} holds twice the row; unroll={config['unroll'] // 2} fits it"
        elif config["unroll"] > 1 and capacity > 2 * max(cols, 32):
            return f"unroll={config['unroll']} reaches past cols={cols} on the first step"
        return None

    # --- data -----------------------------------------------------------------------------
    def validation_cases(self, problem: Problem) -> list[dict]:
        # Large magnitudes need the max subtraction; -inf entries must give 0, and the row of
        # only -inf must give NaN (as torch.softmax does; the float64 reference gives NaN too).
        return [{"values": "uniform"}, {"values": "large"}, {"values": "neg_inf"}]

    def timing_case(self, problem: Problem) -> dict:
        return {"values": "uniform"}

    def make_inputs(self, problem: Problem, xp, rng, case: dict) -> dict:
        rows, cols = problem["rows"], problem["cols"]
        x = random_uniform(xp, rng, (rows, cols), xp.float32)
        if case["values"] == "large":
            x *= xp.float32(LARGE_SCALE)
        elif case["values"] == "neg_inf":
            # copyto, not boolean-mask assignment: CuPy runs that as a scan and a scatter, kernels a
            # cold GPU worker would compile before its first check (docs/internals.md).
            xp.copyto(x, -xp.inf, where=rng.random((rows, cols), dtype=xp.float32) < NEG_INF_FRACTION)
            x[rows // 2, :] = -xp.inf
        return {"x": x.astype(problem.dtype, copy=False),
                "y": xp.full((rows, cols), xp.nan, dtype=problem.dtype)}

    def plan(self, problem: Problem, config: Config) -> list[Step]:
        rows, cols = kernel_scalar(problem["rows"], np.int32), kernel_scalar(problem["cols"], np.int32)
        return [Step("", self.launch(problem, config), lambda inputs: (inputs["x"], inputs["y"], rows, cols))]

    def reference(self, problem: Problem, inputs: dict, xp=np):
        x = inputs["x"].astype(xp.float64)
        with np.errstate(invalid="ignore"):  # a row of only -inf: -inf - -inf = NaN, on purpose
            e = xp.exp(x - x.max(axis=1, keepdims=True))
            return e / e.sum(axis=1, keepdims=True)

    def bytes_moved(self, problem: Problem, case: dict | None = None) -> int:
        return 2 * problem["rows"] * problem["cols"] * np.dtype(problem.dtype).itemsize

    def bind(self, cupy, device: int, args: tuple, kwargs: dict):
        """autogen.softmax(x, out=None) -> softmax over the last dimension, x's dtype."""
        x, out = _softmax_arguments(*args, **kwargs)
        ndarray = cupy.ndarray
        if type(x) is ndarray and (out is None or type(out) is ndarray):
            # CuPy operands: device_array's checks inline; anything off goes the long way.
            dtype = _STORAGE.get(x.dtype)
            if dtype is not None and x.ndim == 2 and x._c_contiguous and x.data.device_id == device:
                if out is None:
                    out = new_output(cupy, x, x.shape, dtype)
                if (out.dtype is x.dtype and out.shape == x.shape and out._c_contiguous
                        and out.data.device_id == device):
                    rows, cols = x.shape
                    return self.problem_cached(dtype, (("rows", rows), ("cols", cols))), {"x": x, "y": out}, out
        xv = device_array(cupy, x, "x", self.dtypes, 2, device)
        rows, cols = xv.shape
        if out is None:
            out = new_output(cupy, x, (rows, cols), dtype_name(xv))
        outv = device_array(cupy, out, "out", (dtype_name(xv),), 2, device)
        if outv.shape != xv.shape:
            raise ArgumentError(f"out has shape {outv.shape}, but x has {xv.shape}")
        return self.problem_cached(dtype_name(xv), (("rows", rows), ("cols", cols))), {"x": xv, "y": outv}, out

    def example_call(self, problem: Problem, cupy):
        rng = cupy.random.default_rng(0)
        x = (rng.random((problem["rows"], problem["cols"]), dtype=cupy.float32) - 0.5).astype(problem.dtype)
        return (x,), {"out": cupy.empty_like(x)}

    peer_imports = ("torch",)

    def peer(self, problem: Problem) -> Peer | None:
        """torch.softmax, run inside CuPy's stream capture on the capturing stream (torch's
        ExternalStream over CuPy's current stream). Nothing may allocate during capture, so an
        out= form writes into the inputs' own y (torch.softmax(x, -1, out=y), or
        torch._softmax(x, -1, False, out=y) where the first is refused). A warm-up outside capture initialises torch's CUDA state, picks
        the out= form and loads torch's kernel for this shape and dtype. Checked on torch 2.11:
        the replayed graph's output matches the float64 reference (tests/families/test_gpu_reduce_softmax.py)."""
        torch = torch_cuda()
        if torch is None:
            return None
        softmax_into = _torch_softmax_out(torch, problem)
        return torch_stream_peer("torch.softmax", {"x": problem.dtype, "y": problem.dtype},
                                 lambda t: softmax_into(t["x"], t["y"]))


def _torch_softmax_out(torch, problem: Problem):
    """torch's softmax writing into a given tensor, checked (and its kernel loaded) outside capture."""
    sample = torch.rand((problem["rows"], problem["cols"]), dtype=getattr(torch, problem.dtype), device="cuda")
    out = torch.empty_like(sample)
    candidates = (("softmax(out=)", lambda x, y: torch.softmax(x, -1, out=y)),
                  ("_softmax(out=)", lambda x, y: torch._softmax(x, -1, False, out=y)))
    failures = []
    for label, call in candidates:
        try:
            call(sample, out)
            torch.cuda.synchronize()
        except (TypeError, RuntimeError) as exc:
            failures.append(f"{label}: {exc}")
            continue
        if torch.allclose(out.float(), torch.softmax(sample.float(), -1), atol=1e-3):
            return call
        failures.append(f"{label}: wrong result")
    raise RuntimeError("torch offers no softmax with out=: " + "; ".join(failures))


def _softmax_arguments(x, out=None):
    return x, out
