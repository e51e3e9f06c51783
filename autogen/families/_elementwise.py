"""What the elementwise families (gelu, bias_mask_scale_add) share: the search space, the launch
geometry, per-dtype tolerances and the float64 erf. Registers no family (a private module).

Geometry. A thread handles `elements_per_thread` (EPT) elements per step, as EPT / vector_width
packs of vector_width elements, consecutive threads on consecutive packs (each of its loads
coalesced across the warp). A block covers block_size * EPT elements per step. one_pass: the grid
covers n in one step, ceil(n / (block_size * EPT)) blocks. grid_stride: at most one wave of
resident blocks, each thread striding over the rest. bulk (sm_90): a persistent grid of the
blocks that fit at once, each pipelining chunks of block_size * EPT elements through
shared-memory stages filled by the bulk copy engine and written back by bulk stores
(elementwise.cuh.j2: bulk_sweep); a family names the bytes it stages per element. The scalar
path (taken where a pointer is not aligned to the pack) covers the same elements with EPT
single-element loads per thread and step, so the grid is the same for both paths.
"""

from __future__ import annotations

import functools
import math
import sys

import numpy as np

from autogen.core.operands import device_array
from autogen.core.problem import Config, Problem
from autogen.core.space import Param, Space
from autogen.gpu.device import (compute_capability, FALLBACK_SHARED_PER_SM, FALLBACK_SHARED_RESERVED,
                                resident_capacity, shared_capacity)

# Relative L2 error allowed per dtype (against the float64 result of the inputs as stored).
# float32: the kernels compute in fp32 (accurate erff, __expf with one division for the tanh
# form): ~1e-7. float16: rounding the output alone gives ~2e-4 (2^-11 relative at most per
# element); fp16x2 arithmetic with tanh.approx.f16x2 ~3e-4 (simulated): 1e-3 leaves 3x. bfloat16:
# rounding the output gives ~1.3e-3 to 1.8e-3 over many elements (2^-8 at most per element), bf16x2
# arithmetic ~1.9e-3 (the scale rounded to bf16 included); but on one element (n = 1) the several
# bf16 roundings of the packed path reached 5.6e-3 on the GPU, so 1e-2 (the bound METHOD.md gives
# for bf16 operands). A wrong bias index, mask or tail is an error of order 1. Outputs below the
# half type's smallest normal round to more than 2^-11 / 2^-8: validation adds that rounding of
# the reference on top (measure.judge).
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


def _bulk_moves_no_cache_hint(p) -> str | None:
    if p["loop"] == "bulk" and p["cache"] != "ldg":
        return "loop=bulk moves data by bulk copies and shared memory: the cache choice changes nothing (ldg only)"
    return None


# loop=bulk: a block's stages live in static shared memory (48 KB at most), beside one 8-byte
# mbarrier per stage that BulkShared pads to its 128-byte alignment.
BULK_SHARED_BUDGET = 48 * 1024 - 128
MAX_STAGES = 4


def bulk_stages(config: Config, staged_bytes: int) -> int:
    """Stages of the bulk pipeline: as many chunks (block_size * ept elements of every staged
    input, `staged_bytes` per element) as fit the budget, at most MAX_STAGES; under 2 the config
    cannot run (reject_reason)."""
    chunk_bytes = config["block_size"] * config["elements_per_thread"] * staged_bytes
    return min(MAX_STAGES, BULK_SHARED_BUDGET // chunk_bytes)


def bulk_shared_bytes(config: Config, staged_bytes: int) -> int:
    """sizeof(BulkShared): the stages, then the barriers padded to 128 bytes."""
    return bulk_stages(config, staged_bytes) * config["block_size"] * config["elements_per_thread"] * staged_bytes + 128


# The persistent grid counts on its blocks being resident together, so the kernel's launch bounds
# promise the registers for as many as the shared memory lets an sm_90 SM hold (the H100's and
# H200's 228 KB, gpu.FALLBACK_SHARED_PER_SM), up to 1536 threads (about 40 registers a thread;
# more would spill). grid_blocks sizes the grid from the device's own figures, capped by the same
# promise.
BULK_MAX_THREADS_PER_SM = 1536


def bulk_blocks_per_sm(config: Config, staged_bytes: int, shared_per_sm: int = FALLBACK_SHARED_PER_SM,
                       reserved: int = FALLBACK_SHARED_RESERVED) -> int:
    """Blocks of a bulk variant resident on one SM: its stages (rounded up to the runtime's 1 KB
    units, plus the per-block reservation) in `shared_per_sm`, and BULK_MAX_THREADS_PER_SM."""
    per_block = -(-bulk_shared_bytes(config, staged_bytes) // 1024) * 1024 + reserved
    return max(1, min(shared_per_sm // per_block, BULK_MAX_THREADS_PER_SM // config["block_size"]))


def runs_bulk_pipeline(config: Config, staged_bytes: int) -> bool:
    """Whether the variant runs the bulk pipeline: loop=bulk with two stages or more. A bulk
    config whose stages do not fit renders (and launches) the grid_stride sweep it falls back
    to; reject_reason keeps it out of searches."""
    return config["loop"] == "bulk" and bulk_stages(config, staged_bytes) >= 2


def bulk_template_vars(config: Config, staged_bytes: int) -> dict:
    """What the templates need beyond the config: `bulk` (runs_bulk_pipeline), and for the pipeline
    its stage count and the blocks per SM its launch bounds promise."""
    if not runs_bulk_pipeline(config, staged_bytes):
        return {"bulk": False}
    return {"bulk": True, "bulk_stages": bulk_stages(config, staged_bytes),
            "bulk_blocks_per_sm": bulk_blocks_per_sm(config, staged_bytes)}


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
            Param("loop", ("grid_stride", "one_pass", "bulk"), "l",
                  "one wave of resident blocks striding over n, one block per block_size * ept elements, or "
                  "bulk (sm_90): resident blocks pipelining chunks of block_size * ept elements through shared "
                  "memory with the bulk copy engine (cp.async.bulk loads and stores)"),
            Param("math", ("float", "half2"), "m",
                  "half types: arithmetic in fp32, or two halves per instruction (fp16x2 / bf16x2)"),
            *extra,
            # No streaming (evict-first, .cs) policy: it was never ahead in torch's graphs and lost
            # there where the tuner's timing saw a tie (docs/families/elementwise.md).
            Param("cache", ("ldg", "last"), "c",
                  "loads through the read-only path and plain stores; or last: loads with an L1 and L2 "
                  "evict_last policy and plain stores, as Inductor's pointwise kernels"),
        ),
        constraints=(_packs_in_flight, _bulk_moves_no_cache_hint),
    )


DEFAULT_PARAMS = {"vector_width": 8, "elements_per_thread": 8, "block_size": 256, "loop": "grid_stride",
                  "math": "float", "cache": "ldg"}


SEEDS = 4  # seed configs per problem at most (each is a measured trial of the budget)


# loop=bulk is seeded where the staged inputs hold about what the bulk copies of every resident
# block keep in flight (gelu fp16 / bf16 at n = 2^24, 32 MiB staged, where it beat the best
# sweeps); it lost at 2^20 and 2^28 and with 64 MiB of fp32 (docs/families/elementwise.md).
BULK_SEED_BYTES = (8 << 20, 48 << 20)


def seed_params(problem: Problem, max_ept: int, packed: bool, staged_bytes: int,
                family_points: tuple[dict, ...] = ()) -> list[dict]:
    """Points a search measures first, best first, before the family adds its own parameters and
    drops what its pruning rejects: what a vendor's vectorised elementwise kernel does (torch's
    vectorized_elementwise_kernel: 128-thread blocks, one 16-byte pack per thread, one pass, so
    small n still spreads over every SM), two 16-byte packs per thread in 256-thread blocks for
    the large sizes (through the bulk pipeline where the staged inputs, `staged_bytes` per
    element, are within BULK_SEED_BYTES), 16 bytes a thread in 512 threads up to 2^26 (up to 2^22
    as four evict_last accesses for 4-byte elements) and evict_last loads beyond; then
    `family_points` (the family's own: its previous H200 winners, a peer's layout). `packed`:
    half2 arithmetic where the problem allows it."""
    wide = 8 if problem.dtype in HALF_TYPES else 4  # elements in 16 bytes
    math_ = "half2" if packed else "float"
    base = {"loop": "one_pass", "math": math_, "cache": "ldg"}
    one = {**base, "vector_width": wide, "elements_per_thread": wide}
    two = {**base, "vector_width": wide, "elements_per_thread": min(2 * wide, max_ept)}
    if problem["n"] <= 2**22:
        # The third: 16 bytes a thread in 512-thread blocks; for 4-byte elements as four single
        # accesses with evict_last. With the results recycled (in L2) these were among the best
        # gelu 2^20 variants in torch's graphs, ahead of the first two seeds (fp16 / bf16: plain
        # loads, evict_last behind there; docs/families/elementwise.md, "Timing with recycled results").
        third = {**one, "block_size": 512}
        if wide == 4:
            third.update(vector_width=1, cache="last")
        seeds = [{**one, "block_size": 128}, {**two, "block_size": 128}, third]
    elif problem["n"] <= 2**26:
        # The third: one pack per thread in 512-thread blocks, the best fp32 sweep at 2^24 in
        # torch's graphs (docs/history/sessions.md, twelfth session).
        seeds = [{**one, "block_size": 128}, {**two, "block_size": 256}, {**one, "block_size": 512}]
    else:
        # The third with Inductor's evict_last loads, ahead at 2^28 in both timings
        # (docs/families/elementwise.md).
        seeds = [{**one, "block_size": 128}, {**two, "block_size": 256}, {**two, "block_size": 256, "cache": "last"}]
    if BULK_SEED_BYTES[0] <= problem["n"] * staged_bytes <= BULK_SEED_BYTES[1]:
        seeds.insert(1, {**two, "block_size": 256, "loop": "bulk"})
    seeds += [dict(e) for e in family_points]
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


def grid_blocks(n: int, config: Config, staged_bytes: int) -> int:
    """The blocks of one launch; the host launchers compute the same (elementwise.cuh.j2).
    `staged_bytes`: what loop=bulk stages per element (the family's streamed inputs)."""
    block, ept = config["block_size"], config["elements_per_thread"]
    wanted = -(-n // (block * ept))
    if config["loop"] == "one_pass":
        return wanted
    sm_count, threads_per_sm = resident_capacity()
    per_sm = max(1, threads_per_sm // block)
    if runs_bulk_pipeline(config, staged_bytes):
        # Persistent: at most one block per whole chunk, and the blocks resident at once (see
        # bulk_blocks_per_sm: this device's shared memory, within the launch bounds' promise).
        wanted = max(1, n // (block * ept))
        here = bulk_blocks_per_sm(config, staged_bytes, *shared_capacity())
        per_sm = max(1, min(per_sm, here, bulk_blocks_per_sm(config, staged_bytes)))
    return max(1, min(wanted, sm_count * per_sm))


def reject_reason(problem: Problem, config: Config, staged_bytes: int) -> str | None:
    """Shape- and dtype-based pruning shared by both families (see their own additions);
    `staged_bytes` as for grid_blocks."""
    n = problem["n"]
    if config["math"] == "half2" and problem.dtype not in HALF_TYPES:
        return "math=half2 applies to fp16 and bf16 only (fp32 variants render the same code)"
    if config["vector_width"] > 1 and config["vector_width"] > n:
        return f"vector_width={config['vector_width']} exceeds n={n}: every element takes the scalar path"
    per_block = config["block_size"] * config["elements_per_thread"]
    if config["block_size"] > 128 and per_block > 2 * n:
        return f"block_size*elements_per_thread={per_block} covers over twice n={n}"
    if config["loop"] == "grid_stride" and grid_blocks(n, config, staged_bytes) == -(-n // per_block):
        return "the grid covers n in one step: grid_stride is the same launch as one_pass"
    if config["loop"] == "bulk":
        return _bulk_reject_reason(n, config, staged_bytes)
    return None


def _bulk_reject_reason(n: int, config: Config, staged_bytes: int) -> str | None:
    chunk = config["block_size"] * config["elements_per_thread"]
    if compute_capability() < (9, 0):
        return "loop=bulk needs the bulk copy engine (sm_90 or newer)"
    if bulk_stages(config, staged_bytes) < 2:
        return (f"loop=bulk: a chunk of {chunk} elements stages {chunk * staged_bytes} bytes, and two stages "
                "exceed 48 KB of shared memory")
    if n < chunk:
        return f"loop=bulk: n={n} is under one chunk of block_size*elements_per_thread={chunk}: no element is staged"
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
