"""HGEMV: y = alpha * A x + beta * y for LLM decode. A (m x n) row-major in float16 or bfloat16,
x holding `batch` vectors (n x batch row-major, or a vector of n when batch = 1), fp32
accumulation, y (m x batch, or m) in A's dtype. Template: templates/hgemv/kernel.cu.j2.

The geometry (row groups of threads_per_row lanes, rows_per_group rows each, warps_per_block
warps) and the pruning of row groups that overshoot short rows are sgemv's, imported from there.
A launch computes `batch_tile` vectors from one read of the weights (each weight a thread loads
feeds batch_tile dot products from its registers); a batch larger than the tile takes
ceil(batch / batch_tile) launches, so every batch >= 1 is served, and the search only times the
tile that covers the batch in one launch.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from autogen.core.dtypes import DTYPES, to_float64, to_storage
from autogen.errors import ArgumentError
from autogen.gpu.device import sm_count
from autogen.core.problem import Config, Problem
from autogen.core.space import Param, Space
from autogen.core.family import Family, Launch, Peer, Step
from autogen.core.operands import device_array, dtype_name, kernel_scalar, new_output, random_uniform
from autogen.core.registry import register
from autogen.families.sgemv import (
    _reduce_only_across_warps,
    _row_fits_block,
    overshoot_reason,
    rows_per_block,
)

MAX_TILE = 8  # the largest batch_tile: LLM decode batches of 1 to 8 take one launch

# Relative L2 error allowed, against the float64 product of the values the kernel reads (the
# inputs as stored), relative to ||reference_magnitude|| = || |y| + GUARD * (|alpha| |A| |x| +
# |beta| |y_in|) ||. With fp32 accumulation the error is the final rounding of y to the dtype:
# at most 2^-11 (fp16, 11 significant bits) or 2^-8 (bf16, 8 significant bits) of each element, so at
# most that relative to ||y|| even if every element rounds its worst; the fp32 sums add
# ~6e-8 * sqrt(n) of the sum of |terms|. Each tolerance is twice the rounding bound: a dropped,
# doubled or misplaced pack moves the result by far more, and half-precision accumulation either
# overflows (the "large" case) or errs by many roundings.
TOLERANCES = {"float16": 1e-3, "bfloat16": 8e-3}
# The denominator is ||y|| itself, not the sum of |terms| as sgemv's: with n = 4096 that sum is
# ~50x larger than a random-sign dot product, and would hide a dropped pack of 8 columns. The small
# GUARD share of it only matters where y cancels to almost nothing (tiny n): there it bounds the
# fp32 rounding (6e-8 of the terms) and fp16's subnormal spacing at well under the tolerance.
GUARD = 2.0**-12
# Below the dtype's smallest normal number, y is stored with a fixed spacing (fp16: 2^-24), not
# 11 significant bits: a correctly rounded output of 2.4e-5 (1 x 1, the product of two small
# inputs) is off by 1.26e-3 of itself. Each element's magnitude therefore counts
# at least the smallest normal (its rounding error is then at most 2^-11 of its magnitude). At
# |y| ~ 0.1 and above, where the checks catch a dropped or doubled pack, this adds under 0.1%.
SMALLEST_NORMAL = {"float16": 2.0**-14, "bfloat16": 2.0**-126}

# The "large" case: A and x uniform in [LARGE_LOW, LARGE_HIGH), all positive, so a single
# product fits fp16 (240^2 = 57600 < 65504) but any four summed do not (4 * 128^2 = 65536): a
# kernel accumulating in half precision returns inf once n >= 4. alpha = 2^-ceil(log2 n) keeps
# y = alpha * sum below 57600, finite in fp16, and scales exactly.
LARGE_LOW, LARGE_HIGH = 128.0, 240.0

X_TILE_BYTES = 32 * 1024  # x_path=smem stages tpr*pw*u columns x batch_tile floats; at most this


def _x_tile_fits(p) -> str | None:
    columns = p["threads_per_row"] * p["pack_width"] * p["unroll"]
    if p["x_path"] == "smem" and 4 * columns * p["batch_tile"] > X_TILE_BYTES:
        return (f"x_path=smem stages {columns} columns x batch_tile={p['batch_tile']} floats, over "
                f"{X_TILE_BYTES // 1024} KiB of shared memory")
    return None


def _mma_shape(p) -> str | None:
    # x_path=mma: each lane loads 8 halves (128 bits) of two rows per 16-row tile, a warp covers
    # 32 columns of a row tile, a row group is one or more whole warps, and its cross-warp sum
    # has one form (shared memory), so reduce=smem would duplicate reduce=shfl.
    if p["x_path"] != "mma":
        return None
    if p["pack_width"] != 8:
        return "x_path=mma loads A fragments 8 halves at a time: pack_width=8 only"
    if p["threads_per_row"] < 32:
        return "x_path=mma needs whole warps per row tile: threads_per_row >= 32"
    if p["reduce"] != "shfl":
        return "x_path=mma has one cross-warp sum: reduce=shfl only"
    if p["rows_per_group"] > 2:
        return "x_path=mma: rows_per_group <= 2 (a 64-row tile spills registers on sm_90)"
    return None


def _values_fit_registers(p) -> str | None:
    # Weights in flight per thread (rows_per_group * unroll packs) and accumulators
    # (rows_per_group * batch_tile) must leave room for a pack's x values (pack_width *
    # batch_tile floats): bounds checked with nvcc -Xptxas -v on the extreme configs (no spills).
    in_flight = p["rows_per_group"] * p["unroll"] * p["pack_width"]
    if in_flight > 32:
        return f"rows_per_group*unroll*pack_width={in_flight} weights in flight per thread exceeds 32"
    # x_path=mma keeps 4 accumulators per 16-row tile whatever the batch tile (the tensor core
    # multiplies all 8 vectors), and its x fragment is 4 registers per unrolled step.
    if p["x_path"] != "mma" and p["rows_per_group"] * p["batch_tile"] > 16:
        return f"rows_per_group*batch_tile={p['rows_per_group'] * p['batch_tile']} accumulators exceeds 16"
    return None


def _schedule_has_steps(p) -> str | None:
    # With one step per chunk both schedules are the same code; x_path=mma keeps its own schedule
    # (A's chunk, then the next chunk's x, then the tensor-core steps). Step by step was faster for
    # some configs and shapes and slower for others, so the search chooses it per shape
    # (docs/families/hgemv.md, "Why the schedule is a parameter").
    if p["load_schedule"] == "step" and (p["unroll"] == 1 or p["x_path"] == "mma"):
        return "load_schedule=step needs unroll >= 2 and x_path ldg or smem"
    return None


def _tail_peels_one_vector(p) -> str | None:
    # The unchecked loop reads x's packs straight from global memory; x_path=smem stages x per
    # chunk behind barriers and x_path=mma has its own loop. With 2-8 vectors per launch ptxas
    # gave the peeled kernel up to twice its checked twin's registers, and 3 of 59 sampled spilled
    # (nvcc 13.0, sm_90); with one, 80 at most and none spilled. Batches are the tensor cores' anyway.
    if p["tail"] == "peeled" and (p["x_path"] != "ldg" or p["batch_tile"] != 1):
        return "tail=peeled needs x_path=ldg and batch_tile=1"
    return None


def _peeled_rows_stage_x(p) -> str | None:
    # row_align=peeled shifts x by the block's head as it stages it in shared memory (x_path=smem,
    # and mma's B tile); through the read-only path each x pack would be misaligned instead.
    if p["row_align"] == "peeled" and p["x_path"] == "ldg":
        return "row_align=peeled needs x_path smem or mma (x staged from the rows' first pack boundary)"
    return None


def _split_on_tensor_cores(p) -> str | None:
    # The column split combines the cluster's partial sums of mma tiles (4 accumulators a lane);
    # the CUDA-core forms keep rows_per_group * batch_tile of them and a row of lanes per group.
    if p["split_k"] == 1:
        return None
    if p["x_path"] != "mma":
        return "split_k > 1 needs x_path=mma (partial sums of tensor-core tiles combined in the cluster)"
    # With several row groups a block already shares its columns among fewer tiles; the split is
    # for blocks of one group, whose tiles are few (the space stays small: 3 x 100 variants).
    if p["threads_per_row"] != 32 * p["warps_per_block"]:
        return "split_k > 1 needs one row group per block: threads_per_row = 32 * warps_per_block"
    return None


SPACE = Space(
    params=(
        Param("threads_per_row", (4, 8, 16, 32, 64, 128, 256), "tpr",
              "threads cooperating on one row: <32 packs several rows in a warp, >32 spans warps"),
        Param("pack_width", (2, 4, 8), "pw",
              "halves per load of A: 2 (32-bit, half2), 4 (64-bit) or 8 (128-bit accesses)"),
        Param("warps_per_block", (1, 2, 4, 8), "wpb",
              "block size in warps; rows per block = 32 * wpb / tpr * rpg"),
        Param("rows_per_group", (1, 2, 4), "rpg", "rows each thread group computes, sharing each x load"),
        Param("unroll", (1, 2, 4), "u", "packs of A in flight per thread and row"),
        Param("x_path", ("ldg", "smem", "mma"), "x",
              "x through the read-only cache (converted per use), staged in shared memory as fp32 once per "
              "block, or mma: tensor cores (mma.sync m16n8k16, fp32 accumulation), a row group of warps "
              "computes 16*rows_per_group rows x 8 vectors, x staged per chunk in shared memory as the B fragment"),
        Param("reduce", ("shfl", "smem"), "r", "cross-warp reduction: shuffles or a shared-memory tree"),
        Param("batch_tile", (1, 2, 4, 8), "bt",
              "vectors per launch: each loaded weight feeds batch_tile dot products from registers"),
        Param("load_schedule", ("chunk", "step"), "ls",
              "when A's packs are requested: all of a chunk before its first multiply-add, or each unrolled "
              "step's just before its own (ptxas then interleaves them with the arithmetic)",
              added_with_default="chunk"),
        Param("tail", ("checked", "peeled"), "tail",
              "checked: every chunk tests its packs against n and the alignment of A and x; peeled: whole "
              "chunks of an aligned problem run without those tests, only the last partial chunk (and every "
              "chunk of an unaligned problem) in the checked loop",
              added_with_default="checked"),
        Param("row_align", ("scalar", "peeled"), "ra",
              "rows not starting on a pack boundary (n % pack != 0, or A's base): scalar reads them element "
              "by element; peeled reads each row's head element by element and the rest in whole packs, a block "
              "taking rows of one offset from the boundary (rows a pack apart), x staged shifted by it",
              added_with_default="scalar"),
        Param("split_k", (1, 2, 4, 8), "sk",
              "blocks per block of row tiles, each taking every split_k-th chunk of the columns: a thread-block "
              "cluster whose first block adds the others' partial sums from their shared memory and stores y "
              "(sm_90 and newer; before it the first block takes every column). x_path=mma only",
              added_with_default=1),
    ),
    constraints=(_row_fits_block, _reduce_only_across_warps, _x_tile_fits, _mma_shape, _values_fit_registers,
                 _schedule_has_steps, _tail_peels_one_vector, _peeled_rows_stage_x, _split_on_tensor_cores),
)


def _peeled_twin(config: Config) -> Config | None:
    """The same config with tail=peeled, where the space allows it (one vector, x_path=ldg): the
    search then times both loops of each seed, whichever the shape's alignment favours."""
    if config["tail"] == "peeled":
        return None
    params = {**config.as_dict(), "tail": "peeled"}
    return None if SPACE.violations(params) else SPACE.check(params)


def _peeled_rows_twin(config: Config) -> Config | None:
    """The same config with row_align=peeled, x staged in shared memory where it went through the
    read-only path: the form that keeps wide loads on rows of n % 8 != 0 columns."""
    if config["row_align"] == "peeled":
        return None
    params = {**config.as_dict(), "row_align": "peeled", "tail": "checked"}
    if params["x_path"] == "ldg":
        params["x_path"] = "smem"
    return None if SPACE.violations(params) else SPACE.check(params)


def alignment_period(problem: Problem, config: Config) -> int:
    """Blocks per window of rows: with row_align=peeled on rows of n % pack != 0 columns, each of a
    window's `pack` blocks takes the rows of one offset from a pack boundary (the template's
    by_class); otherwise 1."""
    if config["row_align"] != "peeled":
        return 1
    pack = 8 if config["x_path"] == "mma" else config["pack_width"]
    return pack if problem["n"] % pack else 1


# A column split pays two cluster barriers and a combine per tile; it is tried where the blocks of
# row tiles leave SMs idle or unevenly loaded: fewer than this many per SM.
SPLIT_BELOW_BLOCKS_PER_SM = 4


def split_reason(problem: Problem, config: Config, row_blocks: int) -> str | None:
    """Why split_k does not fit this problem: the row blocks already fill the GPU, or a block of
    the cluster would get no chunk of the columns."""
    split = config["split_k"]
    if split == 1:
        return None
    enough = SPLIT_BELOW_BLOCKS_PER_SM * sm_count()
    if row_blocks >= enough:
        return f"{row_blocks} blocks of row tiles fill the GPU ({enough} or more) without split_k"
    chunk = config["threads_per_row"] * config["unroll"]  # x_path=mma: columns per chunk
    chunks = -(-problem["n"] // chunk)
    if chunks < split:
        return f"split_k={split} over {chunks} chunks of {chunk} columns leaves a block without one"
    return None


def batch_tile_for(batch: int) -> int:
    """The tile the search times for a batch: the smallest power of two covering it (at most 8),
    so that a batch of up to 8 vectors reads the weights once."""
    return min(MAX_TILE, 1 << max(0, batch - 1).bit_length())


# Extra seeds for one vector on rows of `lo` <= n < `hi` columns: (lo, hi, the params that differ
# from the default). Measured in Hgemv.seed_configs' docstring.
BATCH1_SEEDS = (
    (1024, math.inf, dict(threads_per_row=128, pack_width=8, warps_per_block=4, rows_per_group=2, unroll=2,
                          x_path="ldg", reduce="shfl")),
    (1024, 8192, dict(threads_per_row=256, pack_width=8, warps_per_block=8, rows_per_group=2, unroll=2,
                      x_path="ldg", reduce="shfl", load_schedule="step")),
    (8192, math.inf, dict(threads_per_row=256, pack_width=8, warps_per_block=8, rows_per_group=2, unroll=2,
                          x_path="ldg", reduce="smem")),
)


@register
class Hgemv(Family):
    name = "hgemv"
    api = "hgemv"
    reuse_bound_calls = True  # bind only checks and arranges (autogen.runtime.bound_calls)
    # The template's `pdl` variable (render(..., pdl=True)), as sgemv's: each thread loads its
    # first chunk of A into registers, then griddepcontrol.wait, then reads x (and y).
    pdl_capable = True
    dims = ("m", "n", "batch")
    # Shapes with tails for the export's self-test (Family.tail_shapes).
    tail_shapes = ((1, 1, 1), (1, 3, 2), (3, 1, 8), (3, 3, 3), (1, 4099, 1), (3, 70, 5), (1000, 37, 4), (37, 1000, 8),
                   (4099, 70, 1), (513, 257, 7), (130, 4104, 2), (5, 16, 6), (2, 64, 9))
    dim_defaults = {"batch": 1}  # one vector unless told otherwise (Python call and CLI alike)
    export_names_dtype = True  # autogen_hgemv_f16 and autogen_hgemv_bf16
    example_dims = {"m": 1000, "n": 1000, "batch": 4}  # the shape tests/test_gpu_capture.py calls
    dtypes = ("float16", "bfloat16")
    space = SPACE
    default_params = {"threads_per_row": 32, "pack_width": 8, "warps_per_block": 4, "rows_per_group": 1,
                      "unroll": 2, "x_path": "ldg", "reduce": "shfl", "batch_tile": 1, "load_schedule": "chunk",
                      "tail": "checked", "row_align": "scalar", "split_k": 1}
    outputs = ("y",)
    # A, x and y hold __half (f16 variants) or __nv_bfloat16 (bf16 variants) as the kernel name's
    # dtype tag says; `void*` keeps one signature for both dtypes.
    c_params = "const void* A, const void* x, void* y, int m, int n, int batch, float alpha, float beta"
    tolerance = TOLERANCES["float16"]
    description = ("y = alpha * A x + beta * y, A row-major m x n in fp16 or bf16, x n x batch, "
                   "fp32 accumulation, y m x batch in A's dtype")

    def tolerance_for(self, problem: Problem) -> float:
        return TOLERANCES[problem.dtype]

    def default_config(self, problem: Problem | None = None) -> Config:
        """Untuned, a batch of b vectors is served in one launch: the batch tile that covers it.
        Batch 1 on rows of >= 1024 columns keeps 4 packs per thread in flight (unroll=4: 52
        registers, one wave of 4096 rows on 132 SMs with 62 KiB requested per SM, where unroll=2
        had 31 KiB, short of what HBM3e needs in flight). Batches of 2 and more use the tensor
        cores (x_path=mma): one 16-row tile per row group of warps splitting the columns, 4 steps
        of 32 columns in flight; the CUDA-core form spends 8 FMAs and 8 conversions per weight at
        batch 8 and needed 146-168 registers. On rows of >= 512 columns the group is 8 warps:
        4096 rows are only 256 tiles, and 8 warps per tile were faster there than 4 (level at
        14336 rows; docs/families/hgemv.md, "Defaults")."""
        params = dict(self.default_params)
        if problem is not None:
            params["batch_tile"] = batch_tile_for(problem["batch"])
            # Long rows off the 16-byte boundary: the tensor-core default with row_align=peeled.
            odd = problem["n"] % 8 != 0 and problem["n"] >= 1024
            if problem["batch"] == 1 and problem["n"] >= 1024 and not odd:
                params["unroll"] = 4
            elif problem["batch"] > 1 or odd:
                wide = problem["n"] >= 512
                params.update(x_path="mma", threads_per_row=256 if wide else 128, warps_per_block=8 if wide else 4,
                              rows_per_group=1, unroll=4)
            if params["x_path"] == "mma" and problem["n"] % 8:
                params["row_align"] = "peeled"
        return self.space.check(params)

    def seed_configs(self, problem: Problem) -> list[Config]:
        """The default first. One vector on rows of >= 1024 columns also seeds 4 warps on 2 rows
        each, 16-byte packs, 2 in flight: the H200's best of eleven configs at 11008 x 4096, the
        H100's search winner at 4096 x 14336. On rows of >= 8192 columns, also the long-row
        config: the block's 8 warps on 2 rows at a time, 2 packs in flight, partial sums through
        shared memory, the fastest of eight configs re-timed at 4096 x 11008 in both dtypes. On
        rows of 1024 to 8191 columns, also the block's 8 warps on 2 rows at a time with A
        requested step by step: the fastest of ten configs at 4096 x 4096, 14336 x 4096 and
        32000 x 4096 (as a one-off source edit before load_schedule existed); at 4096 x 14336 it
        lost to the chunk schedule. The figures: docs/families/hgemv.md, "Defaults"."""
        default = self.default_config(problem)
        extra = [params for lo, hi, params in BATCH1_SEEDS if problem["batch"] == 1 and lo <= problem["n"] < hi]
        # (the batch-1 seeds are read-only-path configs: row_align=peeled comes as their twins)
        seeds = [default] + [self.space.check({**default.as_dict(), "row_align": "scalar", **params})
                             for params in extra]
        if problem["n"] % 8:  # rows off the 16-byte boundary: each seed with row_align=peeled too
            seeds += [twin for twin in map(_peeled_rows_twin, seeds) if twin is not None]
        seeds += [twin for twin in (self._split_twin(problem, seed) for seed in seeds) if twin is not None]
        return seeds + [twin for twin in map(_peeled_twin, seeds) if twin is not None]

    def _split_twin(self, problem: Problem, config: Config) -> Config | None:
        """The tensor-core seed split over a cluster of 2 blocks, where the problem's row blocks
        leave the GPU short of blocks (split_reason): at 1000 x 4103 (8 MB) a split of the
        tensor-core configs ran batches 1-8 faster than each unsplit one (docs/families/hgemv.md,
        "The column split")."""
        params = {**config.as_dict(), "split_k": 2}
        if config["split_k"] != 1 or SPACE.violations(params):
            return None
        twin = SPACE.check(params)
        return None if self.reject_reason(problem, twin) else twin

    def seed_from(self, problem: Problem, params: dict) -> dict:
        """Another shape's winner with the batch tile of this batch: a batch-1 winner tried as it
        is on a batch of 4 reads the weights four times, an order of magnitude slower than the
        batch's own best."""
        return {**params, "batch_tile": batch_tile_for(problem["batch"])}

    # --- geometry -------------------------------------------------------------------------
    def rows_per_block(self, config: Config) -> int:
        """sgemv's geometry; with x_path=mma a row group computes 16-row tiles (16 * rows_per_group rows)."""
        return rows_per_block(config) * (16 if config["x_path"] == "mma" else 1)

    def launch(self, problem: Problem, config: Config) -> Launch:
        # A cluster of split_k blocks (consecutive indices) for each block of row tiles.
        blocks = self.row_blocks(problem, config) * config["split_k"]
        return Launch(grid=(blocks, 1, 1), block=(32 * config["warps_per_block"], 1, 1))

    def row_blocks(self, problem: Problem, config: Config) -> int:
        """Blocks of rows_per_block rows covering m: whole windows of blocks, one per row offset
        (alignment_period)."""
        period = alignment_period(problem, config)
        return -(-problem["m"] // (self.rows_per_block(config) * period)) * period

    def tiles(self, problem: Problem, config: Config) -> list[int]:
        """The first vector of each launch."""
        return list(range(0, problem["batch"], config["batch_tile"]))

    def plan(self, problem: Problem, config: Config) -> list[Step]:
        # Shape arguments are built once per plan, not on every dispatched call.
        launch = self.launch(problem, config)
        m, n, batch = (kernel_scalar(problem[d], np.int32) for d in ("m", "n", "batch"))

        def step(j0) -> Step:
            return Step("", launch, lambda inputs: (inputs["A"], inputs["x"], inputs["y"], m, n, batch, j0,
                                                    kernel_scalar(inputs["alpha"]), kernel_scalar(inputs["beta"])))

        return [step(kernel_scalar(j0, np.int32)) for j0 in self.tiles(problem, config)]

    def kernel_args(self, problem: Problem, inputs: dict) -> tuple:
        """The arguments of the first launch (vectors from 0)."""
        return (inputs["A"], inputs["x"], inputs["y"], np.int32(problem["m"]), np.int32(problem["n"]),
                np.int32(problem["batch"]), np.int32(0), np.float32(inputs["alpha"]), np.float32(inputs["beta"]))

    def reject_reason(self, problem: Problem, config: Config) -> str | None:
        if config["x_path"] == "mma":  # a row group of tpr lanes covers tpr columns per step
            reason = overshoot_reason(problem["n"], config["threads_per_row"], 1, config["unroll"], "1 (mma)")
        else:
            reason = overshoot_reason(problem["n"], config["threads_per_row"], config["pack_width"],
                                      config["unroll"], "pack_width")
        if reason:
            return reason
        reason = split_reason(problem, config, self.row_blocks(problem, config))
        if reason:
            return reason
        wanted = batch_tile_for(problem["batch"])
        if config["batch_tile"] != wanted:
            return (f"batch_tile={config['batch_tile']} for batch={problem['batch']}: batch_tile={wanted} "
                    + ("reads the weights once" if problem["batch"] <= MAX_TILE else "reads them fewest times")
                    + (" with fewer idle accumulators" if config["batch_tile"] > wanted else ""))
        return None

    # --- data -----------------------------------------------------------------------------
    def validation_cases(self, problem: Problem) -> list[dict]:
        # beta = 0 with y poisoned: every output written and y never read. beta != 0: y honoured.
        # large: half-precision accumulation would overflow (see LARGE_LOW).
        large_alpha = 2.0 ** -math.ceil(math.log2(problem["n"]))
        return [{"alpha": 1.5, "beta": 0.0, "values": "uniform"},
                {"alpha": -0.75, "beta": 1.25, "values": "uniform"},
                {"alpha": large_alpha, "beta": 0.0, "values": "large"}]

    def timing_case(self, problem: Problem) -> dict:
        return {"alpha": 1.0, "beta": 0.0, "values": "uniform"}

    def shapes(self, problem: Problem) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """The shapes of A, x and y: x and y are vectors when batch = 1."""
        m, n, b = problem["m"], problem["n"], problem["batch"]
        return (m, n), ((n,) if b == 1 else (n, b)), ((m,) if b == 1 else (m, b))

    def make_inputs(self, problem: Problem, xp, rng, case: dict) -> dict:
        dtype = problem.dtype
        a_shape, x_shape, y_shape = self.shapes(problem)
        if case.get("values") == "large":
            def values(shape):
                span = xp.float32(LARGE_HIGH - LARGE_LOW)
                return to_storage(xp, rng.random(shape, dtype=xp.float32) * span + xp.float32(LARGE_LOW), dtype)
            A, x = values(a_shape), values(x_shape)
        else:
            A, x = random_uniform(xp, rng, a_shape, dtype), random_uniform(xp, rng, x_shape, dtype)
        if case["beta"] == 0.0:
            y = to_storage(xp, xp.full(y_shape, xp.nan, dtype=xp.float32), dtype)
        else:
            y = random_uniform(xp, rng, y_shape, dtype)
        return {"A": A, "x": x, "y": y, "alpha": case["alpha"], "beta": case["beta"]}

    def _float64(self, problem: Problem, inputs: dict, xp):
        return tuple(to_float64(xp, inputs[k], problem.dtype) for k in ("A", "x", "y"))

    def reference(self, problem: Problem, inputs: dict, xp=np):
        # The values the kernel reads (the inputs as stored), multiplied in float64.
        A, x, y = self._float64(problem, inputs, xp)
        result = inputs["alpha"] * (A @ x)
        if inputs["beta"] != 0.0:
            result += inputs["beta"] * y
        return result

    def reference_magnitude(self, problem: Problem, inputs: dict, xp=np):
        A, x, y = self._float64(problem, inputs, xp)
        terms = abs(inputs["alpha"]) * (xp.abs(A) @ xp.abs(x))
        result = inputs["alpha"] * (A @ x)
        if inputs["beta"] != 0.0:
            terms += abs(inputs["beta"]) * xp.abs(y)
            result += inputs["beta"] * y
        return xp.abs(result) + GUARD * terms + self.magnitude_floor(problem.dtype)

    def magnitude_floor(self, dtype: str) -> float:
        """The least magnitude an element counts in the error (SMALLEST_NORMAL); the exported
        self-test renders it too."""
        return SMALLEST_NORMAL[dtype]

    def bytes_moved(self, problem: Problem, case: dict | None = None) -> int:
        m, n, b = problem["m"], problem["n"], problem["batch"]
        reads_y = case is not None and case.get("beta", 0.0) != 0.0
        return 2 * (m * n + n * b + m * b + (m * b if reads_y else 0))

    def weight_bytes(self, problem: Problem) -> int:
        """The bytes of A alone: the decode floor the issue measures against."""
        return 2 * problem["m"] * problem["n"]

    def flops(self, problem: Problem) -> int:
        return 2 * problem["m"] * problem["n"] * problem["batch"]

    def peer(self, problem: Problem) -> Peer | None:
        """torch.mv (batch = 1) or torch.matmul (cuBLAS) on the same dtype, on CuPy's capturing
        stream, writing into the inputs' own y through out= (no allocation inside capture). The
        out= form is checked, and cuBLAS's handle and kernels loaded for this shape, outside
        capture first. Timed on the timing case (alpha = 1, beta = 0), as sgemv's peer."""
        from autogen.gpu.peers import torch_cuda, torch_stream_peer
        torch = torch_cuda()
        if torch is None:
            return None
        name, product_into = _torch_product_out(torch, problem)
        dtype = problem.dtype
        return torch_stream_peer(name, {"A": dtype, "x": dtype, "y": dtype},
                                 lambda t: product_into(t["A"], t["x"], t["y"]))

    # --- calls from Python (the dispatcher) -------------------------------------------------
    def example_call(self, problem: Problem, cupy):
        rng = cupy.random.default_rng(0)
        m, n, b = problem["m"], problem["n"], problem["batch"]
        tail = (b,) if b > 1 else ()
        A = to_storage(cupy, rng.random((m, n), dtype=cupy.float32) - 0.5, problem.dtype)
        x = to_storage(cupy, rng.random((n,) + tail, dtype=cupy.float32) - 0.5, problem.dtype)
        return (A, x), {"y": cupy.empty((m,) + tail, dtype=DTYPES[problem.dtype].storage)}

    def bind(self, cupy, device: int, args: tuple, kwargs: dict):
        """autogen.hgemv(A, x, alpha=1.0, beta=0.0, y=None) -> y. A (m, n) float16 or bfloat16,
        C-contiguous; x (n,) or (n, batch) of the same dtype; y (m,) or (m, batch), allocated in
        A's kind (CuPy or torch) when not given. fp32 accumulation."""
        A, x, alpha, beta, y = _hgemv_arguments(*args, **kwargs)
        a = device_array(cupy, A, "A", self.dtypes, 2, device)
        dtype = dtype_name(a)
        m, n = a.shape
        same = (dtype,)
        xv = device_array(cupy, x, "x", same, _rank(x), device)
        if xv.shape[0] != n:
            raise ArgumentError(f"x has {xv.shape[0]} rows, but A has {n} columns")
        out_shape = (m,) + xv.shape[1:]
        if y is None:
            if beta != 0.0:
                raise ArgumentError("beta != 0 needs y: it scales the y that is given")
            y = new_output(cupy, A, out_shape, dtype)
        yv = device_array(cupy, y, "y", same, xv.ndim, device)
        if yv.shape != out_shape:
            raise ArgumentError(f"y has shape {yv.shape}, but A x has {out_shape}")
        batch = xv.shape[1] if xv.ndim == 2 else 1
        inputs = {"A": a, "x": xv, "y": yv, "alpha": alpha, "beta": beta}
        return self._problem_of(dtype, m, n, batch), inputs, y

    @functools.lru_cache(maxsize=1024)
    def _problem_of(self, dtype: str, m: int, n: int, batch: int) -> Problem:
        # Cached: the hot path of a dispatched call should not re-validate the same shape.
        return self.problem(dtype, m=m, n=n, batch=batch)


def _rank(obj) -> int:
    """The rank of x before conversion: a vector or an n x batch matrix (device_array checks
    what it finds against it)."""
    ndim = getattr(obj, "ndim", None)
    if ndim is None and hasattr(obj, "__cuda_array_interface__"):
        ndim = len(obj.__cuda_array_interface__["shape"])
    if ndim is not None and ndim not in (1, 2):
        raise ArgumentError(f"x must be 1-dimensional (n) or 2-dimensional (n x batch), got {ndim} dimensions")
    return 1 if ndim is None else ndim


def _hgemv_arguments(A, x, alpha=1.0, beta=0.0, y=None):
    return A, x, alpha, beta, y


def _torch_product_out(torch, problem: Problem):
    """(name, call(A, x, y)) writing A x into y with torch's out= form, checked on a sample of
    the problem's shape outside capture (which also loads cuBLAS's kernels for it)."""
    m, n, b = problem["m"], problem["n"], problem["batch"]
    dtype = getattr(torch, DTYPES[problem.dtype].torch_name)
    if b == 1:
        name, call = "torch.mv", (lambda A, x, y: torch.mv(A, x, out=y))
    else:
        name, call = "torch.matmul", (lambda A, x, y: torch.matmul(A, x, out=y))
    A = torch.rand((m, n), dtype=dtype, device="cuda") - 0.5
    x = torch.rand((n,) if b == 1 else (n, b), dtype=dtype, device="cuda") - 0.5
    y = torch.full((m,) if b == 1 else (m, b), float("nan"), dtype=dtype, device="cuda")
    try:
        call(A, x, y)
        torch.cuda.synchronize()
    except (TypeError, RuntimeError) as exc:
        raise RuntimeError(f"torch offers no {name} with out= for {problem}: {exc}") from None
    rows = min(m, 256)
    want = A[:rows].double() @ x.double()
    scale = A[:rows].double().abs() @ x.double().abs()
    error = float((y[:rows].double() - want).norm() / scale.norm())
    if not error <= TOLERANCES[problem.dtype]:
        raise RuntimeError(f"{name}(out=) gave a relative error {error:.3g} on {problem}")
    return name, call
