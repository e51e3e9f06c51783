"""HGEMV for LLM decode: y = alpha * A x + beta * y (autogen.families._gemv) in float16 or
bfloat16, fp32 accumulation. Template: templates/hgemv/kernel.cu.j2; the design and its figures:
docs/families/hgemv.md. A launch computes `batch_tile` vectors from one read of the weights; a
larger batch takes ceil(batch / batch_tile) launches, and the search only times the tile that
covers the batch in one launch.
"""

from __future__ import annotations

import math

import numpy as np

from autogen.core.dtypes import DTYPES, to_float64, to_storage
from autogen.core.family import Launch, Peer, Step
from autogen.core.operands import device_array, dtype_name, kernel_scalar, new_output, random_uniform
from autogen.core.problem import Config, Problem
from autogen.core.registry import register
from autogen.core.signature import OpSignature, Output, Scalar, Tensor
from autogen.core.space import Param, Space
from autogen.errors import ArgumentError
from autogen.families._gemv import (gemv_arguments, gemv_shapes, GemvFamily, overshoot_reason,
                                    reduce_only_across_warps, row_fits_block)
from autogen.families._hgemv_constraints import (mma_shape, peeled_rows_stage_x, rows_in_flight, schedule_has_steps,
                                               split_on_tensor_cores, split_reason, tail_peels_one_vector,
                                               tensor_core_registers, three_vectors_in_flight, values_fit_registers,
                                               x_tile_fits)
from autogen.gpu.peers import torch_cuda, torch_stream_peer

MAX_TILE = 8  # the largest batch_tile: LLM decode batches of 1 to 8 take one launch

# Validation (docs/families/hgemv.md, "Validation and tolerances"): the relative L2 error against
# || |y| + GUARD * (sum of |terms|) + SMALLEST_NORMAL || stays under twice the rounding of y to
# the dtype. ||y|| itself, not the sum of |terms| as sgemv's, so that a dropped pack shows; GUARD
# bounds the rounding where y cancels, SMALLEST_NORMAL the fixed spacing of subnormal outputs.
TOLERANCES = {"float16": 1e-3, "bfloat16": 8e-3}
GUARD = 2.0**-12
SMALLEST_NORMAL = {"float16": 2.0**-14, "bfloat16": 2.0**-126}

# The "large" case: one product fits fp16 (240^2 < 65504), four summed do not (4 * 128^2): a
# kernel accumulating in half precision returns inf; alpha = 2^-ceil(log2 n) keeps y finite.
LARGE_LOW, LARGE_HIGH = 128.0, 240.0

# Each parameter in full: docs/families/hgemv.md, "Parameters".
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
              "x through the read-only cache, staged in shared memory as fp32, or mma: tensor cores "
              "(mma.sync m16n8k16) on 16*rows_per_group rows x 8 vectors per row group"),
        Param("reduce", ("shfl", "smem"), "r", "cross-warp reduction: shuffles or a shared-memory tree"),
        Param("batch_tile", (1, 2, 3, 4, 8), "bt",
              "vectors per launch: each loaded weight feeds batch_tile dot products from registers "
              "(3: rows in flight only)"),
        Param("load_schedule", ("chunk", "step", "early"), "ls",
              "A's packs requested a chunk at a time, each unrolled step's just before it, or "
              "(x_path=smem) the chunk's before its x is staged",
              added_with_default="chunk"),
        Param("tail", ("checked", "peeled"), "tail",
              "every chunk tests its packs, or an aligned problem's whole chunks run untested",
              added_with_default="checked"),
        Param("row_align", ("scalar", "peeled"), "ra",
              "rows off a pack boundary read element by element, or their heads alone (x staged shifted)",
              added_with_default="scalar"),
        Param("split_k", (1, 2, 4, 8), "sk",
              "blocks of a cluster splitting the columns of a block of row tiles (sm_90; x_path=mma)",
              added_with_default=1),
        Param("a_buffers", (1, 2), "ab",
              "register sets of A (x_path=mma): 2 requests the next chunk's A before this chunk's mma",
              added_with_default=1),
        Param("min_blocks", (1, 2, 3, 4), "mb",
              "blocks per SM the registers are bounded for (__launch_bounds__; x_path=mma, rows in flight); 1: none",
              added_with_default=1),
    ),
    constraints=(row_fits_block, reduce_only_across_warps, x_tile_fits, mma_shape, values_fit_registers,
                 schedule_has_steps, tail_peels_one_vector, peeled_rows_stage_x, three_vectors_in_flight,
                 split_on_tensor_cores, tensor_core_registers),
)


def _twin(config: Config, **changes) -> Config | None:
    """`config` with `changes`, where the space allows it, else None."""
    params = {**config.as_dict(), **changes}
    return None if SPACE.violations(params) else SPACE.check(params)


def _peeled_twin(config: Config) -> Config | None:
    """The seed with tail=peeled (one vector, x_path=ldg): the search times both loops."""
    return None if config["tail"] == "peeled" else _twin(config, tail="peeled")


def _peeled_rows_twin(config: Config) -> Config | None:
    """The seed with row_align=peeled, x staged in shared memory where it went through the
    read-only path: the form that keeps wide loads on rows of n % 8 != 0 columns."""
    x_path = "smem" if config["x_path"] == "ldg" else config["x_path"]
    return None if config["row_align"] == "peeled" else _twin(config, row_align="peeled", tail="checked",
                                                                x_path=x_path)


def _bounded_twin(config: Config) -> Config | None:
    """The tensor-core seed held to 3 blocks of 256 threads per SM (min_blocks=3), else 2, where
    the space allows it: such forms won 5120 x 5121 at every batch and 4096 x 11007 at one vector
    (docs/families/hgemv.md, "a_buffers and min_blocks, measured")."""
    if config["min_blocks"] != 1:
        return None
    return _twin(config, min_blocks=3) or _twin(config, min_blocks=2)


def alignment_period(problem: Problem, config: Config) -> int:
    """Blocks per window of rows: with row_align=peeled on rows of n % pack != 0 columns, each of a
    window's `pack` blocks takes the rows of one offset from a pack boundary (the template's
    by_class; x_path smem and mma, which stage x shifted by it); rows in flight with several rows
    a group take windows of pack_width blocks whatever n (a group's rows are pack_width apart:
    rows_in_flight.cu.j2); otherwise 1."""
    if rows_in_flight(config):
        return config["pack_width"] if config["rows_per_group"] > 1 else 1
    if config["row_align"] != "peeled":
        return 1
    pack = 8 if config["x_path"] == "mma" else config["pack_width"]
    return pack if problem["n"] % pack else 1


def batch_tile_for(batch: int, params: dict | Config | None = None) -> int:
    """The tile the search times for a batch: the smallest power of two covering it (at most 8),
    so that a batch of up to 8 vectors reads the weights once; for rows in flight (`params` of
    that form) a batch of 3 takes its own tile, which reads x in whole units."""
    if batch == 3 and params is not None and rows_in_flight(params):
        return 3
    return min(MAX_TILE, 1 << max(0, batch - 1).bit_length())


# Extra seeds for one vector on rows of `lo` <= n < `hi` columns: (lo, hi, the params that differ
# from the default; docs/families/hgemv.md, "Defaults").
BATCH1_SEEDS = (
    (1024, math.inf, dict(threads_per_row=128, pack_width=8, warps_per_block=4, rows_per_group=2, unroll=2,
                          x_path="ldg", reduce="shfl")),
    (1024, 8192, dict(threads_per_row=256, pack_width=8, warps_per_block=8, rows_per_group=2, unroll=2,
                      x_path="ldg", reduce="shfl", load_schedule="step")),
    (8192, math.inf, dict(threads_per_row=256, pack_width=8, warps_per_block=8, rows_per_group=2, unroll=2,
                          x_path="ldg", reduce="smem")),
)

# One vector on rows off the 16-byte boundary: a warp a row, x in shared memory, A requested before
# x is staged (the long odd rows' best at one vector: docs/families/hgemv.md, load_schedule).
ODD_ROWS_SEED = dict(threads_per_row=32, pack_width=8, warps_per_block=8, rows_per_group=1, unroll=4, x_path="smem",
                     reduce="shfl", load_schedule="early", row_align="peeled")
# And rows in flight (row_align=peeled through the read-only path, templates/hgemv/rows_in_flight.cu.j2):
# four or two warps a row, one row a group, four packs a pass: beside the default's row groups, the
# best of the one-row forms on the odd shapes measured (docs/families/hgemv.md, "Rows in flight").
ROWS_IN_FLIGHT_SEEDS = tuple(dict(threads_per_row=tpr, pack_width=8, warps_per_block=4, rows_per_group=1, unroll=4,
                                  x_path="ldg", reduce="shfl", load_schedule="chunk", tail="checked", row_align="peeled")
                             for tpr in (128, 64))
# Four vectors: 256-thread blocks of row groups of four, bounded to 64 registers (the winner at
# 3000 x 4099 on the H100: docs/families/hgemv.md, "Rows in flight bounded to 64 registers").
ROWS_IN_FLIGHT_BOUNDED_SEED = dict(ROWS_IN_FLIGHT_SEEDS[0], pack_width=4, warps_per_block=8, rows_per_group=4,
                                   min_blocks=4, unroll=1)


# Untuned long rows off the 16-byte boundary, one to four vectors: rows in flight, four warps a row,
# row groups of two rows (four at four vectors: more rows share each load of x as the vectors' x
# grows), fewer packs a pass as x takes the registers (why: docs/families/hgemv.md, "Defaults").
ROWS_IN_FLIGHT_DEFAULT = {batch: dict(threads_per_row=128, pack_width=8, warps_per_block=4, rows_per_group=group,
                                      unroll=unroll, x_path="ldg", reduce="shfl", batch_tile=batch,
                                      load_schedule="chunk", tail="checked", row_align="peeled")
                          for batch, group, unroll in ((1, 2, 2), (2, 2, 2), (3, 2, 1), (4, 4, 1))}


def _tensor_core_params(problem: Problem) -> dict:
    """The tensor-core default: one 16-row tile per block of 8 warps on rows of >= 512 columns
    (4 warps on shorter ones), 4 steps in flight, rows peeled where they start off the 16-byte
    boundary."""
    wide = problem["n"] >= 512
    return dict(x_path="mma", threads_per_row=256 if wide else 128, warps_per_block=8 if wide else 4,
                rows_per_group=1, unroll=4, row_align="peeled" if problem["n"] % 8 else "scalar")


@register
class Hgemv(GemvFamily):
    name = "hgemv"
    api = "hgemv"
    reuse_bound_calls = True  # bind only checks and arranges (autogen.runtime.bound_calls)
    pdl_capable = True  # as sgemv's: A's first chunk loaded before griddepcontrol.wait, then x and y
    dims = ("m", "n", "batch")
    tail_shapes = ((1, 1, 1), (1, 3, 2), (3, 1, 8), (3, 3, 3), (1, 4099, 1), (3, 70, 5), (1000, 37, 4),  # the export's
                   (37, 1000, 8), (4099, 70, 1), (513, 257, 7), (130, 4104, 2), (5, 16, 6), (2, 64, 9))  # tails
    dim_defaults = {"batch": 1}  # one vector unless told otherwise (Python call and CLI alike)
    export_names_dtype = True  # autogen_hgemv_f16 and autogen_hgemv_bf16
    peer_imports = ("torch",)  # peer(): torch.mv / torch.matmul
    example_dims = {"m": 1000, "n": 1000, "batch": 4}
    dtypes = ("float16", "bfloat16")
    space = SPACE
    default_params = {"threads_per_row": 32, "pack_width": 8, "warps_per_block": 4, "rows_per_group": 1,
                      "unroll": 2, "x_path": "ldg", "reduce": "shfl", "batch_tile": 1, "load_schedule": "chunk",
                      "tail": "checked", "row_align": "scalar", "split_k": 1,
                      "a_buffers": 1, "min_blocks": 1}
    op_signature = OpSignature((Tensor("A"), Tensor("x"), Scalar("alpha", "float", 1.0), Scalar("beta", "float", 0.0)),
                               (Output("y", lambda A, x: (A.shape[0], *x.shape[1:]), "A", read_when="beta"),))
    c_params = "const void* A, const void* x, void* y, int m, int n, int batch, float alpha, float beta"  # f16/bf16
    tolerance = TOLERANCES["float16"]
    description = "y = alpha * A x + beta * y, A row-major m x n fp16/bf16, x n x batch, fp32 sums, y m x batch as A"

    def tolerance_for(self, problem: Problem) -> float:
        return TOLERANCES[problem.dtype]

    def default_config(self, problem: Problem | None = None) -> Config:
        """Untuned, a batch is served in one launch (the batch tile that covers it): one vector
        on long rows with 4 packs in flight; on long rows off the 16-byte boundary, one to four
        vectors as rows in flight (ROWS_IN_FLIGHT_DEFAULT); other batches on the tensor cores
        (x_path=mma), 8 warps per 16-row tile on rows of >= 512 columns (why:
        docs/families/hgemv.md, "Defaults")."""
        params = dict(self.default_params)
        if problem is not None:
            params["batch_tile"] = batch_tile_for(problem["batch"])
            odd = problem["n"] % 8 != 0 and problem["n"] >= 1024
            if odd and problem["batch"] in ROWS_IN_FLIGHT_DEFAULT:
                params.update(ROWS_IN_FLIGHT_DEFAULT[problem["batch"]])
            elif problem["batch"] == 1 and problem["n"] >= 1024 and not odd:
                params["unroll"] = 4
            elif problem["batch"] > 1 or odd:
                params.update(_tensor_core_params(problem))
        return self.space.check(params)

    def seed_configs(self, problem: Problem) -> list[Config]:
        """The default, then for one vector the BATCH1_SEEDS of its row length, then the twins
        of each (row_align=peeled on rows off the 16-byte boundary, where one vector also gets
        ODD_ROWS_SEED and ROWS_IN_FLIGHT_SEEDS, four ROWS_IN_FLIGHT_BOUNDED_SEED; split_k=2,
        min_blocks, tail=peeled): docs/families/hgemv.md, "Defaults", says which shapes each won."""
        default = self.default_config(problem)
        extra = [params for lo, hi, params in BATCH1_SEEDS if problem["batch"] == 1 and lo <= problem["n"] < hi]
        # (the batch-1 seeds are read-only-path configs: row_align=peeled comes as their twins)
        seeds = [default] + [self.space.check({**default.as_dict(), "row_align": "scalar", **params})
                             for params in extra]
        if default["x_path"] == "ldg" and default["row_align"] == "peeled":  # rows in flight: the tensor cores too
            seeds.append(self.space.check({**default.as_dict(), **_tensor_core_params(problem), "reduce": "shfl",
                                           "rows_per_group": 1, "batch_tile": batch_tile_for(problem["batch"])}))
        if problem["n"] % 8:  # rows off the 16-byte boundary: each seed with row_align=peeled too
            seeds += [twin for twin in map(_peeled_rows_twin, seeds) if twin is not None]
            if problem["batch"] == 1:
                seeds += [self.space.check({**default.as_dict(), **seed}) for seed in (ODD_ROWS_SEED, *ROWS_IN_FLIGHT_SEEDS)]
            elif problem["batch"] == 4:
                seeds.append(self.space.check({**default.as_dict(), **ROWS_IN_FLIGHT_BOUNDED_SEED}))
        seeds += [twin for twin in (self._split_twin(problem, seed) for seed in seeds) if twin is not None]
        if problem["n"] % 8:  # where they were measured to win (rows off the boundary)
            seeds += [twin for twin in map(_bounded_twin, seeds) if twin is not None]
        return seeds + [twin for twin in map(_peeled_twin, seeds) if twin is not None]

    def _split_twin(self, problem: Problem, config: Config) -> Config | None:
        """The tensor-core seed split over a cluster of 2 blocks, where the problem's row blocks
        leave the GPU short of blocks (split_reason; docs/families/hgemv.md, split_k)."""
        twin = _twin(config, split_k=2) if config["split_k"] == 1 else None
        return None if twin is None or self.reject_reason(problem, twin) else twin

    def seed_from(self, problem: Problem, params: dict) -> dict:
        """Another shape's winner with the batch tile of this batch (a batch-1 winner as it is
        would read the weights once per vector); on long rows off the 16-byte boundary, a winner
        that would read them element by element (row_align=scalar where its packs do not divide
        n: a shape on the boundary's) takes its peeled twin (the scalar rows' cost:
        docs/families/hgemv.md). Where the space has no such point (rows in flight past 4
        vectors, say), this shape's default."""
        pack = 8 if params["x_path"] == "mma" else params["pack_width"]
        odd_long_rows = problem["n"] % 8 != 0 and problem["n"] >= 1024
        if odd_long_rows and params["row_align"] == "scalar" and problem["n"] % pack:
            params = {**params, "row_align": "peeled"}
        params = {**params, "batch_tile": batch_tile_for(problem["batch"], params)}
        return self.default_config(problem).as_dict() if SPACE.violations(params) else params

    # --- geometry -------------------------------------------------------------------------
    def rows_per_block(self, config: Config) -> int:
        """sgemv's geometry; with x_path=mma a row group computes 16-row tiles (16 * rows_per_group rows)."""
        return super().rows_per_block(config) * (16 if config["x_path"] == "mma" else 1)

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

    def reject_reason(self, problem: Problem, config: Config) -> str | None:
        # With x_path=mma a row group of tpr lanes covers tpr columns per step.
        width, name = (1, "1 (mma)") if config["x_path"] == "mma" else (config["pack_width"], "pack_width")
        reason = (overshoot_reason(problem["n"], config["threads_per_row"], width, config["unroll"], name)
                  or split_reason(problem, config, self.row_blocks(problem, config)))
        if reason:
            return reason
        wanted = batch_tile_for(problem["batch"], config)
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

    def make_inputs(self, problem: Problem, xp, rng, case: dict) -> dict:
        dtype = problem.dtype
        a_shape, x_shape, y_shape = gemv_shapes(problem)
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

    def reference_magnitude(self, problem: Problem, inputs: dict, xp=np):
        A, x, y = (to_float64(xp, inputs[name], problem.dtype) for name in ("A", "x", "y"))
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

    def weight_bytes(self, problem: Problem) -> int:
        """The bytes of A alone: the decode floor the issue measures against."""
        return 2 * problem["m"] * problem["n"]

    def peer(self, problem: Problem) -> Peer | None:
        """torch.mv (batch = 1) or torch.matmul (cuBLAS) on the same dtype, writing into the
        inputs' own y through out= (checked, and its kernels loaded, outside capture)."""
        torch = torch_cuda()
        if torch is None:
            return None
        name, product_into = _torch_product_out(torch, problem)
        dtype = problem.dtype
        return torch_stream_peer(name, {"A": dtype, "x": dtype, "y": dtype},
                                 lambda t: product_into(t["A"], t["x"], t["y"]))

    # --- calls from Python (the dispatcher) -------------------------------------------------
    def bind(self, cupy, device: int, args: tuple, kwargs: dict):
        """autogen.hgemv(A, x, alpha=1.0, beta=0.0, y=None) -> y. A (m, n) float16 or bfloat16,
        C-contiguous; x (n,) or (n, batch) of the same dtype; y (m,) or (m, batch), allocated in
        A's kind (CuPy or torch) when not given. fp32 accumulation."""
        A, x, alpha, beta, y = gemv_arguments(*args, **kwargs)
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
        return self.problem_cached(dtype, (("m", m), ("n", n), ("batch", batch))), inputs, y


def _rank(obj) -> int:
    """The rank of x before conversion: a vector or an n x batch matrix (device_array checks
    what it finds against it)."""
    ndim = getattr(obj, "ndim", None)
    if ndim is None and hasattr(obj, "__cuda_array_interface__"):
        ndim = len(obj.__cuda_array_interface__["shape"])
    if ndim is not None and ndim not in (1, 2):
        raise ArgumentError(f"x must be 1-dimensional (n) or 2-dimensional (n x batch), got {ndim} dimensions")
    return 1 if ndim is None else ndim


def _torch_product_out(torch, problem: Problem):
    """(name, call(A, x, y)) writing A x into y with torch's out= form, checked on a sample of
    the problem's shape outside capture (which also loads cuBLAS's kernels for it)."""
    a_shape, x_shape, y_shape = gemv_shapes(problem)
    dtype = getattr(torch, DTYPES[problem.dtype].torch_name)
    if problem["batch"] == 1:
        name, call = "torch.mv", (lambda A, x, y: torch.mv(A, x, out=y))
    else:
        name, call = "torch.matmul", (lambda A, x, y: torch.matmul(A, x, out=y))
    A, x = (torch.rand(shape, dtype=dtype, device="cuda") - 0.5 for shape in (a_shape, x_shape))
    y = torch.full(y_shape, float("nan"), dtype=dtype, device="cuda")
    try:
        call(A, x, y)
        torch.cuda.synchronize()
    except (TypeError, RuntimeError) as exc:
        raise RuntimeError(f"torch offers no {name} with out= for {problem}: {exc}") from None
    rows = min(problem["m"], 256)
    want, scale = A[:rows].double() @ x.double(), A[:rows].double().abs() @ x.double().abs()
    error = float((y[:rows].double() - want).norm() / scale.norm())
    if not error <= TOLERANCES[problem.dtype]:
        raise RuntimeError(f"{name}(out=) gave a relative error {error:.3g} on {problem}")
    return name, call
