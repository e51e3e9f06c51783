"""Tuning one problem, start to end: start the backend (compile pool and GPU worker), find where
the search starts (autogen.search.warmstart), run the search loop (autogen.search.loop), then choose and
store the winner (autogen.search.winner). autogen.distributed.multi_gpu runs the same steps over several GPUs."""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from tuning_db import TuningDB
from tuning_db.records import DeviceIdentity, TrialRecord, WinnerRecord

from autogen.catalog.environment import stale_reasons, winner_source_hash
from autogen.catalog.stored import skipped_note, unusable_reason
from autogen.core.problem import Problem
from autogen.core.registry import check_family_renders, get_family
from autogen.errors import UsageError
from autogen.gpu import roofline
from autogen.gpu.backend import GpuBackend
from autogen.gpu.device import identity_for_lookup
from autogen.gpu.evaluator import WorkSpec
from autogen.gpu.worker import default_workers
from autogen.report import terminal_text
from autogen.search.lease import check_lease

# Optuna (autogen.search.loop, autogen.search.warmstart) is imported only when there is something to search:
# a run answered from the database does without it.
SAMPLERS = ("tpe", "random", "exhaustive")  # the same as autogen.search.loop.SAMPLERS


@dataclass(frozen=True)
class TuneOptions:
    trials: int = 60  # variants measured (rejected and reused ones do not count)
    timeout_s: float | None = None
    sampler: str = "tpe"
    seed: int | None = 0
    cache_mode: str = "cold"
    db_url: str | None = None
    workers: int | None = None  # NVRTC compile processes per GPU (None: compile_workers' default)
    top_k: int = 5  # best variants re-timed interleaved before naming the winner
    retime_rounds: int = 7
    eval_timeout_s: float = 60.0
    warm_start: bool = True
    stop_at_us: float | None = None  # stop searching once a variant is at least this fast
    refresh: bool = False  # re-time a stale winner's best few trials here instead of searching
    gpus: tuple[int, ...] | None = None  # device ordinals to tune on (None: the current GPU)
    lease_s: float = 60.0  # a killed worker's variants go to the others this long after its last beat

    def compile_workers(self) -> int:
        """The NVRTC compile processes that each GPU's tuning gets: ``workers``, else this machine's
        default share for as many GPUs as ``gpus`` names (autogen.gpu.worker.default_workers)."""
        return self.workers or default_workers(len(self.gpus or ()) or 1)


@dataclass
class TuneResult:
    problem: Problem
    device: DeviceIdentity
    winner: WinnerRecord | None
    bytes_moved: int
    flops: int
    measured: int = 0
    failed: int = 0
    rejected: int = 0
    reused: int = 0
    worker_restarts: int = 0
    wall_s: float = 0.0
    copy_gbs: float | None = None  # measured device-to-device copy bandwidth (read + write)
    fp32_tflops: float | None = None  # measured FP32 FMA peak
    roofline: str = "memory"  # the family's bound: "memory" or "compute"
    phases_s: dict = field(default_factory=dict)  # startup, search, finish
    db_url: str = ""
    candidates: list[TrialRecord] = field(default_factory=list)
    taken_over: int = 0  # variants of a dead worker measured by this run
    gpus: tuple = ()  # the GPUs (device ordinals) that measured this problem's variants
    no_winner: str = ""  # why there is no winner (autogen.search.winner), where there is none


def _log(message: str) -> None:
    # Lines name stored kernels, GPUs and workers: what a database says never reaches the terminal raw.
    print(terminal_text(message), file=sys.stderr, flush=True)


def check_options(options: TuneOptions) -> None:
    """Every option checked before any GPU work; UsageError (exit 2) naming the bad one."""
    if options.sampler not in SAMPLERS:
        raise UsageError(f"unknown sampler {options.sampler!r}; choose one of {', '.join(SAMPLERS)}")
    if options.trials < 1:
        raise UsageError(f"--trials must be at least 1, got {options.trials}")
    if options.cache_mode not in ("cold", "hot"):
        raise UsageError(f"--cache must be cold or hot, got {options.cache_mode!r}")
    check_lease(options.lease_s)


class Tuner:
    def __init__(self, problem: Problem, options: TuneOptions, progress: Callable[[str], None] = _log,
                 backend_factory=GpuBackend):
        check_options(options)
        self.problem = problem
        self.family = get_family(problem.family)
        check_family_renders(self.family)  # a broken user template: one line, before the database is opened
        self.options = options
        self.progress = progress
        self.backend_factory = backend_factory  # tests pass autogen.testing.replay.ReplayBackend
        self.db = TuningDB(options.db_url)
        self._lock = threading.Lock()  # several GPUs' search loops report to one Tuner

    def run(self, give_way: bool = False) -> TuneResult | None:
        """The whole tune on one GPU (the current one, or options.gpus[0]); answered from the
        database when there is nothing to measure. ``give_way``: None, nothing measured, where
        another worker is found searching the problem once this one is ready to search it
        (autogen.distributed.multi_gpu: two processes that began it at the same moment)."""
        started = time.monotonic()
        answered = self._from_database(started)
        if answered is not None:
            self.result = answered
            return answered
        device_index = self.options.gpus[0] if self.options.gpus else None
        with self.open_backend(device_index) as backend:
            result = self.begin(backend, started)
            if self.options.refresh:  # a stale winner: re-time its best few here, no search
                from autogen.search.refresh import refresh
                end = refresh(self.family, self.problem, self.options, self.db, self.device, backend,
                              self.progress)
                return self._done(backend, result, end, started, searched=self.ready)
            if give_way and self.searched_elsewhere(self.device):
                return None
            self.search(backend, started, device_index)
            self.end(backend, result, started)
        return result

    def open_backend(self, device_index: int | None = None):
        """A backend for this problem on one GPU."""
        spec = WorkSpec.of(self.problem, self.options.cache_mode, device_index)
        return self.backend_factory(spec, self.options.compile_workers(), self.options.eval_timeout_s)

    def begin(self, backend, started: float) -> TuneResult:
        """After the first backend is up: check the problem fits, and find where to start."""
        from autogen.search.warmstart import starting_point

        problem, family, options = self.problem, self.family, self.options
        self.open_search_soon()
        self.imported = time.monotonic()
        self._check_fits(backend.free_bytes)  # waits for the GPU worker's CUDA context
        self.device = device = backend.device
        self._start_counting()
        result = TuneResult(problem, device, None, family.bytes_moved(problem, family.timing_case(problem)),
                            family.flops(problem), roofline=family.roofline, db_url=self.db.url)
        self.progress(f"tuning {problem} on {device.name} ({device.arch}), {options.sampler} sampler, "
                      f"{options.trials} trials, {options.cache_mode} cache")
        self.ready = time.monotonic()
        self.start = starting_point(self.db, device, family, problem, options.cache_mode, options.warm_start)
        if self.start.stored:
            self.progress(f"resuming: {len(self.start.stored)} trials of this problem already in the database")
        if self.start.skipped:
            self.progress(skipped_note(self.start.skipped))
        return result

    def open_search_soon(self) -> None:
        """Import Optuna now and open the study's storage on a thread, while the caller waits
        for the GPU worker's CUDA context."""
        from autogen.search import studies
        from autogen.search import loop as search  # noqa: F401  (Optuna)

        if not self.options.refresh:
            studies.open_storage_soon(self.db.url)

    def follow(self, device, start) -> None:
        """Search as a helper of an owner in another process (autogen.distributed.multi_gpu): ``device``
        and ``start`` are what the owner's begin() found. Its checks and lines are not repeated."""
        self.device, self.start = device, start
        self._start_counting()

    def _start_counting(self) -> None:
        from autogen.search.loop import SearchCounts

        self.counts = SearchCounts()
        self._gpus: list = []

    def add_search(self, device_index: int | None, counts) -> None:
        """Count one search loop's work in this problem's result: a loop of this process, or a
        helper's in a GPU agent, returned to its owner."""
        with self._lock:
            self._gpus.append(device_index)
            self.counts.add(counts)

    def search(self, backend, started: float, device_index: int | None = None, slot: int = 0,
               stop: threading.Event | None = None) -> None:
        """One worker's search loop on ``backend``'s GPU; several run at once on one problem
        (one per GPU), each its own owner of claims in the shared study. ``stop``: see SearchLoop."""
        from autogen.search.claims import new_owner
        from autogen.search.loop import SearchCounts, SearchLoop

        if backend.device.name != self.device.name:
            raise UsageError(f"GPU {device_index} is a {backend.device.name}, not a {self.device.name}: "
                             "a problem is searched on one GPU model")
        label = "gpu" if device_index is None else f"gpu{device_index}"
        counts = SearchCounts()
        loop = SearchLoop(self.family, self.problem, self.options, self.db, self.device, backend, self.start,
                          counts, self.progress, owner=new_owner(label), slot=slot, stop=stop)
        try:
            loop.run(started)
        finally:
            self.add_search(device_index, counts)

    def end(self, backend, result: TuneResult, started: float) -> TuneResult:
        """Once every search loop of this problem is over (helpers' in GPU agents too): re-time the
        finalists on ``backend``'s GPU and store the winner."""
        from autogen.search.winner import finish

        searched = time.monotonic()
        nothing_new = self.counts.measured + self.counts.failed == 0
        end = finish(self.family, self.problem, self.options, self.db, self.device, backend, nothing_new,
                     self.progress)
        return self._done(backend, result, end, started, searched)

    def _done(self, backend, result: TuneResult, end, started: float, searched: float) -> TuneResult:
        counts = self.counts
        result.worker_restarts = backend.evaluator.restarts
        result.winner, result.candidates, result.no_winner = end.winner, end.finalists, end.no_winner
        result.copy_gbs, result.fp32_tflops = end.copy_gbs, end.fp32_tflops
        result.measured, result.failed = counts.measured, counts.failed
        result.rejected, result.reused = counts.rejected, counts.reused
        result.taken_over, result.gpus = counts.taken_over, tuple(sorted(g for g in self._gpus if g is not None))
        result.wall_s = time.monotonic() - started
        result.phases_s = {"imports": round(self.imported - started, 2), "startup": round(self.ready - started, 2),
                           "search": round(searched - self.ready, 2), "finish": round(time.monotonic() - searched, 2)}
        # Where the search loops' threads spent their time (summed over the problem's loops,
        # helpers' in GPU agents included).
        result.phases_s.update({f"search_{k}": round(v, 3) for k, v in sorted(counts.spent_s.items())})
        # Where the GPU worker's time went (seconds waited per request kind, start-up parts).
        result.phases_s.update({f"gpu_{k}": v for k, v in getattr(backend.evaluator, "waited_s", {}).items()})
        # Inside the GPU worker: its evaluations' stages (load, validate, inputs, graph, replay).
        stages = getattr(backend.evaluator, "stages_spent", None)
        result.phases_s.update({f"gpu_eval_{k}": v for k, v in (stages() if stages else {}).items()})
        self.progress("wall time " + ", ".join(f"{k} {v:.1f} s" for k, v in result.phases_s.items()
                                               if not k.startswith(("gpu_", "search_"))))
        self.result = result
        return result

    def searched_elsewhere(self, device=None) -> bool:
        """Whether another worker (another process or machine on this database) holds live claims
        of this problem now on ``device``: it is being searched there. Without ``device``, the GPU
        is identified as _from_database does, without starting anything; False where it cannot be."""
        if device is None:
            identify = self._identify()
            if identify is None:
                return False
            device = identify()
        problem = self.problem
        live = self.db.claims(device, problem.family, problem.dtype, problem.shape_key, self.options.cache_mode,
                              running=True)
        return any(claim.expires_in_s > 0 for claim in live)

    def _identify(self):
        """The GPU's identity without a GPU worker (the backend's, or the driver and a record), or None."""
        identify = getattr(self.backend_factory, "identity", None)
        if identify is None and self.backend_factory is GpuBackend:
            identify = identity_for_lookup  # the driver and a record: no CuPy where it holds
        return identify

    def _from_database(self, started: float) -> TuneResult | None:
        """The result of a search that is complete in the database and whose winner is fresh
        here (autogen.catalog.environment), without starting a GPU worker, a compile pool or Optuna;
        None when there is anything to measure, re-time or check."""
        problem, family, options = self.problem, self.family, self.options
        identify = self._identify()
        if identify is None or options.sampler == "exhaustive":
            return None
        device = identify()

        trials = self.db.trials(device, problem.family, problem.dtype, problem.shape_key, options.cache_mode)
        launched = sum(1 for t in trials if t.status != "rejected")
        stopped = options.stop_at_us is not None and any(
            t.status == "ok" and t.time_us <= options.stop_at_us for t in trials)
        if launched < options.trials and not stopped:
            return None
        found = self.db.winners(family=problem.family, gpu_name=device.name,
                                compute_capability=device.compute_capability, dtype=problem.dtype,
                                shape_key=problem.shape_key, cache_mode=options.cache_mode)
        if not found or unusable_reason(family, problem.dtype, problem.traits, found[0].trial) is not None:
            return None  # a search (and its finish) replaces a winner today's space cannot render
        winner = found[0]
        stale = stale_reasons(winner, winner_source_hash(family, winner), device)
        if stale:
            self.progress(f"the stored winner {winner.trial.kernel_name} is stale ({'; '.join(stale)}): "
                          "re-timing its best few here")
            self.options = options = replace(options, refresh=True)
            return None
        if options.refresh:
            self.progress("nothing stale: the stored winner was measured in this environment")
        copy_gbs, fp32_tflops = roofline.cached_ceilings(device)
        result = TuneResult(problem, device, winner, family.bytes_moved(problem, family.timing_case(problem)),
                            family.flops(problem), reused=len(trials), copy_gbs=copy_gbs, fp32_tflops=fp32_tflops,
                            roofline=family.roofline, db_url=self.db.url, candidates=[winner.trial])
        result.measured = 0
        result.wall_s = time.monotonic() - started
        result.phases_s = {"database": round(result.wall_s, 3)}
        self.progress(f"{problem}: all {launched} trials are stored and the winner is fresh: answered from the "
                      f"database in {result.wall_s:.2f} s (no GPU work)")
        return result

    def _check_fits(self, free_bytes: int) -> None:
        # One input set plus its float64 reference must fit, with the rotating sets on top.
        need = 3 * self.family.bytes_moved(self.problem, self.family.timing_case(self.problem))
        if need > free_bytes:
            raise UsageError(f"{self.problem} needs about {need / 2**30:.1f} GiB of GPU memory; "
                             f"{free_bytes / 2**30:.1f} GiB is free")


def tune(problem: Problem, options: TuneOptions | None = None, progress: Callable[[str], None] = _log) -> TuneResult:
    return Tuner(problem, options or TuneOptions(), progress).run()
