"""HISTOGRAM: counts[b] = how many x[i] == b, for b in [0, bins); int32 x of any length. Values
outside [0, bins) are ignored. Template: templates/histogram/kernel.cu.j2.

Counts are 32-bit. The Python call returns them as int32 by default, or in an `out` array of
int32 or uint32: the kernels write the same bits either way (a count is at most n <= 2^31 - 1,
which both types hold), so the counts dtype changes no binary and is not part of the problem.

The data distribution is a trait (`--distribution uniform|skewed`): with uniform values the
privatised shared-memory histograms win; with most values in a few bins, atomics on one address
serialise and warp aggregation (__match_any_sync) or several sub-histogram copies pay off. The
Python call takes it as a hint (`distribution=`) naming the tuned kernel to serve; any kernel
computes the right counts for any data.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from autogen.core.family import Family, Launch, Peer, Step, Trait
from autogen.core.operands import device_array, kernel_scalar, new_output
from autogen.core.problem import Config, Problem
from autogen.core.registry import register
from autogen.core.signature import OpSignature, Output, Scalar, Tensor
from autogen.core.space import Param, Space
from autogen.errors import ArgumentError, GpuUnavailableError
from autogen.families._tiles import grid_blocks, init_launch, one_wave, tile_overshoot_reason
from autogen.families.cub_peers import cub_library
from autogen.gpu.device import require_cupy
from autogen.gpu.peers import ReplayArena

SHARED_LIMIT_BYTES = 48 * 1024  # dynamic shared memory a launch gets without cudaFuncSetAttribute
POISON = 0xDEADBEEF  # counts before the launch: the init step must overwrite every one

# The skewed distribution: SKEW_FRACTION of the values fall in HOT_BINS bins (drawn per input
# set), the rest are uniform over [0, bins).
HOT_BINS = 4
SKEW_FRACTION = 0.9

DISTRIBUTION = Trait("distribution", ("uniform", "skewed"),
                     help=f"uniform over [0, bins), or skewed: {SKEW_FRACTION:.0%} of the values in {HOT_BINS} bins")


def _copies_only_in_shared(p) -> str | None:
    if p["target"] == "global" and p["copies"] != 1:
        return "copies > 1 are sub-histograms in shared memory (target=shared)"
    return None


def _items_fit_registers(p) -> str | None:
    # At 1024 threads a thread has 64 registers: 32 loaded items plus addresses would spill.
    if p["block_size"] == 1024 and p["items_per_thread"] > 16:
        return "items_per_thread > 16 does not fit the registers at block_size=1024"
    return None


SPACE = Space(
    params=(
        Param("target", ("global", "shared"), "t",
              "atomics on the output in global memory, or per-block sub-histograms in shared memory"),
        Param("aggregate", ("none", "warp"), "a",
              "one atomic per element, or one per distinct bin of a warp (__match_any_sync + __popc)"),
        Param("copies", (1, 2, 4, 8, 16), "c",
              "shared-memory sub-histograms per block (lane % copies picks one): spreads same-bin atomics"),
        Param("block_size", (128, 256, 512, 1024), "bs", "threads per block"),
        Param("vector_width", (1, 2, 4), "vw", "ints per load (4: 16-byte loads)"),
        Param("items_per_thread", (4, 8, 16, 32), "ipt", "elements each thread loads per tile before counting"),
        Param("blocks_per_sm", (1, 2, 4, 8), "bps",
              "grid = min(tiles, SMs x blocks_per_sm): fewer blocks flush fewer sub-histograms"),
    ),
    constraints=(_copies_only_in_shared, one_wave, _items_fit_registers),
)


@register
class Histogram(Family):
    name = "histogram"
    api = "histogram"
    reuse_bound_calls = True  # bind only checks and arranges (autogen.runtime.bound_calls)
    dims = ("n", "bins")
    # Shapes with tails for the export's self-test (Family.tail_shapes).
    tail_shapes = ((1, 1), (3, 5), (1000, 256), (4097, 1), (70001, 4096), (1048579, 20000))
    traits = (DISTRIBUTION,)
    dtypes = ("int32",)
    space = SPACE
    default_params = {"target": "shared", "aggregate": "none", "copies": 1, "block_size": 256,
                      "vector_width": 4, "items_per_thread": 16, "blocks_per_sm": 4}
    outputs = ("counts",)
    op_signature = OpSignature((Tensor("x"), Scalar("bins", "int"), Scalar("distribution", "str", "uniform")),
                               (Output("out", lambda bins: (bins,), "int32"),))
    # counts: `bins` 32-bit counts, int or unsigned int (the same bits).
    c_params = "const int* x, void* counts, int n, int bins"
    tolerance = 1e-12  # compare() is exact (every count): it returns 0 or inf
    description = "counts[b] = #{i : x[i] == b} for b in [0, bins), int32 x; values outside [0, bins) ignored"

    # --- geometry (a grid of blocks_per_sm >= 1 persistent blocks: autogen.families._tiles) ---
    @staticmethod
    def shared_bytes(problem: Problem, config: Config) -> int:
        """Dynamic shared memory of the main kernel: the sub-histograms when they fit 48 KiB,
        else none (the kernel then counts in global memory)."""
        if config["target"] != "shared":
            return 0
        need = problem["bins"] * config["copies"] * 4
        return need if need <= SHARED_LIMIT_BYTES else 0

    def launch(self, problem: Problem, config: Config) -> Launch:
        return Launch(grid=(grid_blocks(problem["n"], config), 1, 1), block=(config["block_size"], 1, 1),
                      shared_bytes=self.shared_bytes(problem, config))

    def plan(self, problem: Problem, config: Config) -> list[Step]:
        n, bins = kernel_scalar(problem["n"], np.int32), kernel_scalar(problem["bins"], np.int32)  # converted once
        return [Step("_init", init_launch(problem["bins"]), lambda inputs: (inputs["counts"], bins)),
                Step("", self.launch(problem, config), lambda inputs: (inputs["x"], inputs["counts"], n, bins))]

    def reject_reason(self, problem: Problem, config: Config) -> str | None:
        n, bins = problem["n"], problem["bins"]
        if config["target"] == "shared" and self.shared_bytes(problem, config) == 0:
            return (f"bins*copies*4 = {bins * config['copies'] * 4} bytes exceed {SHARED_LIMIT_BYTES} of shared "
                    "memory: the variant would count in global memory")
        reason = tile_overshoot_reason(n, config)
        if reason:
            return reason
        if config["aggregate"] == "warp" and bins == 1 and config["copies"] > 1:
            return "one bin: copies only split what warp aggregation already merged"
        return None

    # --- data -----------------------------------------------------------------------------
    def validation_cases(self, problem: Problem) -> list[dict]:
        # The problem's distribution, then values outside [0, bins) mixed in (ignored), with
        # int32 extremes, and every value in one bin (all 32 lanes of a warp on one address).
        return [{"values": problem["distribution"]}, {"values": "out_of_range"}, {"values": "one_bin"}]

    def timing_case(self, problem: Problem) -> dict:
        return {"values": problem["distribution"]}

    def make_inputs(self, problem: Problem, xp, rng, case: dict) -> dict:
        n, bins = problem["n"], problem["bins"]
        return {"x": histogram_values(xp, rng, n, bins, case["values"]),
                "counts": xp.full((bins,), POISON, dtype=xp.uint32)}

    def reference(self, problem: Problem, inputs: dict, xp=np):
        x, bins = inputs["x"], problem["bins"]
        inside = x[(x >= 0) & (x < bins)]
        return xp.bincount(inside, minlength=bins).astype(xp.float64)

    def export_compare(self, problem: Problem, configs: tuple = ()) -> str:
        return "exact"  # as exact_counts

    def compare(self, problem: Problem, inputs: dict, expected, magnitude, xp=np) -> tuple[float, str]:
        return exact_counts(xp, inputs["counts"], expected)

    def bytes_moved(self, problem: Problem, case: dict | None = None) -> int:
        return 4 * problem["n"] + 4 * problem["bins"]

    def flops(self, problem: Problem) -> int:
        return 0

    def peer(self, problem: Problem) -> Peer | None:
        """CUB's DeviceHistogram::HistogramEven from the benchmark's nvcc build
        (scripts/cub_peers.cu, named by AUTOGEN_CUB_PEERS) when present; else cupy.histogram with
        CuPy's CUB accelerator (HistogramRange over float bin edges, plus CuPy's own set-up
        kernels), under a ReplayArena so its allocations are safe inside stream capture."""
        try:
            cupy = require_cupy()
        except GpuUnavailableError:
            return None
        cub = cub_library()
        if cub is not None:
            return cub.histogram_peer(cupy, problem["n"], problem["bins"])
        return cupy_histogram_peer(cupy, problem["n"], problem["bins"])

    # --- calls from Python ----------------------------------------------------------------
    def bind(self, cupy, device: int, args: tuple, kwargs: dict):
        """autogen.histogram(x, bins, out=None, distribution="uniform") -> counts

        counts[b] = how many x[i] == b for b in [0, bins); values outside [0, bins) are
        ignored. x: 1-d int32 (CuPy, PyTorch, ...). out: `bins` int32 or uint32 counts (default:
        a new int32 array of the caller's kind). distribution ("uniform" or "skewed") only picks
        which tuned kernel is served; every kernel counts any data exactly."""
        x, bins, out, distribution = _histogram_arguments(*args, **kwargs)
        xv = device_array(cupy, x, "x", self.dtypes, 1, device)
        if isinstance(bins, bool) or not isinstance(bins, (int, np.integer)) or not 1 <= bins <= 2**31 - 1:
            raise ArgumentError(f"bins must be an integer between 1 and {2**31 - 1}, got {bins!r}")
        if out is None:
            out = new_output(cupy, x, (int(bins),), "int32")
        counts = device_array(cupy, out, "out", ("int32", "uint32"), 1, device)
        if counts.shape[0] != bins:
            raise ArgumentError(f"out has {counts.shape[0]} counts, but bins={bins}")
        problem = self._problem_of(xv.shape[0], int(bins), distribution)
        return problem, {"x": xv, "counts": counts}, out

    def example_call(self, problem: Problem, cupy):
        bins = problem["bins"]
        x = cupy.random.default_rng(0).integers(0, bins, problem["n"], dtype=cupy.int32)
        return (x, bins), {"out": cupy.empty(bins, dtype=cupy.int32), "distribution": problem["distribution"]}

    @functools.lru_cache(maxsize=1024)
    def _problem_of(self, n: int, bins: int, distribution: str) -> Problem:
        if n < 1:
            raise ArgumentError("x is empty: histogram needs at least one element")
        return self.problem("int32", n=n, bins=bins, distribution=distribution)


def _histogram_arguments(x, bins, out=None, distribution="uniform"):
    return x, bins, out, distribution


def histogram_values(xp, rng, n: int, bins: int, kind: str):
    """int32 values of one validation or timing case (xp: numpy or cupy)."""
    if kind == "uniform":
        return rng.integers(0, bins, size=n, dtype=xp.int32)
    if kind == "skewed":
        hot = rng.integers(0, bins, size=HOT_BINS, dtype=xp.int32)
        pick = hot[rng.integers(0, HOT_BINS, size=n, dtype=xp.int32)]
        spread = rng.integers(0, bins, size=n, dtype=xp.int32)
        return xp.where(rng.random(n, dtype=xp.float32) < SKEW_FRACTION, pick, spread).astype(xp.int32)
    if kind == "one_bin":
        return xp.full((n,), int(rng.integers(0, bins)), dtype=xp.int32)
    if kind == "out_of_range":
        # Uniform over [-bins, 2 bins) in int64 (2 bins may pass 2^31), clipped to int32, plus
        # the extremes: about a third of the values are in range.
        low, high = -bins, 2 * bins
        values = rng.integers(low, high, size=n, dtype=xp.int64)
        values = xp.clip(values, -2**31, 2**31 - 1).astype(xp.int32)
        extremes = xp.asarray(np.array([-2**31, 2**31 - 1, -1, bins, bins - 1, 0], dtype=np.int32))
        count = min(n, extremes.size)
        values[:count] = extremes[:count]
        values[n - count:] = extremes[:count][::-1]
        return values
    raise ValueError(f"unknown histogram case {kind!r}")


def exact_counts(xp, counts, expected) -> tuple[float, str]:
    """(0, "") when every count equals the reference, else (inf, which bins differ)."""
    got = counts.astype(xp.int64)
    want = expected.astype(xp.int64)
    wrong = xp.flatnonzero(got != want)
    if int(wrong.size) == 0:
        return 0.0, ""
    first = int(wrong[0])
    return math.inf, (f"{int(wrong.size)} of {want.size} counts differ (bin {first}: got {int(got[first])}, "
                      f"want {int(want[first])})")


def cupy_histogram_peer(cupy, n: int, bins: int) -> Peer:
    """cupy.histogram(x, bins, range=(0, bins)) with the CUB accelerator, its int64 counts cast
    into the 32-bit output. range is given, so CuPy never reads x.min()/x.max() (a sync)."""
    from cupy._core import _accelerator

    def with_cub(call):
        saved = _accelerator.get_routine_accelerators()
        _accelerator.set_routine_accelerators(["cub"])
        try:
            return call()
        finally:
            _accelerator.set_routine_accelerators(saved)

    def histogram(x, counts):
        hist, _edges = cupy.histogram(x, bins=bins, range=(0, bins))
        cupy.copyto(counts, hist, casting="unsafe")

    sample = cupy.zeros((n,), dtype=cupy.int32)
    sample_counts = cupy.zeros((bins,), dtype=cupy.uint32)
    arena = ReplayArena(cupy, lambda: with_cub(lambda: histogram(sample, sample_counts)))
    del sample, sample_counts

    def run(inputs: dict) -> None:
        arena.run(lambda: with_cub(lambda: histogram(inputs["x"], inputs["counts"])))

    return Peer("cupy.histogram (CUB HistogramRange)", run)
