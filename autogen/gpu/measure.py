"""Validation against float64 and GPU-side timing with CUDA graphs (see shared anchors.md).

Why graphs: a launch from Python costs several microseconds of host time, which hides every
small kernel; inside a graph an empty kernel costs far less (shared anchors.md). Why rotating input sets: weights in real inference
come from HBM, so by default ("cold") each launch reads a set that is not in L2; its results go to
buffers recycled as an allocator recycles them (RECYCLED_RESULTS).
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np


MAX_SETS = 256  # rotating input sets; enough to exceed 4x L2 even for tiny shapes
# Results are written to this many buffers in turn, not one per input set: in a model a result is
# read by the next operation and freed, and the allocator gives its block to the next call's, so a
# result that fits in L2 is written over lines still there. It changes the ranking where the
# result fits in L2 (docs/families/elementwise.md, "Timing with recycled results").
RECYCLED_RESULTS = 3
# Small problems are checked and their timing sets made on the host (checks_on_host): on the GPU
# the same NumPy-style code compiles CuPy's own elementwise and reduction kernels on first use,
# most of a fresh machine's first tune (docs/internals.md, "How a variant is judged"). The flop bound keeps a float64 product on the host small: a 512^3 sgemm (268 MFLOP)
# is checked on the GPU.
HOST_CHECK_FLOPS = 1 << 27
# One sample: long enough that the events' resolution is a negligible share of it; twice as long
# doubled the replay time of a search for the same winners (docs/history/sessions.md, 2026-11-25).
TARGET_REPLAY_US = 1000.0
MAX_LAUNCHES = 4000
REPLAYS = 7


@contextlib.contextmanager
def time_into(totals: dict, key: str):
    """Add the host wall time of the block to totals[key] (the phase breakdowns of the search
    and of the GPU worker)."""
    began = time.monotonic()
    try:
        yield
    finally:
        totals[key] = totals.get(key, 0.0) + time.monotonic() - began


@dataclass(frozen=True)
class Timing:
    samples_us: tuple[float, ...]  # per-launch time of each replay

    @property
    def median_us(self) -> float:
        return statistics.median(self.samples_us)

    @property
    def spread_us(self) -> float:
        return max(self.samples_us) - min(self.samples_us)


@dataclass(frozen=True)
class Check:
    ok: bool
    error: float  # worst relative L2 error over the cases (nan when not finite)
    reason: str = ""


def judge(family, problem, inputs: dict, expected, magnitude, xp) -> tuple[float, str]:
    """(error, why the outputs fail or ""): the family's comparison, then the rule. An error up
    to the family's tolerance passes; past it, the error may exceed it by what the outputs' own
    types cost the float64 reference (Family.representable_error: nothing for fp32 outputs, the
    error of the reference rounded to float16/bfloat16 for half ones). Computed only past the
    tolerance, so outputs that pass it cost nothing more. NaN never passes."""
    error, reason = family.compare(problem, inputs, expected, magnitude, xp)
    if reason:
        return error, reason
    tolerance = family.tolerance_for(problem)
    if error <= tolerance:
        return error, ""
    floor = family.representable_error(problem, inputs, expected, magnitude, xp) if math.isfinite(error) else 0.0
    if error <= tolerance + floor:
        return error, ""
    allowed = f"{tolerance:g} + {floor:.3g} (the reference rounded to the output type)" if floor else f"{tolerance:g}"
    return error, f"relative L2 error {error:.3g} > {allowed}"


def checks_on_host(family, problem) -> bool:
    """Whether `problem` is small enough to be validated, and its timing sets made, with NumPy."""
    return (family.bytes_moved(problem, family.timing_case(problem)) <= family.host_check_bytes
            and family.flops(problem) <= HOST_CHECK_FLOPS)


@contextlib.contextmanager
def plain_reductions(xp):
    """Within: CuPy's reductions (sum, max, norm, any...) run as its own reduction kernels rather
    than CUB's block reductions, which take seconds each to compile on an empty CuPy cache, in
    every GPU worker of a cold machine at once (measured: docs/distributed.md, "The first check on
    a device"). Only the checks run in it:
    peers built on CuPy reductions (reduce's cupy.sum) keep CuPy's defaults."""
    if getattr(xp, "__name__", "") != "cupy":
        yield
        return
    from cupy._core import _accelerator

    saved = _accelerator.get_reduction_accelerators()
    _accelerator.set_reduction_accelerators([])
    try:
        yield
    finally:
        _accelerator.set_reduction_accelerators(saved)


def validate(family, problem, launch: Callable[[dict], None], xp, rng, host_rng=None) -> Check:
    """Run `launch` on fresh random inputs for every validation case of the family. Given
    `host_rng` (a NumPy Generator), a problem that checks_on_host is checked on the host: the
    launch gets the inputs uploaded to `xp` and every array is read back after it."""
    on_host = host_rng is not None and checks_on_host(family, problem)
    check_xp, check_rng = (np, host_rng) if on_host else (xp, rng)
    with plain_reductions(check_xp):
        return _validate_cases(family, problem, launch, xp, check_xp, check_rng, on_host)


def _validate_cases(family, problem, launch, xp, check_xp, check_rng, on_host: bool) -> Check:
    worst = 0.0
    for case in family.validation_cases(problem):
        inputs = family.make_inputs(problem, check_xp, check_rng, case)
        expected = family.reference(problem, inputs, check_xp)  # before the launch overwrites outputs
        magnitude = family.reference_magnitude(problem, inputs, check_xp)
        if on_host:
            _launch_from_host(launch, inputs, xp)
        else:
            launch(inputs)
        error, reason = judge(family, problem, inputs, expected, magnitude, check_xp)
        if reason:
            return Check(False, error, f"case {case}: {reason}")
        worst = max(worst, error)
    return Check(True, worst)


def rehearse_checks(family, problem, xp, rng) -> None:
    """validate's work for `problem` on the device without a kernel to check: every case's inputs,
    reference and judgement (of blank outputs, which fail the tolerance, so what the outputs' types
    cost is computed too; the verdict is dropped). A check on the device runs CuPy operations that
    CuPy compiles on their first use in a process, seconds in all on an empty CuPy cache; a GPU
    worker rehearses them while it would otherwise wait for its first variant. On the device even
    for a problem checked on the host: the operations are the family's and dtype's, whatever the
    shape, so a later, larger problem of a kept worker finds them compiled."""
    with plain_reductions(xp):
        for case in family.validation_cases(problem):
            inputs = family.make_inputs(problem, xp, rng, case)
            expected = family.reference(problem, inputs, xp)
            magnitude = family.reference_magnitude(problem, inputs, xp)
            blank = {**inputs, **{name: xp.zeros_like(inputs[name]) for name in family.outputs}}
            judge(family, problem, blank, expected, magnitude, xp)  # blank outputs fail: the whole rule runs


def _launch_from_host(launch: Callable[[dict], None], inputs: dict, xp) -> None:
    """`launch` on `inputs` (NumPy) uploaded to `xp`; every array it got is read back into
    `inputs`, so the outputs (and anything else the kernel wrote) are compared on the host."""
    device = {name: xp.asarray(value) if isinstance(value, np.ndarray) else value for name, value in inputs.items()}
    launch(device)
    download = getattr(xp, "asnumpy", np.asarray)
    for name, value in inputs.items():
        if isinstance(value, np.ndarray):
            inputs[name] = download(device[name])


def timing_sets(family, problem, xp, rng, cold: bool, l2_bytes: int, free_bytes: int,
                host_rng=None) -> list[dict]:
    """Input sets to rotate over: enough that together they exceed 4x L2 when cold, their results
    recycled (recycle_results). Given `host_rng`, a problem that checks_on_host gets one set made
    with NumPy, uploaded as each set."""
    case = family.timing_case(problem)
    set_bytes = max(1, family.bytes_moved(problem, case))
    count = 1
    if cold:
        count = min(MAX_SETS, math.ceil(4 * l2_bytes / set_bytes) + 1)
        count = max(1, min(count, int(0.5 * free_bytes // set_bytes)))
    if host_rng is not None and checks_on_host(family, problem):
        made = family.make_inputs(problem, np, host_rng, case)
        return recycle_results(family, [
            {name: xp.asarray(value) if isinstance(value, np.ndarray) else value for name, value in made.items()}
            for _ in range(count)])
    sets = recycle_results(family, [family.make_inputs(problem, xp, rng, case) for _ in range(count)])
    # The sets are written by kernels queued on the current stream, and the timing graphs replay
    # on non-blocking streams of their own, which do not wait for it: without this wait the first
    # variant timed on a new problem ran alongside the generation, measured several times too
    # slow, and the search dropped it (docs/history/sessions.md, "A measurement bug").
    if hasattr(xp, "cuda"):
        xp.cuda.get_current_stream().synchronize()
    return sets


def recycle_results(family, sets: list[dict]) -> list[dict]:
    """The sets with their outputs shared among the first RECYCLED_RESULTS sets' (set i writes
    set i % RECYCLED_RESULTS's), as a caching allocator (PyTorch's, CuPy's) hands a freed result's
    block to the next call: only the inputs come cold from HBM."""
    for index in range(RECYCLED_RESULTS, len(sets)):
        for name in family.outputs:
            sets[index][name] = sets[index % RECYCLED_RESULTS][name]
    return sets


# A timing graph holds at least this many launches: several back-to-back replays of it then
# make one sample, and the small gap between two replays is spread over this many launches.
MIN_GRAPH_LAUNCHES = 128
# Early stop: after EARLY_REPLAYS replays, a variant slower than EARLY_FACTOR x the best so far
# keeps those samples (a valid, if shorter, measurement) and is not replayed further.
EARLY_REPLAYS = 2
# 1.2: two samples of one graph differ by about 1%, so a variant 20% over the best so far after
# two is not a finalist (the finalists are re-timed interleaved before the winner is chosen).
EARLY_FACTOR = 1.2


class GraphTimer:
    """`launches` calls of enqueue(i % n_sets) captured in one CUDA graph; one sample replays it
    `repeats` times back to back (set by build_timer), so one graph serves probing and timing."""

    def __init__(self, cupy, enqueue: Callable[[int], None], n_sets: int, launches: int):
        self._cupy = cupy
        self.launches = launches
        self.repeats = 1
        # What the caller queued on its stream (inputs being generated, outputs being poisoned)
        # comes first: the graph replays on a non-blocking stream that would not wait for it.
        queued = cupy.cuda.get_current_stream().record()
        self.stream = cupy.cuda.Stream(non_blocking=True)
        with self.stream:
            self.stream.begin_capture()
            try:
                for i in range(launches):
                    enqueue(i % n_sets)
            finally:
                self.graph = self.stream.end_capture()
        self.stream.wait_event(queued)
        self.graph.launch(self.stream)  # warm replay: uploads the graph, touches every set
        self.stream.synchronize()
        self._start = cupy.cuda.Event()
        self._stop = cupy.cuda.Event()

    def replay_us(self) -> float:
        """Time one sample (`repeats` replays) on the GPU; per launch, in microseconds."""
        self._start.record(self.stream)
        for _ in range(self.repeats):
            self.graph.launch(self.stream)
        self._stop.record(self.stream)
        self._stop.synchronize()
        elapsed_ms = self._cupy.cuda.get_elapsed_time(self._start, self._stop)
        return elapsed_ms * 1000.0 / (self.launches * self.repeats)


def graph_plan(n_sets: int, estimate_us: float | None = None) -> tuple[int, int]:
    """(launches captured, replays per sample): at least one pass over the sets and
    MIN_GRAPH_LAUNCHES launches in the graph, and about TARGET_REPLAY_US per sample (capped at
    MAX_LAUNCHES launches) once the time per launch is estimated."""
    launches = max(n_sets, MIN_GRAPH_LAUNCHES)
    launches = math.ceil(launches / n_sets) * n_sets
    if estimate_us is None:
        return launches, 1
    wanted = max(launches, min(MAX_LAUNCHES, math.ceil(TARGET_REPLAY_US / max(estimate_us, 0.5))))
    return launches, max(1, round(wanted / launches))


def build_timer(cupy, enqueue: Callable[[int], None], n_sets: int) -> GraphTimer:
    """One graph per variant where possible (capturing and instantiating thousands of launches
    cost more than timing them): a first graph of one pass over the input sets estimates the time
    per launch. A kernel so long that MIN_GRAPH_LAUNCHES of it exceed a sample (a large GEMM:
    milliseconds each) is timed on that graph, the launch gaps being negligible next to it;
    a shorter one gets a graph of MIN_GRAPH_LAUNCHES launches. Then enough back-to-back replays
    make a sample of about TARGET_REPLAY_US."""
    launches, _ = graph_plan(n_sets)
    timer = GraphTimer(cupy, enqueue, n_sets, n_sets if n_sets < launches else launches)
    estimate = timer.replay_us()
    if timer.launches < launches and estimate * launches < TARGET_REPLAY_US:
        timer = GraphTimer(cupy, enqueue, n_sets, launches)
        estimate = timer.replay_us()
    timer.repeats = replays_per_sample(timer.launches, estimate)
    return timer


def replays_per_sample(launches: int, estimate_us: float) -> int:
    """Back-to-back replays of a graph of `launches` that make a sample of about TARGET_REPLAY_US
    (at most MAX_LAUNCHES launches; at least one replay)."""
    wanted = max(launches, min(MAX_LAUNCHES, math.ceil(TARGET_REPLAY_US / max(estimate_us, 0.5))))
    return max(1, round(wanted / launches))


def time_enqueue(cupy, enqueue: Callable[[int], None], n_sets: int, replays: int = REPLAYS,
                 give_up_over_us: float | None = None) -> Timing:
    """`replays` samples; with `give_up_over_us`, stop after EARLY_REPLAYS when their median is
    over it (a clear loser keeps its few samples)."""
    timer = build_timer(cupy, enqueue, n_sets)
    return Timing(sample_until(timer.replay_us, replays, give_up_over_us))


def sample_until(sample: Callable[[], float], replays: int, give_up_over_us: float | None) -> tuple[float, ...]:
    samples = []
    for _ in range(replays):
        samples.append(sample())
        if (give_up_over_us is not None and len(samples) == EARLY_REPLAYS
                and statistics.median(samples) > give_up_over_us):
            break
    return tuple(samples)
