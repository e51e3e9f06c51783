"""GELU: y = gelu(x) over a contiguous array of any length n >= 1, fp32, fp16 or bf16, in the tanh
form or the exact erf form (`approximate`, as torch.nn.functional.gelu names them).
Template: templates/gelu/kernel.cu.j2 (shared pieces in templates/elementwise.cuh.j2 and _elementwise.py).

The form is a trait of the problem (it joins the database key; the CLI takes --approximate), and
reaches the kernel as an argument: a template is rendered from (dtype, config) only, so every
variant holds both loops and picks one per launch. A variant tuned for one form is therefore
also a correct kernel for the other (the dispatcher's nearest-shape fallback and warm starts may
cross forms safely).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from autogen.core.dtypes import DTYPES, to_float64, to_storage
from autogen.core.family import Family, Launch, Peer, Step, Trait
from autogen.core.operands import dtype_name, kernel_scalar, new_output
from autogen.core.problem import Config, Problem
from autogen.core.registry import register
from autogen.core.signature import OpSignature, Output, Scalar, Tensor
from autogen.core.space import Param
from autogen.errors import ArgumentError
from autogen.families import _elementwise as ew
from autogen.gpu.peers import torch_cuda, torch_stream_peer

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
KAPPA = 0.044715

# The tails case: uniform in [-12, 12), and a tenth of the elements with magnitudes log-uniform in
# [10, 1000] (both signs): x^3 and exp overflow there in some arithmetic, the limits x and 0 must
# come out. Within fp16's range (65504).
TAILS_RANGE = 12.0
FAR_FRACTION = 0.1
FAR_LOG10 = (1.0, 3.0)
UNIFORM_RANGE = 4.0  # the uniform case (and the timing case): [-4, 4), the curved part of GELU

# erf=logistic (fp16, bf16): Phi(x) = 0.5 (1 + erf(x / sqrt(2))) ~ 1 / (1 + exp(-x P(x^2))), P a
# quadratic fitted (iteratively reweighted least squares on the logit, towards minimax) on
# [0, 6.5]: |error| <= 1.85e-5 on Phi (at x = 0.35), so <= 3e-5 relative to GELU's magnitude
# 0.5 |x| (1 + |erf|), 16 times under half an fp16 ulp. P stays positive up to x^2 = 134: the
# kernel clamps x^2 at 64 (Phi is 1 - 6e-16 there), so the exponent keeps x's sign at any x.
LOGISTIC_P = (1.5954356676677122, 0.07359651217180677, -0.0006316141307717751)
LOG2E = 1.0 / math.log(2.0)

# Earlier winners (docs/history/sessions.md; H200 unless noted), seeded after the vendor-like points.
EARLIER_WINNERS = {
    # fp32: the H100's best sweep at 2^24 in torch's graphs, then H200's
    "float32": ({"vector_width": 4, "elements_per_thread": 4, "block_size": 512, "loop": "one_pass",
                 "math": "float", "cache": "ldg"},
                {"vector_width": 4, "elements_per_thread": 8, "block_size": 512, "loop": "one_pass",
                 "math": "float", "cache": "ldg"}),
    "half_tanh": ({"vector_width": 2, "elements_per_thread": 8, "block_size": 128, "loop": "one_pass",
                   "math": "half2", "cache": "ldg"},),
    "half_erf": ({"vector_width": 8, "elements_per_thread": 8, "block_size": 256, "loop": "grid_stride",
                  "math": "float", "cache": "ldg"},
                 {"vector_width": 4, "elements_per_thread": 8, "block_size": 512, "loop": "one_pass",
                  "math": "float", "cache": "ldg"}),
}


def _parse_approximate(text: str) -> str:
    return text.strip().lower()


@register
class Gelu(Family):
    name = "gelu"
    api = "gelu"
    reuse_bound_calls = True  # bind only checks and arranges (autogen.runtime.bound_calls)
    dims = ("n",)
    # Shapes with tails for the export's self-test (Family.tail_shapes).
    tail_shapes = ((1,), (3,), (7,), (8,), (9,), (1000,), (4097,), (1048579,))
    traits = (Trait("approximate", ("tanh", "none"),
                    "GELU form as torch.nn.functional.gelu: tanh (the tanh approximation) or none (exact, erf)",
                    _parse_approximate),)
    dtypes = ew.DTYPES
    # 32 elements per thread and step spill in the scalar path (nvcc -Xptxas -v, sm_80 and sm_90).
    space = ew.make_space(max_ept=16, extra=(
        Param("erf", ("erff", "logistic"), "e",
              "erf form in fp16/bf16: CUDA's erff (26 instructions), or x / (1 + 2^(x Q(x^2))), a fitted "
              "logistic normal CDF within 3e-5 of GELU (9 instructions); fp32 always uses erff"),))
    default_params = {**ew.DEFAULT_PARAMS, "erf": "erff"}
    outputs = ("y",)
    op_signature = OpSignature((Tensor("x"), Scalar("approximate", "str", "tanh")),
                               (Output("out", lambda x: tuple(x.shape), "x"),))
    # x and y hold float, fp16 or bf16 bit patterns as the kernel name's dtype tag says; approximate
    # is 1 for the tanh form, 0 for the erf form.
    c_params = "const void* x, void* y, int n, int approximate"
    tolerance = ew.TOLERANCES["float32"]
    roofline = "memory"
    # Checked on the GPU at every size: its cases read views one element past an aligned address
    # (ew.offset_view), which an upload from the host would realign, and its float64 erf is a
    # Python call per element in NumPy.
    host_check_bytes = 0
    description = "y = gelu(x), tanh or exact (erf) form, fp32, fp16 or bf16, any length"

    def tolerance_for(self, problem: Problem) -> float:
        return ew.tolerance(problem)

    def template_vars(self, dtype: str, config: Config, host_launcher: bool = False, traits=()) -> dict:
        return {**super().template_vars(dtype, config, host_launcher, traits), "constants": pack_constants(dtype),
                **ew.bulk_template_vars(config, self.staged_bytes(dtype))}

    # --- geometry -------------------------------------------------------------------------
    @staticmethod
    def staged_bytes(dtype: str) -> int:
        """Bytes per element that loop=bulk stages in shared memory: x (y is written over it)."""
        return DTYPES[dtype].itemsize

    def launch(self, problem: Problem, config: Config) -> Launch:
        blocks = ew.grid_blocks(problem["n"], config, self.staged_bytes(problem.dtype))
        return Launch(grid=(blocks, 1, 1), block=(config["block_size"], 1, 1))

    def plan(self, problem: Problem, config: Config) -> list[Step]:
        # Converted once (kernel_scalar): a dispatched call converts nothing on the hot path.
        n, form = kernel_scalar(problem["n"], np.int32), kernel_scalar(int(problem["approximate"] == "tanh"), np.int32)

        def args(inputs: dict) -> tuple:
            return (inputs["x"], inputs["y"], n, form)

        return [Step("", self.launch(problem, config), args)]

    def reject_reason(self, problem: Problem, config: Config) -> str | None:
        if config["math"] == "half2" and problem["approximate"] == "none":
            return "math=half2 changes the tanh form only: the erf form computes in fp32 (no half erf)"
        if config["erf"] == "logistic":
            if problem["approximate"] == "tanh":
                return "erf=logistic changes the erf form only"
            if problem.dtype not in ew.HALF_TYPES:
                return "erf=logistic applies to fp16 and bf16 only (fp32 variants render erff: the same code)"
        return ew.reject_reason(problem, config, self.staged_bytes(problem.dtype))

    def seed_configs(self, problem: Problem) -> list[Config]:
        """Up to ew.SEEDS points measured first (ew.seed_params): the vendor-like 16-byte one-pass
        points, in half2 arithmetic for the tanh form in fp16/bf16 and with the logistic erf for
        the erf form there; then the earlier H200 winners of the dtype and form (the erf form's
        with the logistic erf, which only makes them cheaper). Those the pruning
        rejects are left out; the default config where nothing is left."""
        half = problem.dtype in ew.HALF_TYPES
        tanh = problem["approximate"] == "tanh"
        earlier = EARLIER_WINNERS["float32" if not half else "half_tanh" if tanh else "half_erf"]
        erf = "logistic" if half and not tanh else "erff"
        seeds = ew.seed_params(problem, 16, half and tanh, self.staged_bytes(problem.dtype), earlier)
        return ew.fitting_seeds(self, problem, ({**params, "erf": erf} for params in seeds))

    # --- data -----------------------------------------------------------------------------
    def validation_cases(self, problem: Problem) -> list[dict]:
        # Offset 1: x and y one element past an aligned address, so vector variants take their
        # scalar path (and an alignment check that looked at one pointer only would fault or fail).
        return [{"values": "uniform", "offset": 0}, {"values": "tails", "offset": 0},
                {"values": "uniform", "offset": 1}]

    def timing_case(self, problem: Problem) -> dict:
        return {"values": "uniform", "offset": 0}

    def make_inputs(self, problem: Problem, xp, rng, case: dict) -> dict:
        n, dtype = problem["n"], problem.dtype
        x = gelu_inputs(xp, rng, n, case["values"])
        offset = case.get("offset", 0)
        y = xp.full((n,), xp.nan, dtype=xp.float32)
        return {"x": ew.offset_view(xp, to_storage(xp, x, dtype), offset),
                "y": ew.offset_view(xp, to_storage(xp, y, dtype), offset)}

    def c_arguments(self, problem: Problem, inputs: dict) -> dict:
        return {**super().c_arguments(problem, inputs), "approximate": int(problem["approximate"] == "tanh")}

    def reference(self, problem: Problem, inputs: dict, xp=np):
        return gelu_reference(xp, to_float64(xp, inputs["x"], problem.dtype), problem["approximate"])

    def reference_magnitude(self, problem: Problem, inputs: dict, xp=np):
        return gelu_magnitude(xp, to_float64(xp, inputs["x"], problem.dtype), problem["approximate"])

    def bytes_moved(self, problem: Problem, case: dict | None = None) -> int:
        return 2 * problem["n"] * DTYPES[problem.dtype].itemsize

    def flops(self, problem: Problem) -> int:
        return 8 * problem["n"]  # about: the polynomial, the exp or erf, the product

    # --- peers ----------------------------------------------------------------------------
    peer_imports = ("torch",)

    def peer(self, problem: Problem) -> Peer | None:
        """torch's gelu writing into the inputs' own y (the out= form of aten::gelu: no
        allocation, so it is safe inside CuPy's stream capture), on the capturing stream. A
        warm-up outside capture picks the out= form that this torch accepts and checks it against
        torch.nn.functional.gelu. F.gelu itself allocates its result: scripts/bench_elementwise.py
        times it, and torch.compile, in torch's own CUDA graphs."""
        torch = torch_cuda()
        if torch is None:
            return None
        approximate = problem["approximate"]
        gelu_into = torch_gelu_out(torch, problem.dtype, approximate)
        return torch_stream_peer(f"torch gelu (approximate={approximate!r}, out=)",
                                 {"x": problem.dtype, "y": problem.dtype}, lambda t: gelu_into(t["x"], t["y"]))

    # --- calls from Python ----------------------------------------------------------------
    def example_call(self, problem: Problem, cupy):
        values = cupy.random.default_rng(0).random(problem["n"], dtype=cupy.float32) * 8 - 4
        x = to_storage(cupy, values, problem.dtype)
        return (x,), {"approximate": problem["approximate"], "out": cupy.empty_like(x)}

    def bind(self, cupy, device: int, args: tuple, kwargs: dict):
        """autogen.gelu(x, approximate="tanh", out=None) -> gelu(x) (x's dtype and shape; any
        contiguous CUDA array of fp32, fp16 or bf16). approximate: "tanh" or "none" (erf)."""
        x, approximate, out = _gelu_arguments(*args, **kwargs)
        xv = ew.flat_operand(cupy, x, "x", self.dtypes, device)
        dtype = dtype_name(xv)
        if out is None:
            out = new_output(cupy, x, tuple(x.shape), dtype)
        outv = ew.flat_operand(cupy, out, "out", (dtype,), device)
        if outv.shape != xv.shape or tuple(out.shape) != tuple(x.shape):
            raise ArgumentError(f"out has shape {tuple(out.shape)}, but x has {tuple(x.shape)}")
        if xv.size == 0:
            raise ArgumentError("x is empty: gelu needs at least one element")
        return self._problem_of(dtype, xv.size, approximate), {"x": xv, "y": outv}, out

    @functools.lru_cache(maxsize=1024)
    def _problem_of(self, dtype: str, n: int, approximate: str) -> Problem:
        # Cached: a dispatched call on a known shape should cost a lookup, not a validation.
        return self.problem(dtype, n=n, approximate=approximate)


def _gelu_arguments(x, approximate="tanh", out=None):
    if not isinstance(approximate, str):
        raise ArgumentError(f"approximate must be 'tanh' or 'none', not {approximate!r}")
    return x, approximate, out


def gelu_inputs(xp, rng, n: int, values: str):
    """float32 inputs of a case: uniform in [-4, 4), or the tails (see TAILS_RANGE)."""
    u = rng.random((n,), dtype=xp.float32)
    if values == "uniform":
        return (u - xp.float32(0.5)) * xp.float32(2 * UNIFORM_RANGE)
    x = (u - xp.float32(0.5)) * xp.float32(2 * TAILS_RANGE)
    far = rng.random((n,), dtype=xp.float32) < xp.float32(FAR_FRACTION)
    low, high = FAR_LOG10
    magnitude = xp.float32(10.0) ** (xp.float32(low) + xp.float32(high - low) * rng.random((n,), dtype=xp.float32))
    return xp.where(far, xp.where(x < 0, -magnitude, magnitude), x).astype(xp.float32)


def gelu_reference(xp, x, approximate: str):
    """GELU of float64 values."""
    return 0.5 * x * (1.0 + _gate(xp, x, approximate))


def gelu_magnitude(xp, x, approximate: str):
    """GELU is the sum of the signed terms 0.5 x and 0.5 x t (t the tanh or erf): the error of a
    correct fp32 or packed-half evaluation follows their magnitudes, 0.5 |x| (1 + |t|), as the
    project measures every sum of signed terms, so an output cancelled to nearly zero in GELU's
    negative tail (-1e-6 at x = -5, beyond fp16 and fp32 resolution there) does not fail a
    correct kernel, while a wrong tail (0, or x) still does."""
    return 0.5 * xp.abs(x) * (1.0 + xp.abs(_gate(xp, x, approximate)))


def _gate(xp, x, approximate: str):
    if approximate == "tanh":
        return xp.tanh(SQRT_2_OVER_PI * (x + KAPPA * x * x * x))
    return ew.erf64(xp, x * (1.0 / math.sqrt(2.0)))


def float_literal(value: float) -> str:
    """A C float literal of value rounded to fp32, exactly (9 significant digits round-trip)."""
    return f"{float(np.float32(value)):.9e}f"


def pack_constants(dtype: str) -> dict:
    """The kernels' constants as C literals. fp32 (every dtype): c0, c1, the tanh form's exponent
    x (c0 + c1 x^2) in base 2 (-2 log2(e) sqrt(2/pi) and that times 0.044715); q0..q2, the
    logistic erf's exponent coefficients (-log2(e) LOGISTIC_P). Packed halves (fp16, bf16): k0 =
    sqrt(2/pi), k0k1 = sqrt(2/pi) * 0.044715, half = 0.5 as two copies of the dtype's bit pattern
    in one word (hex)."""
    constants = {"c0": float_literal(-2.0 * LOG2E * SQRT_2_OVER_PI),
                 "c1": float_literal(-2.0 * LOG2E * SQRT_2_OVER_PI * KAPPA)}
    constants.update({f"q{k}": float_literal(-LOG2E * c) for k, c in enumerate(LOGISTIC_P)})
    if dtype not in ew.HALF_TYPES:
        return constants
    values = np.array([SQRT_2_OVER_PI, SQRT_2_OVER_PI * KAPPA, 0.5], dtype=np.float32)
    bits = to_storage(np, values, dtype).view(np.uint16).astype(np.uint32)
    words = (bits << 16) | bits
    constants.update({name: f"0x{int(w):08x}" for name, w in zip(("k0", "k0k1", "half"), words)})
    return constants


def torch_gelu_out(torch, dtype: str, approximate: str):
    """torch's gelu writing into a given tensor, checked against F.gelu (and its kernel loaded)
    outside capture: torch._C._nn.gelu(x, approximate=, out=), else aten::gelu.out."""
    sample = (torch.rand(4099, device="cuda") * 8 - 4).to(getattr(torch, dtype))
    out = torch.empty_like(sample)
    candidates = (
        ("torch._C._nn.gelu(out=)", lambda x, y: torch._C._nn.gelu(x, approximate=approximate, out=y)),
        ("aten.gelu.out", lambda x, y: torch.ops.aten.gelu.out(x, approximate=approximate, out=y)),
    )
    expected = torch.nn.functional.gelu(sample, approximate=approximate).float()
    failures = []
    for label, call in candidates:
        try:
            call(sample, out)
            torch.cuda.synchronize()
        except (TypeError, RuntimeError, AttributeError) as exc:
            failures.append(f"{label}: {exc}")
            continue
        if torch.allclose(out.float(), expected, rtol=1e-2, atol=1e-2):
            return call
        failures.append(f"{label}: differs from torch.nn.functional.gelu")
    raise RuntimeError("torch offers no gelu with out=: " + "; ".join(failures))

