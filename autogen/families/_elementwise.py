"""What the elementwise families (gelu, bias_mask_scale_add) share: the search space, the launch
geometry, per-dtype tolerances and the float64 erf. Registers no family (a private module).

Geometry. A thread handles `elements_per_thread` (EPT) elements per step, as EPT / vector_width
packs of vector_width elements, consecutive threads on consecutive packs (each of its loads
coalesced across the warp). A block covers block_size * EPT elements per step. one_pass: the grid
covers n in one step, ceil(n / (block_size * EPT)) blocks. grid_stride: at most one wave of
resident blocks, each thread striding over the rest. The scalar path (taken where a pointer is not
aligned to the pack) covers the same elements with EPT single-element loads per thread and step,
so the grid is the same for both paths.
"""

from __future__ import annotations

import functools
import math
import sys

import numpy as np

from ..family import device_array
from ..problem import Config, Problem
from ..gpu import resident_capacity
from ..space import Param, Space

# Relative L2 error allowed per dtype (against the float64 result of the inputs as stored).
# float32: the kernels compute in fp32 (accurate erff, __expf with one division for the tanh
# form): ~1e-7. float16: rounding the output alone gives ~2e-4 (2^-11 relative at most per
# element); fp16x2 arithmetic with tanh.approx.f16x2 ~3e-4 (simulated): 1e-3 leaves 3x. bfloat16:
# rounding the output gives ~1.3e-3 to 1.8e-3 over many elements (2^-8 at most per element), bf16x2
# arithmetic ~1.9e-3 (the scale rounded to bf16 included); but on one element (n = 1) the several
# bf16 roundings of the packed path reached 5.6e-3 on the H200, so 1e-2 (the bound METHOD.md gives
# for bf16 operands). A wrong bias index, mask or tail is an error of order 1.
TOLERANCES = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 1e-2}
DTYPES = ("float32", "float16", "bfloat16")

HALF_TYPES = ("float16", "bfloat16")
_BOOL = np.dtype(np.bool_)


def _packs_in_flight(p) -> str | None:
    ept, vw = p["elements_per_thread"], p["vector_width"]
    if ept % vw:
        return f"elements_per_thread={ept} is not a multiple of vector_width={vw}"
    if ept // vw > 4:
        return f"elements_per_thread={ept} is {ept // vw} packs of {vw}: more than 4 loads in flight per input"
    return None


def make_space(max_ept: int, extra: tuple[Param, ...] = ()) -> Space:
    """The parameters of both families (and a family's `extra` ones, last); `max_ept` bounds the
    elements a thread holds per step (the kernels get up to 64 registers:
    __launch_bounds__(block, 1024 / block); the scalar path holds elements_per_thread loads in
    flight, each with its own address)."""
    return Space(
        params=(
            Param("vector_width", (1, 2, 4, 8), "vw",
                  "elements per access: 16-byte accesses at 4 (fp32) or 8 (fp16, bf16); fp32 at 8 is two"),
            Param("elements_per_thread", tuple(e for e in (1, 2, 4, 8, 16) if e <= max_ept), "ept",
                  "elements per thread and step: elements_per_thread / vector_width loads in flight per input"),
            Param("block_size", (128, 256, 512, 1024), "bs", "threads per block"),
            Param("loop", ("grid_stride", "one_pass"), "l",
                  "one wave of resident blocks striding over n, or one block per block_size * ept elements"),
            Param("math", ("float", "half2"), "m",
                  "half types: arithmetic in fp32, or two halves per instruction (fp16x2 / bf16x2)"),
            *extra,
            Param("cache", ("ldg", "stream", "last"), "c",
                  "loads through the read-only path and plain stores; streaming (ld.global.cs.nc, "
                  "st.global.cs: evict-first, for data touched once); or last: loads with an L1 and L2 "
                  "evict_last policy and plain stores, as Inductor's pointwise kernels"),
        ),
        constraints=(_packs_in_flight,),
    )


DEFAULT_PARAMS = {"vector_width": 8, "elements_per_thread": 8, "block_size": 256, "loop": "grid_stride",
                  "math": "float", "cache": "ldg"}


SEEDS = 4  # seed configs per problem at most (each is a measured trial of the budget)


def seed_params(problem: Problem, max_ept: int, packed: bool, earlier: tuple[dict, ...] = ()) -> list[dict]:
    """Points a search measures first, best first, before the family adds its own parameters and
    drops what its pruning rejects: what a vendor's vectorised elementwise kernel does (torch's
    vectorized_elementwise_kernel: 128-thread blocks, one 16-byte pack per thread, one pass, so
    small n still spreads over every SM), two 16-byte packs per thread in 256-thread blocks for
    the large sizes, with and without the streaming hints; then `earlier` (the family's previous
    H200 winners). `packed`: half2 arithmetic where the problem allows it."""
    wide = 8 if problem.dtype in HALF_TYPES else 4  # elements in 16 bytes
    math_ = "half2" if packed else "float"
    base = {"loop": "one_pass", "math": math_, "cache": "ldg"}
    one = {**base, "vector_width": wide, "elements_per_thread": wide}
    two = {**base, "vector_width": wide, "elements_per_thread": min(2 * wide, max_ept)}
    if problem["n"] <= 2**22:
        seeds = [{**one, "block_size": 128}, {**two, "block_size": 128}]
    else:
        seeds = [{**one, "block_size": 128}, {**two, "block_size": 256}, {**two, "block_size": 256, "cache": "stream"}]
    seeds += [dict(e) for e in earlier]
    unique = []
    for params in seeds:
        if params not in unique:
            unique.append(params)
    return unique


def fitting_seeds(family, problem: Problem, candidates) -> list[Config]:
    """The first SEEDS of `candidates` (params dicts) that are valid and not pruned for
    `problem`, without repeats; the family's default config where none is."""
    found: list[Config] = []
    for params in candidates:
        if family.space.violations(params):
            continue
        config = family.space.check(params)
        if config not in found and family.reject_reason(problem, config) is None:
            found.append(config)
    return found[:SEEDS] or [family.default_config(problem)]


def grid_blocks(n: int, config: Config) -> int:
    """The blocks of one launch; the host launchers compute the same (elementwise.cuh.j2)."""
    block, ept = config["block_size"], config["elements_per_thread"]
    wanted = -(-n // (block * ept))
    if config["loop"] == "one_pass":
        return wanted
    sm_count, threads_per_sm = resident_capacity()
    return max(1, min(wanted, sm_count * max(1, threads_per_sm // block)))


def reject_reason(problem: Problem, config: Config) -> str | None:
    """Shape- and dtype-based pruning shared by both families (see their own additions)."""
    n = problem["n"]
    if config["math"] == "half2" and problem.dtype not in HALF_TYPES:
        return "math=half2 applies to fp16 and bf16 only (fp32 variants render the same code)"
    if config["vector_width"] > 1 and config["vector_width"] > n:
        return f"vector_width={config['vector_width']} exceeds n={n}: every element takes the scalar path"
    per_block = config["block_size"] * config["elements_per_thread"]
    if config["block_size"] > 128 and per_block > 2 * n:
        return f"block_size*elements_per_thread={per_block} covers over twice n={n}"
    if config["loop"] == "grid_stride" and grid_blocks(n, config) == -(-n // per_block):
        return "the grid covers n in one step: grid_stride is the same launch as one_pass"
    return None


def tolerance(problem: Problem) -> float:
    return TOLERANCES[problem.dtype]


def offset_view(xp, array, offset: int):
    """`array` copied into a buffer `offset` elements longer and returned as the view past them:
    the data start off the 16-byte alignment of allocations (for offset 1), so vector paths must
    fall back to their scalar path."""
    if not offset:
        return array
    buffer = xp.empty((array.size + offset,), dtype=array.dtype)
    view = buffer[offset:]
    view[...] = array
    return view


# -- float64 erf for the references (NumPy has none; SciPy is not a dependency) ------------------

_erf_numpy = np.frompyfunc(math.erf, 1, 1)


@functools.lru_cache(maxsize=1)
def _erf_kernel(cupy):
    # CUDA's double-precision erf (at most 2 ulp), as an elementwise kernel.
    return cupy.ElementwiseKernel("float64 x", "float64 y", "y = erf(x)", "autogen_reference_erf64")


def erf64(xp, values):
    """erf of float64 values, with NumPy (math.erf per element) or CuPy (CUDA's erf)."""
    if xp is np:
        return _erf_numpy(values).astype(np.float64) if values.size else values.astype(np.float64)
    return _erf_kernel(xp)(values)


# -- operands of the Python calls -----------------------------------------------------------------

def flat_operand(cupy, obj, name: str, dtypes: tuple[str, ...], device: int, bool_as_uint8: bool = False):
    """A 1-D CuPy view of a contiguous CUDA array of any rank (checked by family.device_array:
    dtype, layout, device). A torch bfloat16 tensor is handed over as its uint16 bit patterns
    here (torch's __cuda_array_interface__ has no bfloat16); with bool_as_uint8, a bool array as
    its bytes (0 or 1)."""
    if type(obj) is cupy.ndarray:  # the common case: no torch checks, no view when already flat
        if bool_as_uint8 and obj.dtype is _BOOL:
            obj = obj.view(cupy.uint8)
        array = device_array(cupy, obj, name, dtypes, obj.ndim, device)
        return array if array.ndim == 1 else array.reshape(-1)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        if obj.dtype == torch.bfloat16:
            obj = obj.view(torch.uint16)
        elif bool_as_uint8 and obj.dtype == torch.bool:
            obj = obj.view(torch.uint8)
    elif bool_as_uint8 and type(obj) is cupy.ndarray and obj.dtype == cupy.bool_:
        obj = obj.view(cupy.uint8)
    shape = getattr(obj, "shape", None)
    ndim = len(shape) if shape is not None else 1
    array = device_array(cupy, obj, name, dtypes, ndim, device)
    return array.reshape(-1)
