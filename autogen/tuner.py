"""The tuning loop: ask Optuna, render, compile ahead in a process pool, evaluate on the GPU in a
replaceable child, store every trial as it completes, then re-time the best few interleaved and
store the winner."""

from __future__ import annotations

import collections
import concurrent.futures
import re

import optuna
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from tuning_db import TuningDB
from tuning_db.records import DeviceIdentity, TrialRecord, WinnerRecord

from . import __version__
from .backend import GpuBackend
from .compile import compile_options
from .errors import CompileError, UsageError
from .families import get_family
from .problem import Config, Problem
from .render import render, source_hash
from .search import PENALTY_US, SAMPLERS, create_study, distributions
from .worker import WorkSpec, default_workers

# Two variants whose medians differ by less than this are a tie: the simpler name wins.
TIE_FRACTION = 0.01
# Consecutive asks that yield only measured, rejected or in-flight points before the search
# counts the space as exhausted (small spaces, or budgets larger than the space).
MAX_IDLE_ASKS = 1000


@dataclass(frozen=True)
class TuneOptions:
    trials: int = 60  # variants measured (rejected and reused ones do not count)
    timeout_s: float | None = None
    sampler: str = "tpe"
    seed: int | None = 0
    cache_mode: str = "cold"
    db_url: str | None = None
    workers: int = field(default_factory=default_workers)  # NVRTC compile processes
    top_k: int = 5  # best variants re-timed interleaved before naming the winner
    retime_rounds: int = 7
    eval_timeout_s: float = 60.0
    warm_start: bool = True
    stop_at_us: float | None = None  # stop searching once a variant is at least this fast
    family_module: str | None = None  # test aid: module registering extra families


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
    phases_s: dict = field(default_factory=dict)  # startup, search, finish
    db_url: str = ""
    candidates: list[TrialRecord] = field(default_factory=list)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class _Pending:
    trials: list  # optuna trials waiting for this variant
    config: Config
    name: str
    source: str
    future: concurrent.futures.Future


class Tuner:
    def __init__(self, problem: Problem, options: TuneOptions, progress: Callable[[str], None] = _log,
                 backend_factory=GpuBackend):
        if options.sampler not in SAMPLERS:
            raise UsageError(f"unknown sampler {options.sampler!r}; choose one of {', '.join(SAMPLERS)}")
        if options.trials < 1:
            raise UsageError(f"--trials must be at least 1, got {options.trials}")
        if options.cache_mode not in ("cold", "hot"):
            raise UsageError(f"--cache must be cold or hot, got {options.cache_mode!r}")
        self.problem = problem
        self.family = get_family(problem.family)
        self.options = options
        self.progress = progress
        self.backend_factory = backend_factory  # tests pass autogen.testing.replay.ReplayBackend
        self.db = TuningDB(options.db_url)
        self.result: TuneResult | None = None

    # --- the run --------------------------------------------------------------------------
    def run(self) -> TuneResult:
        started = time.monotonic()
        spec = WorkSpec(self.problem.family, self.problem.dtype, self.problem.dims,
                        self.options.cache_mode, self.options.family_module)
        with self.backend_factory(spec, self.options.workers, self.options.eval_timeout_s) as backend:
            self._check_fits(backend.free_bytes)
            self.device = backend.device
            self.arch = self.device.arch
            self.result = TuneResult(self.problem, self.device, None,
                                     self.family.bytes_moved(self.problem, self.family.timing_case(self.problem)),
                                     self.family.flops(self.problem), db_url=self.db.url)
            self.progress(f"tuning {self.problem} on {self.device.name} ({self.arch}), "
                          f"{self.options.sampler} sampler, {self.options.trials} trials, {self.options.cache_mode} cache")
            ready = time.monotonic()
            self._search(backend, started)
            searched = time.monotonic()
            self._finish(backend)
            self.result.worker_restarts = backend.evaluator.restarts
        self.result.wall_s = time.monotonic() - started
        self.result.phases_s = {"startup": round(ready - started, 2), "search": round(searched - ready, 2),
                                "finish": round(time.monotonic() - searched, 2)}
        self.progress("wall time " + ", ".join(f"{k} {v:.1f} s" for k, v in self.result.phases_s.items()))
        return self.result

    def _check_fits(self, free_bytes: int) -> None:
        # One input set plus its float64 reference must fit, with the rotating sets on top.
        need = 3 * self.family.bytes_moved(self.problem, self.family.timing_case(self.problem))
        if need > free_bytes:
            raise UsageError(f"{self.problem} needs about {need / 2**30:.1f} GiB of GPU memory; "
                             f"{free_bytes / 2**30:.1f} GiB is free")

    # --- search ---------------------------------------------------------------------------
    def _stored_trials(self) -> dict[str, TrialRecord]:
        return {t.kernel_name: t for t in self.db.trials(self.device, self.problem.family, self.problem.dtype,
                                                         self.problem.shape_key, self.options.cache_mode)}

    def _warm_start_points(self) -> list[dict]:
        """Tried first: the winners of the nearest tuned shapes (nearest first), then the default."""
        default = [dict(self.family.default_params)]
        if not self.options.warm_start:
            return default
        winners = self.db.winners(family=self.problem.family, gpu_name=self.device.name,
                                  compute_capability=self.device.compute_capability, dtype=self.problem.dtype)
        others = [w for w in winners if w.trial.shape_key != self.problem.shape_key]
        others.sort(key=lambda w: (self.family.distance(
            self.problem, Problem(self.problem.family, self.problem.dtype, _dims(w.trial.shape_key))),
            w.trial.shape_key))
        nearest = [dict(w.trial.params) for w in others[:3] if not self.family.space.violations(w.trial.params)]
        return nearest + default

    def _search(self, backend, started: float) -> None:
        stored = self._stored_trials()
        self.stored = stored
        measured = {name: (t.params, t.time_us if t.status == "ok" else PENALTY_US)
                    for name, t in stored.items() if not self.family.space.violations(t.params)}
        if stored:
            self.progress(f"resuming: {len(stored)} trials of this problem already in the database")
        exhaustive = ([c.as_dict() for c in self.family.space.enumerate()]
                      if self.options.sampler == "exhaustive" else [])
        seeds = self._warm_start_points()
        # Seeds are tried even where the shape would prune them: the default is the baseline.
        self.seed_keys = {tuple(sorted(p.items())) for p in seeds}
        study = create_study(self.family.space, self.options.sampler, self.options.seed, measured,
                             seeds, exhaustive)
        dists = distributions(self.family.space)
        by_body: dict[str, str] = {}  # source hash with the name masked -> kernel name measured
        pending: collections.deque[_Pending] = collections.deque()
        in_flight: dict[str, _Pending] = {}
        depth = max(2, 2 * self.options.workers)
        asked = 0
        # The budget counts variants measured for this problem in earlier runs too, so running
        # the same command again finishes an interrupted search instead of starting another.
        launched = sum(1 for t in stored.values() if t.status != "rejected")

        def budget_left() -> bool:
            if self.options.timeout_s is not None and time.monotonic() - started > self.options.timeout_s:
                return False
            if self.options.stop_at_us is not None and any(
                    t.status == "ok" and t.time_us <= self.options.stop_at_us for t in stored.values()):
                return False
            if self.options.sampler == "exhaustive" and asked >= queued:
                return False  # every point was served: the space is exhausted
            # A sampler that keeps proposing measured or invalid points has run out of space.
            return launched < self.options.trials and idle_asks < MAX_IDLE_ASKS

        queued = len(study.get_trials(states=(optuna.trial.TrialState.WAITING,)))
        idle_asks = 0  # consecutive asks that produced nothing new to measure
        while True:
            while len(pending) < depth and budget_left():
                trial = study.ask(dists)
                asked += 1
                outcome = self._classify(trial, stored, in_flight, by_body)
                if outcome is None:
                    idle_asks += 1
                    continue
                idle_asks = 0
                config, name, source = outcome
                future = backend.compile(source, self.arch)
                entry = _Pending([trial], config, name, source, future)
                pending.append(entry)
                in_flight[name] = entry
                launched += 1
            if not pending:
                break
            entry = pending.popleft()
            record = self._evaluate(entry, backend.evaluator)
            del in_flight[entry.name]
            stored[entry.name] = record
            by_body[_body_hash(entry.source, entry.name)] = entry.name
            value = record.time_us if record.status == "ok" else PENALTY_US
            for trial in entry.trials:
                study.tell(trial, value)
            self._report_trial(record, launched)
        if self.options.sampler == "exhaustive" and self._unmeasured(exhaustive, stored):
            self.progress("note: the trial budget ended the exhaustive search early (raise --trials)")

    def _unmeasured(self, points: list[dict], stored: dict) -> int:
        configs = (self.family.space.check(p) for p in points)
        return sum(1 for c in configs if self.family.kernel_name(self.problem.dtype, c) not in stored
                   and not self.family.reject_reason(self.problem, c))

    def _classify(self, trial, stored, in_flight, by_body):
        """Reject, reuse or accept an asked trial; returns (config, name, source) to compile."""
        params = trial.params
        problems = self.family.space.violations(params)
        if problems:
            self.result.rejected += 1
            study_tell(trial, PENALTY_US)
            return None
        config = self.family.space.check(params)
        reason = self.family.reject_reason(self.problem, config)
        if reason and tuple(sorted(params.items())) not in self.seed_keys:
            self.result.rejected += 1
            study_tell(trial, PENALTY_US)
            return None
        name = self.family.kernel_name(self.problem.dtype, config)
        if name in in_flight:
            in_flight[name].trials.append(trial)
            return None
        source = render(self.family, self.problem.dtype, config)
        known = stored.get(name) or stored.get(by_body.get(_body_hash(source, name), ""))
        if known is not None:  # measured already (this run, or an earlier one): not measured again
            self.result.reused += 1
            study_tell(trial, known.time_us if known.status == "ok" else PENALTY_US)
            return None
        return config, name, source

    def _evaluate(self, entry: _Pending, evaluator) -> TrialRecord:
        options = " ".join(compile_options(self.arch))
        base = dict(family=self.problem.family, dtype=self.problem.dtype, shape_key=self.problem.shape_key,
                    kernel_name=entry.name, params=entry.config.as_dict(),
                    source_hash=source_hash(entry.source), compile_options=options,
                    cache_mode=self.options.cache_mode)
        try:
            cubin = entry.future.result()
        except CompileError as exc:
            record = TrialRecord(status="failed", reason=f"compile: {exc}", **base)
        except Exception as exc:  # a compile worker died
            record = TrialRecord(status="failed", reason=f"compile: {type(exc).__name__}: {exc}", **base)
        else:
            outcome = evaluator.evaluate(entry.name, cubin, entry.config.as_dict())
            if outcome.status == "ok":
                record = TrialRecord(status="ok", time_us=statistics.median(outcome.samples_us),
                                     samples_us=outcome.samples_us,
                                     spread_us=max(outcome.samples_us) - min(outcome.samples_us),
                                     error=outcome.error, **base)
            else:
                record = TrialRecord(status="failed", reason=outcome.reason, error=_finite(outcome.error), **base)
        if record.status == "ok":
            self.result.measured += 1
        else:
            self.result.failed += 1
        # Stored at once: an interrupted run loses at most the trial in flight.
        return self.db.record_trial(self.device, record)

    def _report_trial(self, record: TrialRecord, launched: int) -> None:
        done = self.result.measured + self.result.failed
        if record.status == "ok":
            best = min((t.time_us for t in self.stored.values() if t.status == "ok"), default=record.time_us)
            self.progress(f"[{done}/{self.options.trials}] {record.kernel_name}: {record.time_us:.2f} us "
                          f"(best {best:.2f} us)")
        else:
            self.progress(f"[{done}/{self.options.trials}] {record.kernel_name}: FAILED {record.reason[:160]}")

    # --- the winner -----------------------------------------------------------------------
    def _finish(self, backend) -> None:
        evaluator = backend.evaluator
        peer = None
        try:
            peer = evaluator.call("time_peer")
        except Exception as exc:
            self.progress(f"peer could not be timed: {exc}")
        try:
            self.result.copy_gbs = evaluator.call("copy_bandwidth_gbs")
        except Exception as exc:
            self.progress(f"copy bandwidth could not be measured: {exc}")
        ok = sorted((t for t in self._stored_trials().values() if t.status == "ok"), key=lambda t: t.time_us)
        if not ok:
            self.progress("no variant passed validation; nothing stored as winner")
            return
        best = ok[: self.options.top_k]
        # The stored winner (another run's, maybe) is re-timed side by side with ours: set_winner
        # replaces it only on that evidence, or on the stored figures beyond its spread.
        stored = next(iter(self.db.winners(family=self.problem.family, gpu_name=self.device.name,
                                           compute_capability=self.device.compute_capability,
                                           dtype=self.problem.dtype, shape_key=self.problem.shape_key,
                                           cache_mode=self.options.cache_mode)), None)
        stored_trial = next((t for t in ok if stored and t.kernel_name == stored.trial.kernel_name), None)
        if stored_trial is not None and stored_trial not in best:
            best.append(stored_trial)
        finalists = self._retime(backend, best)
        retimed = finalists is not best  # _retime hands back its input when it did not re-time
        winner, margin = pick_winner(finalists)
        peer_name, peer_time = (peer[0], statistics.median(peer[1])) if peer else ("", None)
        self.result.candidates = finalists
        self.result.winner = self.db.set_winner(
            self.device, winner, peer_name=peer_name, peer_time_us=peer_time, margin=margin,
            autogen_version=__version__,
            retimed_against=stored.trial.kernel_name if retimed and stored_trial is not None else None)
        if self.result.winner.trial.kernel_name != winner.kernel_name:
            self.progress(f"kept the stored winner {self.result.winner.trial.kernel_name} "
                          f"({self.result.winner.trial.time_us:.2f} us): {winner.kernel_name} is not faster "
                          "beyond its spread")

    def _retime(self, backend, best: list[TrialRecord]) -> list[TrialRecord]:
        if len(best) < 2:
            return best
        cubins = {}
        for trial in best:
            config = self.family.space.check(trial.params)
            cubins[trial.kernel_name] = backend.compile(render(self.family, self.problem.dtype, config),
                                                        self.arch).result()
        try:
            samples = backend.evaluator.call("retime", [(t.kernel_name, cubins[t.kernel_name], t.params) for t in best],
                                     self.options.retime_rounds, timeout_s=10 * self.options.eval_timeout_s)
        except Exception as exc:
            self.progress(f"interleaved re-timing failed ({exc}); keeping the search timings")
            return best
        updated = []
        for trial in best:
            values = samples[trial.kernel_name]
            updated.append(self.db.record_trial(self.device, _with_samples(trial, values)))
        return updated


def pick_winner(finalists: list[TrialRecord]) -> tuple[TrialRecord, float | None]:
    """Lowest median wins; variants within TIE_FRACTION (or within their spread) of it tie, and a
    tie goes to the lexicographically smallest kernel name, so the choice is deterministic."""
    ranked = sorted(finalists, key=lambda t: (t.time_us, t.kernel_name))
    best = ranked[0]
    tolerance = max(TIE_FRACTION * best.time_us, (best.spread_us or 0.0) / 2)
    tied = [t for t in ranked if t.time_us - best.time_us <= tolerance]
    chosen = min(tied, key=lambda t: t.kernel_name)
    others = [t for t in ranked if t is not chosen]
    margin = (others[0].time_us - chosen.time_us) / chosen.time_us if others else None
    return chosen, margin


def study_tell(trial, value: float) -> None:
    trial.study.tell(trial, value)


def _with_samples(trial: TrialRecord, samples: tuple[float, ...]) -> TrialRecord:
    from dataclasses import replace
    return replace(trial, samples_us=samples, time_us=statistics.median(samples),
                   spread_us=max(samples) - min(samples))


def _body_hash(source: str, kernel_name: str) -> str:
    # Two configs that render the same code under different names (and comments) are one variant.
    code = re.sub(r"//[^\n]*", "", source.replace(kernel_name, "KERNEL"))
    return source_hash(code)


def _dims(shape_key: str):
    from .problem import parse_shape_key
    return parse_shape_key(shape_key)


def _finite(value):
    return value if value is not None and value == value and abs(value) != float("inf") else None


def tune(problem: Problem, options: TuneOptions | None = None, progress: Callable[[str], None] = _log) -> TuneResult:
    return Tuner(problem, options or TuneOptions(), progress).run()
