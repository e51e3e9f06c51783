"""SCAN (prefix sum): out[i] = x[0] + ... + x[i] (inclusive) or x[0] + ... + x[i-1] (exclusive,
out[0] = 0) over a 1-D contiguous x of any length n >= 1. Template: templates/scan/kernel.cu.j2
(the decoupled look-back and the segment scan are shared with copy_if: templates/lookback.cuh.j2).

Types: float32, float16 and bfloat16 x are summed in fp32 and out has x's dtype (each output the
fp32 prefix rounded once); int32 x is summed in int32 (out int32, wrapping modulo 2^32 as two's
complement does) or, with acc_dtype int64, in int64 (out int64). `autogen.cumsum` is the call.

Traits (part of the database key; `--scan`/`--exclusive` and `--acc-dtype` on the command line):
  scan       inclusive (the default) or exclusive: an argument of the kernel, so every variant
             computes both (the trait keeps separate tuning data per direction)
  acc_dtype  auto (fp32 for float x, int32 for int32 x) or int64 (int32 x only): changes the code

Validation (compare): integers exactly. Floats element by element against the float64 prefix
sum: |out_i - ref_i| <= u * M_i * (DEPTH + CHAIN * sqrt(1 + i / SMALLEST_TILE)) plus the output
dtype's rounding of the reference, where u is fp32's unit roundoff and M_i the prefix sum of |x|
(the scale every rounding of a partial sum is proportional to): DEPTH covers the additions inside
a tile, the square root the chain of tile prefixes before i (one rounding per tile, of random
sign). Where every partial sum is an integer below 2^24 (the "exact" cases) fp32 sums are exact
in any order: then only the output rounding is allowed. The relative L2 error over M is then
judged against `tolerance` as every family's (and the export's self-test).

Workspace (in the inputs dict, as copy_if's): `status` (one word per tile of the smallest tile
any variant launches), `ticket`, and `sums` (one 8-byte word per block of the largest
reduce_scan grid); `_init` zeroes what the look-back relies on.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from autogen.core.compare import relative_error
from autogen.core.dtypes import DTYPES, round_trip, to_float64, to_storage
from autogen.core.family import Family, Launch, Peer, Step, Trait
from autogen.core.operands import device_array, dtype_name, kernel_scalar, new_output, stream_workspace
from autogen.core.problem import Config, Problem
from autogen.core.registry import register
from autogen.core.signature import OpSignature, Output, Scalar, Tensor
from autogen.core.space import Param, Space
from autogen.errors import ArgumentError, GpuUnavailableError, UsageError
from autogen.families._elementwise import fitting_seeds, offset_view
from autogen.families._tiles import init_launch, tile, tiles
from autogen.families.cub_peers import cub_library
from autogen.gpu.device import require_cupy, sm_count
from autogen.gpu.peers import torch_cuda, torch_stream_peer

MAX_THREADS_PER_SM = 2048  # reduce_scan's grid: one wave of blocks of this many threads per SM
SMALLEST_TILE = 128 * 4  # the smallest block_size x items_per_thread of the space
MAX_RAKED = 4096  # raking keeps ROWS x BLOCK sums (plus padding) in static shared memory
DEPTH, CHAIN = 64, 4  # the float bound's additions inside a tile, and its allowance per tile chained
FP32_UNIT = 2.0 ** -24
EXACT_LIMIT = 2.0 ** 24  # integers up to this are exact in fp32
INT_POISON = {"int32": -2**31, "int64": -2**63 + 12345}

SCAN = Trait("scan", ("inclusive", "exclusive"), switch="exclusive",
             help="inclusive: out[i] sums x[0..i]; exclusive: x[0..i-1] (out[0] = 0)")
ACC = Trait("acc_dtype", ("auto", "int64"), code=True,
            help="auto: fp32 sums for float x, int32 (wrapping) for int32 x; int64: int32 x summed and stored in int64")


def _items_fit_registers(p) -> str | None:
    # A thread holds its items as sums (int64: two registers each) and their row starts:
    # 64 registers per thread at 1024 threads, 128 at 512 (as copy_if's limits).
    limit = {1024: 8, 512: 16}.get(p["block_size"], 32)
    if p["items_per_thread"] > limit:
        return f"items_per_thread > {limit} does not fit the registers at block_size={p['block_size']}"
    return None


def _whole_vectors(p) -> str | None:
    if p["vector_width"] > p["items_per_thread"]:
        return f"vector_width={p['vector_width']} exceeds items_per_thread={p['items_per_thread']}"
    return None


def _raking_fits(p) -> str | None:
    raked = p["block_size"] * p["items_per_thread"] // p["vector_width"]
    if p["block_scan"] == "raking" and raked > MAX_RAKED:
        return f"raking keeps {raked} sums in shared memory (at most {MAX_RAKED})"
    return None


def _blocks_fit_an_sm(p) -> str | None:
    if p["block_size"] * p["min_blocks"] > MAX_THREADS_PER_SM:
        return f"min_blocks={p['min_blocks']} blocks of {p['block_size']} threads exceed an SM's {MAX_THREADS_PER_SM}"
    return None


SPACE = Space(
    params=(
        Param("mode", ("lookback", "reduce_scan"), "m",
              "lookback: one pass, decoupled look-back across tiles (as CUB); reduce_scan: sum each block's "
              "run of tiles, scan the sums, scan the runs again (x read twice)"),
        Param("block_scan", ("warp_shuffle", "raking"), "bk",
              "the scan across a tile's threads: warp shuffles per row, or one warp raking over shared memory"),
        Param("block_size", (128, 256, 512, 1024), "bs", "threads per block"),
        Param("items_per_thread", (4, 8, 16, 32), "ipt", "elements each thread scans per tile"),
        Param("vector_width", (1, 2, 4, 8), "vw", "consecutive elements a thread loads and stores per row (in 16-byte accesses at most)"),
        Param("min_blocks", (1, 2, 3, 4), "mb",
              "blocks an SM must hold at once (__launch_bounds__' second number): caps the registers "
              "per thread, so more tiles are in flight", added_with_default=1),
    ),
    constraints=(_items_fit_registers, _whole_vectors, _raking_fits, _blocks_fit_an_sm),
)


@register
class Scan(Family):
    name = "scan"
    api = "cumsum"
    reuse_bound_calls = True  # bind only checks and arranges (autogen.runtime.bound_calls)
    dims = ("n",)
    traits = (SCAN, ACC)
    dtypes = ("float32", "int32", "float16", "bfloat16")
    tail_shapes = ((1,), (2,), (3,), (33,), (1000,), (4097,), (65537,), (1048579,))
    space = SPACE
    default_params = {"mode": "lookback", "block_scan": "warp_shuffle", "block_size": 256,
                      "items_per_thread": 16, "vector_width": 4}
    outputs = ("out",)
    op_signature = OpSignature(
        (Tensor("x"), Scalar("exclusive", "bool", False), Scalar("acc_dtype", "str", optional=True)),
        (Output("out", lambda x: tuple(x.shape), lambda acc_dtype: "int64" if acc_dtype == "int64" else "x"),))
    c_params = "const void* x, void* out, int n, int exclusive"
    tolerance = 1e-4  # the relative L2 error over the prefix sums of |x| (see the module's docstring)
    # Checked on the GPU at every size: its offset cases read views one element past an aligned
    # address, which an upload from the host would realign.
    host_check_bytes = 0
    description = "out = cumsum(x), inclusive or exclusive; int32 (int32 or int64 sums), fp32, fp16, bf16"

    def traits_reason(self, dtype: str, traits: tuple[tuple[str, str], ...]) -> str | None:
        if dict(traits).get("acc_dtype") == "int64" and dtype != "int32":
            return f"acc_dtype int64 is for int32 x; {dtype} is summed in fp32 (acc_dtype auto)"
        return None

    @staticmethod
    def out_dtype(problem: Problem) -> str:
        return "int64" if problem["acc_dtype"] == "int64" else problem.dtype

    def reject_reason(self, problem: Problem, config: Config) -> str | None:
        if problem["acc_dtype"] == "int64" and config["items_per_thread"] > {1024: 4, 512: 8}.get(config["block_size"], 16):
            return f"int64 sums take two registers an item: items_per_thread={config['items_per_thread']} spills"
        size = tile(config)
        if size > 2 * max(problem["n"], SMALLEST_TILE) and size > SMALLEST_TILE:
            return f"a tile of {size} elements spans over twice n={problem['n']}"
        return None

    def seed_configs(self, problem: Problem) -> list[Config]:
        """The default, then 16-byte loads (8 elements for 2-byte x), then 8192-element tiles (fewer
        look-backs), then those held to 4 blocks an SM (int32's tile took 67 registers, 3 blocks
        of 256, where fp32's took 60: 4 blocks)."""
        default = self.default_config(problem).as_dict()
        wide = 16 // DTYPES[problem.dtype].itemsize
        seeds = [default, {**default, "vector_width": wide}, {**default, "items_per_thread": 32},
                 {**default, "items_per_thread": 32, "vector_width": wide},
                 {**default, "items_per_thread": 32, "min_blocks": 4}]
        return fitting_seeds(self, problem, seeds)

    # --- geometry -------------------------------------------------------------------------
    @staticmethod
    def reduce_scan_blocks(n: int, config: Config) -> int:
        return max(1, min(tiles(n, config), sm_count() * (MAX_THREADS_PER_SM // config["block_size"])))

    @functools.lru_cache(maxsize=1024)  # on every dispatched call: computed once per problem
    def workspace_sizes(self, problem: Problem) -> tuple[int, int]:
        """(status words, sum words): the tiles of the smallest tile, the blocks of the largest grid."""
        most_tiles = -(-problem["n"] // SMALLEST_TILE)
        return most_tiles, max(1, min(most_tiles, sm_count() * (MAX_THREADS_PER_SM // 128)))

    def launch(self, problem: Problem, config: Config) -> Launch:
        blocks = tiles(problem["n"], config) if config["mode"] == "lookback" else self.reduce_scan_blocks(problem["n"], config)
        return Launch(grid=(blocks, 1, 1), block=(config["block_size"], 1, 1))

    def plan(self, problem: Problem, config: Config) -> list[Step]:
        main = self.launch(problem, config)
        count, blocks = tiles(problem["n"], config), main.grid[0]
        n, tiles_arg, blocks_arg = (kernel_scalar(v, np.int32) for v in (problem["n"], count, blocks))
        exclusive = kernel_scalar(int(problem["scan"] == "exclusive"), np.int32)

        def sized(inputs: dict, name: str, need: int):
            buffer = inputs[name]
            if buffer.size < need:  # never write past the workspace
                raise ValueError(f"{name} holds {buffer.size} words; this launch needs {need}")
            return buffer

        if config["mode"] == "lookback":
            return [
                Step("_init", init_launch(count),
                     lambda inputs: (sized(inputs, "status", count), tiles_arg, inputs["ticket"])),
                Step("", main, lambda inputs: (inputs["x"], inputs["out"], n, exclusive,
                                               sized(inputs, "status", count), inputs["ticket"])),
            ]
        return [
            Step("_reduce", main, lambda inputs: (inputs["x"], n, sized(inputs, "sums", blocks))),
            Step("_scan", Launch(grid=(1, 1, 1), block=(32, 1, 1)), lambda inputs: (inputs["sums"], blocks_arg)),
            Step("", main, lambda inputs: (inputs["x"], inputs["out"], n, exclusive, inputs["sums"])),
        ]

    def c_arguments(self, problem: Problem, inputs: dict) -> dict:
        return {**super().c_arguments(problem, inputs), "exclusive": int(problem["scan"] == "exclusive")}

    # --- data -----------------------------------------------------------------------------
    def validation_cases(self, problem: Problem) -> list[dict]:
        # "exact": integers whose every partial sum is exact in fp32 (any order gives the same sum);
        # offset 1 puts x and out one element past an aligned address (the scalar path).
        if problem.dtype == "int32":
            return [{"values": "small"}, {"values": "wide"}, {"values": "small", "offset": 1}]
        return [{"values": "exact"}, {"values": "uniform"}, {"values": "exact", "offset": 1}]

    def timing_case(self, problem: Problem) -> dict:
        return {"values": "wide" if problem.dtype == "int32" else "uniform"}

    def make_inputs(self, problem: Problem, xp, rng, case: dict) -> dict:
        n, dtype, out_dtype = problem["n"], problem.dtype, self.out_dtype(problem)
        x = scan_values(xp, rng, n, dtype, case["values"])
        if out_dtype in INT_POISON:
            out = xp.full((n,), INT_POISON[out_dtype], dtype=out_dtype)
        else:
            out = to_storage(xp, xp.full((n,), xp.nan, dtype=xp.float32), dtype)
        status_words, sum_words = self.workspace_sizes(problem)
        offset = case.get("offset", 0)
        return {"x": offset_view(xp, x, offset), "out": offset_view(xp, out, offset),
                # Poisoned: _init must reset what a variant relies on.
                "status": xp.full((status_words,), 0xFFFFFFFFFFFFFFFF, dtype=xp.uint64),
                "ticket": xp.full((1,), 0xFFFFFFFF, dtype=xp.uint32),
                "sums": xp.full((sum_words,), 0xFFFFFFFFFFFFFFFF, dtype=xp.uint64)}

    def reference(self, problem: Problem, inputs: dict, xp=np):
        """The prefix sums in float64: for int32 x summed exactly in int64 (int32 sums wrapped
        modulo 2^32), exact in float64 while below 2^53, as the cases' mean-zero data keeps them."""
        exclusive = problem["scan"] == "exclusive"
        if problem.dtype == "int32":
            sums = _shifted(xp, xp.cumsum(inputs["x"].astype(xp.int64)), exclusive)
            sums = sums if problem["acc_dtype"] == "int64" else (sums + 2**31) % 2**32 - 2**31
            return sums.astype(xp.float64)
        return _shifted(xp, xp.cumsum(to_float64(xp, inputs["x"], problem.dtype)), exclusive)

    def reference_magnitude(self, problem: Problem, inputs: dict, xp=np):
        if problem.dtype == "int32":
            return None
        return _shifted(xp, xp.cumsum(xp.abs(to_float64(xp, inputs["x"], problem.dtype))),
                        problem["scan"] == "exclusive")

    def export_compare(self, problem: Problem, configs: tuple = ()) -> str:
        return "exact" if problem.dtype == "int32" else "l2"

    def compare(self, problem: Problem, inputs: dict, expected, magnitude, xp=np) -> tuple[float, str]:
        if problem.dtype == "int32":
            return exact_sums(xp, inputs["out"], expected)
        got = self.output_values(problem, inputs, "out", xp).astype(xp.float64)
        reason = bound_violation(xp, got, expected, magnitude, problem.dtype)
        if reason:
            return math.inf, reason
        return relative_error(xp, got, expected, magnitude)

    def output_dtype(self, problem: Problem, inputs: dict, name: str, xp=np) -> str:
        return self.out_dtype(problem)

    def bytes_moved(self, problem: Problem, case: dict | None = None) -> int:
        return problem["n"] * (DTYPES[problem.dtype].itemsize + DTYPES[self.out_dtype(problem)].itemsize)

    def flops(self, problem: Problem) -> int:
        return problem["n"]

    # --- peers ----------------------------------------------------------------------------
    peer_imports = ("torch",)

    def peer(self, problem: Problem) -> Peer | None:
        """CUB's DeviceScan from the benchmark's nvcc build (scripts/cub_peers.cu, named by
        AUTOGEN_CUB_PEERS) for fp32 and int32 x; else torch.cumsum writing into out (out=: no
        allocation, safe inside capture) on the capturing stream."""
        try:
            cupy = require_cupy()
        except GpuUnavailableError:
            return None
        cub = cub_library()
        if cub is not None and problem.dtype in ("float32", "int32") and hasattr(cub, "scan_peer"):
            return cub.scan_peer(cupy, problem.dtype, self.out_dtype(problem), problem["n"],
                                 problem["scan"] == "exclusive")
        return torch_cumsum_peer(problem, self.out_dtype(problem))

    # --- calls from Python ----------------------------------------------------------------
    def bind(self, cupy, device: int, args: tuple, kwargs: dict):
        """autogen.cumsum(x, exclusive=False, out=None, acc_dtype=None) -> the prefix sums of x

        x: a 1-D contiguous CUDA array of int32, float32, float16 or bfloat16, n >= 1. Inclusive
        (out[i] = x[0] + ... + x[i]) unless exclusive=True (out[0] = 0). Float x is summed in fp32
        and out has x's dtype; int32 x is summed in int32 (out int32, wrapping) unless
        acc_dtype="int64" (out int64). out= takes the output (then nothing is allocated: the call
        can be captured in a CUDA graph once warmed up)."""
        x, exclusive, out, acc_dtype = _cumsum_arguments(*args, **kwargs)
        if getattr(x, "ndim", 1) != 1:
            raise ArgumentError(f"x must be 1-D (cumsum scans one contiguous vector), got {x.ndim} dimensions")
        xv = device_array(cupy, x, "x", self.dtypes, 1, device)
        dtype = dtype_name(xv)
        problem = self._problem_of(dtype, xv.shape[0], bool(exclusive), _acc_trait(dtype, acc_dtype))
        out_dtype = self.out_dtype(problem)
        out = new_output(cupy, x, (xv.shape[0],), out_dtype) if out is None else out
        outv = device_array(cupy, out, "out", (out_dtype,), 1, device)
        if outv.shape[0] != xv.shape[0]:
            raise ArgumentError(f"out has {outv.shape[0]} elements, but x has {xv.shape[0]}")
        status_words, sum_words = self.workspace_sizes(problem)
        status, ticket, sums = stream_workspace(cupy, device, x, "cumsum",
                                                ((status_words, "uint64"), (1, "uint32"), (sum_words, "uint64")))
        return problem, {"x": xv, "out": outv, "status": status, "ticket": ticket, "sums": sums}, out

    def example_call(self, problem: Problem, cupy):
        n = problem["n"]
        x = to_storage(cupy, cupy.random.default_rng(0).random(n, dtype=cupy.float32), problem.dtype) \
            if problem.dtype != "int32" else cupy.random.default_rng(0).integers(-1000, 1000, n, dtype=cupy.int32)
        acc = "int64" if problem["acc_dtype"] == "int64" else None
        return (x,), {"exclusive": problem["scan"] == "exclusive", "acc_dtype": acc,
                      "out": cupy.empty(n, dtype=x.dtype if acc is None else cupy.int64)}

    @functools.lru_cache(maxsize=1024)
    def _problem_of(self, dtype: str, n: int, exclusive: bool, acc: str) -> Problem:
        if n < 1:
            raise ArgumentError("x is empty: cumsum needs at least one element")
        try:
            return self.problem(dtype, n=n, scan="exclusive" if exclusive else "inclusive", acc_dtype=acc)
        except UsageError as exc:
            raise ArgumentError(str(exc)) from None


def _cumsum_arguments(x, exclusive=False, out=None, acc_dtype=None):
    if not isinstance(exclusive, (bool, np.bool_)):
        raise ArgumentError(f"exclusive must be True or False, got {exclusive!r}")
    return x, exclusive, out, acc_dtype


def _acc_trait(dtype: str, acc_dtype) -> str:
    """The acc_dtype trait of a call: None or the natural type -> auto; int64 for int32 x."""
    natural = "int32" if dtype == "int32" else "float32"
    if acc_dtype is None or acc_dtype == natural:
        return "auto"
    if acc_dtype == "int64" and dtype == "int32":
        return "int64"
    raise ArgumentError(f"acc_dtype must be None, {natural!r}" + (" or 'int64'" if dtype == "int32" else "")
                        + f" for {dtype} x, not {acc_dtype!r}")


def _shifted(xp, inclusive, exclusive: bool):
    """The inclusive sums, or the exclusive ones (shifted right by one, a 0 first)."""
    if not exclusive:
        return inclusive
    result = xp.zeros_like(inclusive)
    result[1:] = inclusive[:-1]
    return result


def scan_values(xp, rng, n: int, dtype: str, values: str):
    """x of one case, as stored. int32: "small" uniform in [-1000, 1000], "wide" over the whole
    int32 range (int32 sums wrap). Floats: "uniform" in [0, 1) (float16: in [0, 2^15 / n) past
    n = 2^15, so the sums, up to about n / 2, stay under its largest finite value 65504 instead of
    overflowing to inf, which the rounded reference would hold too); "exact": -1, 0 or 1, each
    nonzero with a probability that keeps the sum of |x| under 2^23 (so every partial sum, in
    any order, is an integer exact in fp32, fp16 and bf16 store its rounding only)."""
    if dtype == "int32":
        if values == "wide":
            return rng.integers(-2**31, 2**31, size=n, dtype=xp.int64).astype(xp.int32)
        return rng.integers(-1000, 1001, size=n, dtype=xp.int32)
    if values == "uniform":
        scale = min(1.0, 2.0**15 / n) if dtype == "float16" else 1.0
        return to_storage(xp, rng.random(n, dtype=xp.float32) * xp.float32(scale), dtype)
    signs = rng.integers(-1, 2, size=n, dtype=xp.int32).astype(xp.float32)
    keep = rng.random(n, dtype=xp.float32) < xp.float32(min(1.0, 2.0**23 / n))
    return to_storage(xp, xp.where(keep, signs, xp.float32(0.0)), dtype)


def exact_sums(xp, out, expected) -> tuple[float, str]:
    """(0, "") when every output equals the (integer-valued) reference, else (inf, what differs)."""
    wrong = xp.flatnonzero(out.astype(xp.int64) != expected.astype(xp.int64))
    if int(wrong.size):
        first = int(wrong[0])
        return math.inf, (f"{int(wrong.size)} of {out.size} sums differ (at {first}: got {int(out[first])}, "
                          f"want {int(expected[first])})")
    return 0.0, ""


def float_allowance(xp, magnitude, n: int):
    """The summation's share of the per-element bound: u * M_i * (DEPTH + CHAIN sqrt(1 + i / tile))."""
    chained = xp.sqrt(1.0 + xp.arange(n, dtype=xp.float64) / SMALLEST_TILE)
    return FP32_UNIT * magnitude * (DEPTH + CHAIN * chained)


def bound_violation(xp, got, expected, magnitude, dtype: str) -> str:
    """Why the outputs break the per-element bound, or "" (see the module's docstring)."""
    bad = int((~xp.isfinite(got)).sum())
    if bad:
        return f"{bad} of {got.size} outputs are NaN/inf (unwritten, or poisoned input read)"
    exact = float(magnitude[-1]) < EXACT_LIMIT and bool(xp.all(expected == xp.floor(expected)))
    allowed = xp.zeros_like(expected) if exact else float_allowance(xp, magnitude, got.size)
    if dtype != "float32":  # the output's own rounding of a value within `allowed` of the reference
        with np.errstate(over="ignore", invalid="ignore"):
            rounded = round_trip(xp, expected, dtype)
        allowed = allowed + xp.abs(rounded - expected) + DTYPES_UNIT[dtype] * (xp.abs(expected) + allowed)
    over = xp.flatnonzero(xp.abs(got - expected) > allowed)
    if int(over.size):
        first = int(over[0])
        return (f"{int(over.size)} of {got.size} outputs exceed the bound{' (exact sums)' if exact else ''} "
                f"(at {first}: got {float(got[first])!r}, want {float(expected[first])!r}, allowed {float(allowed[first]):.3g})")
    return ""


# Unit roundoff of the half outputs (a prefix perturbed within the bound may round either way).
DTYPES_UNIT = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}


def torch_cumsum_peer(problem: Problem, out_dtype: str) -> Peer | None:
    """torch.cumsum(x, 0, out=out) on the capturing stream (torch_cumsum_into)."""
    torch = torch_cuda()
    if torch is None:
        return None
    exclusive = problem["scan"] == "exclusive"
    into = torch_cumsum_into(torch, exclusive)
    return torch_stream_peer(f"torch.cumsum{' (exclusive: shifted)' if exclusive else ''}",
                             {"x": problem.dtype, "out": out_dtype}, lambda t: into(t["x"], t["out"]))


def torch_cumsum_into(torch, exclusive: bool):
    """(x, out) -> None: torch.cumsum(x, 0, out=out), nothing allocated; exclusive as cumsum of
    x[:-1] into out[1:] and a zero out[0] (torch has no exclusive scan)."""
    def into(x, out) -> None:
        if exclusive:
            torch.cumsum(x[:-1], 0, dtype=out.dtype, out=out[1:])
            out[:1].zero_()  # after the scan: zeroed first, out[0] was once found still poisoned (int32, H100, in a run short of GPU memory)
        else:
            torch.cumsum(x, 0, out=out)

    return into
