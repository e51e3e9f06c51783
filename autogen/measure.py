"""Validation against float64 and GPU-side timing with CUDA graphs (see shared anchors.md).

Why graphs: a launch from Python costs ~6 us of host time, which hides every small kernel;
inside a graph an empty kernel costs ~0.8 us. Why rotating input sets: weights in real inference
come from HBM, so by default ("cold") each launch reads a set that is not in L2.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable

MAX_SETS = 256  # rotating input sets; enough to exceed 4x L2 even for tiny shapes
TARGET_REPLAY_US = 2000.0  # one replay long enough that event resolution does not matter
MAX_LAUNCHES = 4000
REPLAYS = 7


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


def relative_error(xp, out, ref, magnitude=None) -> tuple[float, str]:
    """L2 error of `out` against float64 `ref`, relative to ||magnitude|| (default ||ref||), and
    why it fails (empty if it may pass)."""
    out64 = out.astype(xp.float64)
    finite_ref = xp.isfinite(ref)
    bad = int((~xp.isfinite(out64) & finite_ref).sum())
    if bad:
        return math.nan, f"{bad} of {out.size} outputs are NaN/inf (unwritten, or poisoned input read)"
    mismatched_special = int((~finite_ref & ~((out64 == ref) | (xp.isnan(out64) & xp.isnan(ref)))).sum())
    if mismatched_special:
        return math.nan, f"{mismatched_special} outputs differ where the reference is NaN/inf"
    out64 = xp.where(finite_ref, out64, 0.0)
    ref = xp.where(finite_ref, ref, 0.0)
    scale = ref if magnitude is None else xp.where(finite_ref, magnitude, 0.0)
    norm = float(xp.linalg.norm(scale))
    diff = float(xp.linalg.norm(out64 - ref))
    return (diff / norm if norm > 0 else diff), ""


def validate(family, problem, launch: Callable[[dict], None], xp, rng) -> Check:
    """Run `launch` on fresh random inputs for every validation case of the family."""
    worst = 0.0
    tolerance = family.tolerance_for(problem)
    for case in family.validation_cases(problem):
        inputs = family.make_inputs(problem, xp, rng, case)
        expected = family.reference(problem, inputs, xp)  # before the launch overwrites outputs
        magnitude = family.reference_magnitude(problem, inputs, xp)
        launch(inputs)
        error, reason = family.compare(problem, inputs, expected, magnitude, xp)
        if reason:
            return Check(False, error, f"case {case}: {reason}")
        if not error <= tolerance:
            return Check(False, error, f"case {case}: relative L2 error {error:.3g} > {tolerance:g}")
        worst = max(worst, error)
    return Check(True, worst)


def timing_sets(family, problem, xp, rng, cold: bool, l2_bytes: int, free_bytes: int) -> list[dict]:
    """Input sets to rotate over: enough that together they exceed 4x L2 when cold."""
    case = family.timing_case(problem)
    set_bytes = max(1, family.bytes_moved(problem, case))
    count = 1
    if cold:
        count = min(MAX_SETS, math.ceil(4 * l2_bytes / set_bytes) + 1)
        count = max(1, min(count, int(0.5 * free_bytes // set_bytes)))
    return [family.make_inputs(problem, xp, rng, case) for _ in range(count)]


class GraphTimer:
    """`launches` calls of enqueue(i % n_sets) captured in one CUDA graph, replayed on demand."""

    def __init__(self, cupy, enqueue: Callable[[int], None], n_sets: int, launches: int):
        self._cupy = cupy
        self.launches = launches
        self.stream = cupy.cuda.Stream(non_blocking=True)
        with self.stream:
            self.stream.begin_capture()
            try:
                for i in range(launches):
                    enqueue(i % n_sets)
            finally:
                self.graph = self.stream.end_capture()
        self.graph.launch(self.stream)  # warm replay: uploads the graph, touches every set
        self.stream.synchronize()
        self._start = cupy.cuda.Event()
        self._stop = cupy.cuda.Event()

    def replay_us(self) -> float:
        """Time one replay on the GPU; per launch, in microseconds."""
        self._start.record(self.stream)
        self.graph.launch(self.stream)
        self._stop.record(self.stream)
        self._stop.synchronize()
        return self._cupy.cuda.get_elapsed_time(self._start, self._stop) * 1000.0 / self.launches


def build_timer(cupy, enqueue: Callable[[int], None], n_sets: int) -> GraphTimer:
    """Size the graph so one replay lasts about TARGET_REPLAY_US (at least one pass over the sets)."""
    probe = GraphTimer(cupy, enqueue, n_sets, max(n_sets, 16))
    estimate = min(probe.replay_us() for _ in range(2))
    launches = max(n_sets, min(MAX_LAUNCHES, math.ceil(TARGET_REPLAY_US / max(estimate, 0.5))))
    launches = math.ceil(launches / n_sets) * n_sets
    return GraphTimer(cupy, enqueue, n_sets, launches)


def time_enqueue(cupy, enqueue: Callable[[int], None], n_sets: int, replays: int = REPLAYS) -> Timing:
    timer = build_timer(cupy, enqueue, n_sets)
    return Timing(tuple(timer.replay_us() for _ in range(replays)))
