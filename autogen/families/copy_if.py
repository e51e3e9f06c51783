"""COPY_IF (stream compaction): values[0..count) = the x[i] > threshold, count[0] = how many; x
int32 or float32 of any length; NaN is never selected. Template: templates/copy_if/kernel.cu.j2.

Two outputs: `values`, a buffer of n elements whose first `count` are the selected ones, and
`count`, one int32 on the device (the call never waits for the GPU, so it stays capturable).

Traits (part of the database key, `--selectivity` and `--order` on the command line):
  selectivity  the share of x selected, as a class: p01 below 10%, p50 from 10% to 90%, p99
               above 90% (tuning data: 1%, 50%, 99%). A fraction ("0.5", "50%") is mapped to
               its class. The Python call cannot know it before running, so it takes a hint
               (`selectivity=`, default "p50"): it only picks which tuned kernel is served.
  order        "ordered" (the default): the selected values keep their input order, as
               torch.masked_select's; "unordered": any order (validated as a multiset), served
               only when asked for (`ordered=False`). Ordered variants also serve unordered
               problems; unordered variants never serve ordered ones.

Workspace (as reduce's `partials`): `status` (one 64-bit word per tile, for the largest tile
count any variant launches on this shape), `ticket` (one word) and `block_counts` (one word
per block of the largest grid) live in the inputs dict; `_init` resets what a launch relies on.
The exported host launchers take theirs with cudaMallocAsync/cudaFreeAsync on the stream.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from autogen.core.family import Family, Launch, Peer, Step, Trait
from autogen.core.operands import device_array, dtype_name, kernel_scalar, new_output, stream_workspace
from autogen.core.problem import Config, Problem
from autogen.core.registry import register
from autogen.core.signature import OpSignature, Output, Scalar, Tensor
from autogen.core.space import Param, Space
from autogen.errors import ArgumentError, GpuUnavailableError, InvalidConfigError, UsageError
from autogen.families._tiles import grid_blocks, INIT_BLOCK, init_launch, one_wave, tile, tile_overshoot_reason, tiles
from autogen.families.cub_peers import cub_library
from autogen.gpu.device import require_cupy, sm_count

ORDERED_MODES = ("lookback", "two_pass")
UNORDERED_MODES = ("block", "warp", "thread")
PIPELINED_MODES = ("lookback", "block")  # persistent blocks load the next tile during the current one
# Class -> the fraction tuning data selects; the boundaries of the classes.
FRACTIONS = {"p01": 0.01, "p50": 0.5, "p99": 0.99}
LOW, HIGH = 0.1, 0.9
INT_SPAN = 2**31  # int32 data is uniform over [-2^30, 2^30)
INT_LOW = -2**30
INT_POISON = -2**31  # never selected: INT_MIN > t is false for every int32 threshold t
MAX_STAGE_BYTES = 32 * 1024  # scatter=shared: the staged tile in static shared memory (48 KiB at most)
# Same-address atomics on one counter are served one after another at L2 (the order of one per
# nanosecond): a variant whose launch needs more than max(ATOMICS_FLOOR, n / ATOMICS_PER_ELEMENTS)
# of them would spend longer queueing on the counter than reading x (~1 KiB per ns), so it is
# pruned: mode=thread (n / items_per_thread atomics) on all but small n, warp at 4 items.
ATOMICS_FLOOR = 4096
ATOMICS_PER_ELEMENTS = 256


def selectivity_class(text: str) -> str:
    """"p50" stays; a fraction ("0.5", "50%") in [0, 1] becomes its class: p01 below 0.1, p99
    above 0.9, else p50. Anything else is returned as it is (Trait.value refuses it)."""
    text = str(text).strip()
    if text in FRACTIONS:
        return text
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        return text
    if not 0.0 <= value <= 1.0:
        return text
    return "p01" if value < LOW else "p99" if value > HIGH else "p50"


SELECTIVITY = Trait("selectivity", tuple(FRACTIONS), parse=selectivity_class,
                    help=f"share of x selected: p01 (< {LOW:g}), p50, p99 (> {HIGH:g}); a fraction like 0.5 maps to its class")
ORDER = Trait("order", ("ordered", "unordered"),
              help="ordered keeps the input order (as torch.masked_select); unordered may be faster")


def _items_fit_registers(p) -> str | None:
    # 64 registers per thread at 1024 threads (128 at 512): the items and their row ranks (and,
    # in the pipelined persistent modes, the next tile's items too).
    limit = {1024: 8, 512: 16}.get(p["block_size"], 32)
    if p["items_per_thread"] > limit:
        return f"items_per_thread > {limit} does not fit the registers at block_size={p['block_size']}"
    if p["blocks_per_sm"] > 0 and p["mode"] in PIPELINED_MODES and 2 * p["items_per_thread"] > limit:
        # Two tiles' words live at once (nvcc: bs512 ipt16 spills; bs256 ipt32 takes 215
        # registers, one block per SM).
        return (f"pipelined persistent {p['mode']} holds 2 x items_per_thread words: > {limit} at "
                f"block_size={p['block_size']}")
    return None


def _staging_fits(p) -> str | None:
    if p["scatter"] != "shared":
        return None
    if p["mode"] in ("warp", "thread"):
        # Their warps never meet at a barrier (no block-wide tile order to stage): the same
        # kernel as scatter=direct under another name.
        return f"mode={p['mode']} stores from registers (scatter=shared would be a duplicate)"
    if 4 * p["block_size"] * p["items_per_thread"] > MAX_STAGE_BYTES:
        return (f"a staged tile of {p['block_size'] * p['items_per_thread']} words exceeds "
                f"{MAX_STAGE_BYTES // 1024} KiB of shared memory")
    return None


def _two_pass_grid(p) -> str | None:
    # Its middle step scans one count per block in ONE block: a grid of one block per tile
    # (up to millions) would make that scan the bottleneck; two_pass needs a persistent grid.
    if p["mode"] == "two_pass" and p["blocks_per_sm"] == 0:
        return "two_pass scans one count per block in one block: it needs blocks_per_sm >= 1"
    return None


SPACE = Space(
    params=(
        # The first choice of each parameter is the state of the art for its order: lookback
        # (ordered) and block (unordered); the default picks them.
        Param("mode", ORDERED_MODES + UNORDERED_MODES, "m",
              "ordered: single-pass decoupled look-back, or reduce-then-scan in two passes over x; "
              "unordered: one global atomic per block, per warp (ballot + popc) or per thread and tile"),
        Param("block_size", (128, 256, 512, 1024), "bs", "threads per block"),
        Param("vector_width", (1, 2, 4), "vw", "elements per load (4: 16-byte loads)"),
        Param("items_per_thread", (4, 8, 16, 32), "ipt", "elements each thread holds per tile"),
        Param("blocks_per_sm", (0, 1, 2, 4, 8), "bps",
              "0: one block per tile (as CUB); N: min(tiles, SMs x N) persistent blocks looping over tiles, "
              "loading the next tile during the current one's look-back"),
        Param("scatter", ("shared", "direct"), "sc",
              "shared: stage the tile's selected elements in shared memory, then coalesced stores; "
              "direct: store from registers"),
    ),
    constraints=(one_wave, _items_fit_registers, _staging_fits, _two_pass_grid),
)


@register
class CopyIf(Family):
    name = "copy_if"
    selftest_includes = ("cub/device/device_radix_sort.cuh", "cub/device/device_select.cuh")  # its GPU check
    api = "copy_if"
    reuse_bound_calls = True  # bind only checks and arranges (autogen.runtime.bound_calls)
    dims = ("n",)
    tail_shapes = ((1,), (2,), (3,), (33,), (1000,), (4097,), (65537,), (1048579,))  # the export's tails
    traits = (SELECTIVITY, ORDER)
    dtypes = ("int32", "float32")
    space = SPACE
    # Ordered, so that the default serves both orders (default_config gives unordered problems the
    # block-aggregated one-pass kernel). One block per 4096-element tile as CUB, 16-byte loads, staged stores.
    default_params = {"mode": "lookback", "block_size": 256, "vector_width": 4, "items_per_thread": 16,
                      "blocks_per_sm": 0, "scatter": "shared"}
    outputs = ("values", "count")
    op_signature = OpSignature(
        (Tensor("x"), Scalar("threshold", "number"), Scalar("ordered", "bool", True),
         Scalar("selectivity", "str", optional=True)),
        (Output("values", lambda x: tuple(x.shape), "x"), Output("count", lambda: (1,), "int32")))
    c_params = "const int* x, int* values, int* count, int n, int threshold"
    tolerance = 1e-12  # compare() is exact (the count and every selected value): 0 or inf
    description = "values[0..count) = x[x > threshold] (input order unless unordered), int32 or float32"

    def c_params_for(self, dtype: str) -> str:
        elem = "int" if dtype == "int32" else "float"
        return f"const {elem}* x, {elem}* values, int* count, int n, {elem} threshold"

    # --- geometry (tiles and grids: autogen.families._tiles) -------------------------------
    def default_config(self, problem: Problem | None = None) -> Config:
        """The ordered default (it serves both orders); an unordered problem starts its search
        from the same geometry in mode=block (one pass, one atomic per tile, no look-back)."""
        config = self.space.check(self.default_params)
        if problem is not None and problem["order"] == "unordered":
            return self.space.check({**config.as_dict(), "mode": "block"})
        return config

    def seed_configs(self, problem: Problem) -> list[Config]:
        """The default first; for an ordered problem also its 8192-element tiles (32 items per
        thread): fewer tiles, so fewer look-backs, which won every ordered problem at 2^24 and
        2^28 (docs/families/histogram_copy_if.md)."""
        default = self.default_config(problem)
        if problem["order"] == "unordered":
            return [default]
        return [default, self.space.check({**default.as_dict(), "items_per_thread": 32})]

    @staticmethod
    def atomics(problem: Problem, config: Config) -> int:
        """The most same-address atomics on count one launch of an unordered mode makes."""
        n, mode = problem["n"], config["mode"]
        if mode == "thread":
            return -(-n // config["items_per_thread"])
        if mode == "warp":
            return -(-n // (32 * config["items_per_thread"]))
        if mode == "block":
            return -(-n // tile(config))
        return 0

    def launch(self, problem: Problem, config: Config) -> Launch:
        return Launch(grid=(grid_blocks(problem["n"], config), 1, 1), block=(config["block_size"], 1, 1))

    @functools.lru_cache(maxsize=1024)  # on every dispatched call: computed once per problem
    def workspace_sizes(self, problem: Problem) -> tuple[int, int]:
        """(status words, block counts) for the largest tile count of the space and the largest
        grid of two_pass (the only mode with one count per block; always persistent)."""
        smallest_tile = min(SPACE.param("block_size").choices) * min(SPACE.param("items_per_thread").choices)
        most_tiles = -(-problem["n"] // smallest_tile)
        most_blocks = min(most_tiles, sm_count() * max(SPACE.param("blocks_per_sm").choices))
        return most_tiles, max(1, most_blocks)

    def plan(self, problem: Problem, config: Config) -> list[Step]:
        steps = self._steps(problem, config)
        if problem["order"] == "ordered" and config["mode"] not in ORDERED_MODES:
            # An unordered variant may keep the order by chance (one tile, or tiles finishing in
            # order), pass validation and be stored for an ordered problem: its launches refuse
            # to run instead (the tuner records a failure). reject_reason prunes it first; this
            # also stops a warm-start seed, which skips pruning.
            def refuse(inputs: dict):
                raise InvalidConfigError(f"mode={config['mode']} is unordered; {problem} needs input order")
            steps = [Step(step.suffix, step.launch, refuse) for step in steps]
        return steps

    def _steps(self, problem: Problem, config: Config) -> list[Step]:
        mode = config["mode"]
        main = self.launch(problem, config)
        # Scalars converted once (kernel_scalar): a dispatched call converts nothing on the hot path.
        count, blocks = tiles(problem["n"], config), main.grid[0]
        n, tiles_arg, blocks_arg = (kernel_scalar(v, np.int32) for v in (problem["n"], count, blocks))
        zero, one = kernel_scalar(0, np.int32), kernel_scalar(1, np.int32)
        kind = np.int32 if problem.dtype == "int32" else np.float32

        def cast(threshold):
            return kernel_scalar(threshold, kind)

        def sized(inputs: dict, name: str, need: int):
            buffer = inputs[name]
            if buffer.size < need:  # never write past the workspace
                raise ValueError(f"{name} holds {buffer.size} words; this launch needs {need}")
            return buffer

        if mode == "two_pass":
            return [
                Step("", main, lambda inputs: (inputs["x"], n, cast(inputs["threshold"]),
                                               sized(inputs, "block_counts", blocks))),
                Step("_scan", Launch(grid=(1, 1, 1), block=(config["block_size"], 1, 1)),
                     lambda inputs: (sized(inputs, "block_counts", blocks), blocks_arg, inputs["count"])),
                Step("_scatter", main, lambda inputs: (inputs["x"], inputs["values"], n, cast(inputs["threshold"]),
                                                       sized(inputs, "block_counts", blocks))),
            ]
        if mode == "lookback":
            return [
                Step("_init", init_launch(count), lambda inputs: (sized(inputs, "status", count), tiles_arg,
                                                                  inputs["ticket"], inputs["count"], zero)),
                Step("", main, lambda inputs: (inputs["x"], inputs["values"], inputs["count"], n,
                                               cast(inputs["threshold"]), sized(inputs, "status", count),
                                               inputs["ticket"])),
            ]
        init = Launch(grid=(1, 1, 1), block=(INIT_BLOCK, 1, 1))
        return [
            Step("_init", init, lambda inputs: (inputs["status"], zero, inputs["ticket"], inputs["count"],
                                                one)),
            Step("", main, lambda inputs: (inputs["x"], inputs["values"], inputs["count"], n,
                                           cast(inputs["threshold"]))),
        ]

    def reject_reason(self, problem: Problem, config: Config) -> str | None:
        if problem["order"] == "ordered" and config["mode"] not in ORDERED_MODES:
            return f"mode={config['mode']} does not keep the input order"
        n = problem["n"]
        reason = tile_overshoot_reason(n, config)
        if reason:
            return reason
        atomics = self.atomics(problem, config)
        if atomics > max(ATOMICS_FLOOR, n // ATOMICS_PER_ELEMENTS):
            return (f"mode={config['mode']} makes up to {atomics} atomics on one counter for n={n} "
                    f"(they serialise: more than max({ATOMICS_FLOOR}, n/{ATOMICS_PER_ELEMENTS}))")
        if (config["blocks_per_sm"] > 0 and config["mode"] != "two_pass"
                and tiles(n, config) <= sm_count() * config["blocks_per_sm"]):
            # Every block gets one tile: the launch of blocks_per_sm=0 (plus a wasted ticket)
            # under another name. two_pass has no blocks_per_sm=0.
            return (f"{tiles(n, config)} tiles fit one wave of blocks_per_sm={config['blocks_per_sm']}: "
                    f"the same launch as blocks_per_sm=0")
        return None

    # --- data -----------------------------------------------------------------------------
    def validation_cases(self, problem: Problem) -> list[dict]:
        # The problem's selectivity (float data with NaN and infinities mixed in), then nothing
        # selected (count 0) and everything selected (the output is x).
        return [{"select": problem["selectivity"]}, {"select": "none"}, {"select": "all"}]

    def timing_case(self, problem: Problem) -> dict:
        return {"select": problem["selectivity"], "clean": True}

    def make_inputs(self, problem: Problem, xp, rng, case: dict) -> dict:
        n = problem["n"]
        x, threshold = copy_if_values(xp, rng, n, problem.dtype, case["select"], case.get("clean", False))
        poison = xp.nan if problem.dtype == "float32" else INT_POISON
        status_words, block_words = self.workspace_sizes(problem)
        return {"x": x, "threshold": threshold,
                "values": xp.full((n,), poison, dtype=problem.dtype),
                "count": xp.full((1,), -1, dtype=xp.int32),
                # Poisoned: _init must reset what a variant relies on.
                "status": xp.full((status_words,), 0xFFFFFFFFFFFFFFFF, dtype=xp.uint64),
                "ticket": xp.full((1,), 0xFFFFFFFF, dtype=xp.uint32),
                "block_counts": xp.full((block_words,), 0xFFFFFFFF, dtype=xp.uint32)}

    def reference(self, problem: Problem, inputs: dict, xp=np):
        x = inputs["x"]
        chosen = x[x > x.dtype.type(inputs["threshold"])].astype(xp.float64)
        values = xp.full((x.size,), xp.nan, dtype=xp.float64)
        values[:chosen.size] = chosen
        return {"values": values, "count": xp.full((1,), float(chosen.size), dtype=xp.float64)}

    def export_compare(self, problem: Problem, configs: tuple = ()) -> str:
        # As exact_selection (NaN past the count is free); in order only where every variant keeps it.
        kept = problem["order"] == "ordered" and all(c["mode"] in ORDERED_MODES for c in configs)
        return "exact" if kept else "exact_multiset"

    def compare(self, problem: Problem, inputs: dict, expected, magnitude, xp=np) -> tuple[float, str]:
        return exact_selection(xp, inputs["values"], inputs["count"], expected,
                               ordered=problem["order"] == "ordered")

    def bytes_moved(self, problem: Problem, case: dict | None = None) -> int:
        n = problem["n"]
        return 4 * n + 4 * round(n * FRACTIONS[problem["selectivity"]]) + 4

    def peer(self, problem: Problem) -> Peer | None:
        """CUB's DeviceSelect::If (stable, so ordered) from the benchmark's nvcc build
        (scripts/cub_peers.cu, named by AUTOGEN_CUB_PEERS); None without it: CuPy has no
        capturable select, and torch.masked_select synchronises to size its output."""
        try:
                cupy = require_cupy()
        except GpuUnavailableError:
            return None
        cub = cub_library()
        return cub.select_peer(cupy, problem.dtype, problem["n"]) if cub is not None else None

    # --- calls from Python ----------------------------------------------------------------
    def bind(self, cupy, device: int, args: tuple, kwargs: dict):
        """autogen.copy_if(x, threshold, ordered=True, selectivity=None) -> (values, count)

        values[0..count) = the x[i] > threshold (NaN never), in input order unless
        ordered=False; values has x's length and dtype (int32 or float32), the entries past
        count are unspecified; count is a 1-element int32 device array (read it when you need
        it: the call does not wait for the GPU). selectivity (a class p01/p50/p99 or a fraction
        such as 0.3; default p50) is a hint that picks the tuned kernel; any kernel is exact.
        values= and count= take the outputs (then nothing is allocated: the call can be captured
        in a CUDA graph once warmed up)."""
        x, threshold, ordered, selectivity, values, count = _copy_if_arguments(*args, **kwargs)
        xv = device_array(cupy, x, "x", self.dtypes, 1, device)
        dtype = dtype_name(xv)
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.integer, np.floating)):
            raise ArgumentError(f"threshold must be a number, got {threshold!r}")
        if dtype == "int32" and not (math.isfinite(float(threshold)) and float(threshold).is_integer()):
            raise ArgumentError(f"int32 x needs an integer threshold, got {threshold!r}")
        problem = self._problem_of(dtype, xv.shape[0], "p50" if selectivity is None else str(selectivity),
                                   "ordered" if ordered else "unordered")
        values = new_output(cupy, x, (xv.shape[0],), dtype) if values is None else values
        count = new_output(cupy, x, (1,), "int32") if count is None else count
        valuesv = device_array(cupy, values, "values", (dtype,), 1, device)
        if valuesv.shape[0] != xv.shape[0]:
            raise ArgumentError(f"values has {valuesv.shape[0]} elements, but x has {xv.shape[0]}")
        countv = device_array(cupy, count, "count", ("int32",), 1, device)
        if countv.shape[0] != 1:
            raise ArgumentError(f"count must hold one int32, got {countv.shape[0]}")
        status_words, block_words = self.workspace_sizes(problem)
        # Per device and stream (the plan's _init step resets them each launch): no allocation.
        status, ticket, block_counts = stream_workspace(
            cupy, device, x, "copy_if", ((status_words, "uint64"), (1, "uint32"), (block_words, "uint32")))
        inputs = {"x": xv, "threshold": _clamped(threshold, dtype), "values": valuesv, "count": countv,
                  "status": status, "ticket": ticket, "block_counts": block_counts}
        return problem, inputs, (values, count)

    def example_call(self, problem: Problem, cupy):
        n = problem["n"]
        x = cupy.random.default_rng(0).integers(-1000, 1000, n, dtype=cupy.int32).astype(problem.dtype)
        return (x, 0), {"ordered": problem["order"] == "ordered", "selectivity": problem["selectivity"],
                        "values": cupy.empty(n, dtype=problem.dtype), "count": cupy.empty(1, dtype=cupy.int32)}

    @functools.lru_cache(maxsize=1024)
    def _problem_of(self, dtype: str, n: int, selectivity: str, order: str) -> Problem:
        if n < 1:
            raise ArgumentError("x is empty: copy_if needs at least one element")
        try:
            return self.problem(dtype, n=n, selectivity=selectivity, order=order)
        except UsageError as exc:
            raise ArgumentError(str(exc)) from None


def _copy_if_arguments(x, threshold, ordered=True, selectivity=None, values=None, count=None):
    return x, threshold, ordered, selectivity, values, count


def _clamped(threshold, dtype: str):
    """The threshold as the kernel's type (float32 x: rounded to float32, as torch compares)."""
    if dtype == "float32":
        return np.float32(threshold)
    if not -2**31 <= threshold <= 2**31 - 1:
        raise ArgumentError(f"int32 x needs a threshold in the int32 range, got {threshold!r}")
    return np.int32(int(threshold))


def copy_if_values(xp, rng, n: int, dtype: str, select: str, clean: bool = False):
    """(x, threshold) of one case: x uniform (int32 over [-2^30, 2^30), float32 over [0, 1)),
    the threshold picked so that the class's fraction is selected; "none" and "all" select
    nothing and everything. Float data that is not `clean` holds NaN (never selected), +inf
    (selected) and -inf and -0.0 (not) in a few places, edges included."""
    if dtype == "int32":
        x = rng.integers(INT_LOW, INT_LOW + INT_SPAN, size=n, dtype=xp.int32)
        if select == "none":
            return x, int(INT_LOW + INT_SPAN)  # every x is below it
        if select == "all":
            return x, int(INT_LOW - 1)
        # P(x > t) = (INT_LOW + INT_SPAN - 1 - t) / INT_SPAN = fraction
        return x, int(INT_LOW + INT_SPAN - 1 - round(FRACTIONS[select] * INT_SPAN))
    x = rng.random(n, dtype=xp.float32)
    if select == "none":
        threshold = 1.0
    elif select == "all":
        threshold = -1.0
    else:
        threshold = float(np.float32(1.0 - FRACTIONS[select]))
    if not clean and select != "all":
        specials = xp.asarray(np.array([np.nan, np.inf, -np.inf, -0.0, np.nan], dtype=np.float32))
        count = min(n, specials.size)
        x[:count] = specials[:count]
        x[n - count:] = specials[:count]
        if n > 64:
            x[n // 2: n // 2 + count] = specials[:count]
    if select == "none" and not clean:
        x[xp.isposinf(x)] = 0.5  # nothing may be above the threshold
    return x, threshold


def exact_selection(xp, values, count, expected, ordered: bool) -> tuple[float, str]:
    """(0, "") when the count and the selected values match the reference exactly (in order,
    or as a multiset when not ordered); else (inf, what differs). Entries past count are free."""
    want_count = int(expected["count"][0])
    got_count = int(count[0])
    if got_count != want_count:
        return math.inf, f"count is {got_count}, want {want_count}"
    got = values[:want_count].astype(xp.float64)
    want = expected["values"][:want_count]
    unwritten = int(xp.isnan(got).sum())  # NaN is never selected: a NaN here is poison left unwritten
    if unwritten:
        return math.inf, f"{unwritten} of the first {want_count} values are unwritten (poison)"
    if not ordered:
        got, want = xp.sort(got), xp.sort(want)
    wrong = xp.flatnonzero(got != want)
    if int(wrong.size):
        first = int(wrong[0])
        how = "in order" if ordered else "as multisets (sorted)"
        return math.inf, (f"{int(wrong.size)} of {want_count} values differ {how} (at {first}: got {float(got[first])!r}, "
                          f"want {float(want[first])!r})")
    return 0.0, ""
