"""The search: Optuna's study (one categorical per parameter) and the loop that feeds it.

Our database is the single source of truth: a study lives in memory and is rebuilt from the
stored trials of the same problem (autogen.warmstart), so running the same command again
continues where it stopped.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import re
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import optuna
from optuna.distributions import CategoricalDistribution
from tuning_db import TuningDB
from tuning_db.records import TrialRecord

from .compile import compile_options
from .errors import CompileError, UsageError
from .problem import Config, Problem
from .render import render, source_hash
from .space import Space

SAMPLERS = ("tpe", "random", "exhaustive")
# Told to Optuna for rejected or failed variants: worse than any real time, still finite.
PENALTY_US = 1e9

optuna.logging.set_verbosity(logging.WARNING)


def distributions(space: Space) -> dict[str, CategoricalDistribution]:
    return {p.name: CategoricalDistribution(p.choices) for p in space.params}


def make_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    if name == "tpe":
        # multivariate: parameters interact (vector width x threads per row);
        # constant_liar: several trials are in flight while the compile pool works ahead.
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True,
                                          n_startup_trials=10)
    if name in ("random", "exhaustive"):
        # exhaustive enqueues every valid point first (see create_study); random serves the rest
        return optuna.samplers.RandomSampler(seed=seed)
    raise UsageError(f"unknown sampler {name!r}; choose one of {', '.join(SAMPLERS)}")


def create_study(space: Space, sampler: str, seed: int | None, measured: dict[str, tuple[dict, float]],
                 seeds: list[dict], exhaustive_points: list[dict]) -> optuna.Study:
    """A study that already knows `measured` (kernel name -> (params, value)) and will try
    `seeds` (warm start) and then `exhaustive_points` before asking its sampler."""
    study = optuna.create_study(direction="minimize", sampler=make_sampler(sampler, seed))
    dists = distributions(space)
    for params, value in measured.values():
        study.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=value))
    known = {_key(params) for params, _ in measured.values()}
    for params in seeds + exhaustive_points:
        if _key(params) not in known:
            study.enqueue_trial(params)
            known.add(_key(params))
    return study


def _key(params: dict) -> tuple:
    return tuple(sorted(params.items()))


# -- the search loop ------------------------------------------------------------------------------

# Consecutive asks that yield only measured, rejected or in-flight points before the search
# counts the space as exhausted (small spaces, or budgets larger than the space).
MAX_IDLE_ASKS = 1000


@dataclass
class SearchCounts:
    measured: int = 0
    failed: int = 0
    rejected: int = 0
    reused: int = 0


@dataclass
class _Pending:
    trials: list  # optuna trials waiting for this variant
    config: Config
    name: str
    source: str
    future: concurrent.futures.Future


class SearchLoop:
    """Ask Optuna, render, compile ahead in the backend's pool, evaluate in order on the GPU
    worker, store every trial as it completes, tell Optuna. A variant already measured (this run
    or an earlier one), or rendering the same code as one, is not measured again."""

    def __init__(self, family, problem: Problem, options, db: TuningDB, device, backend, start,
                 counts: SearchCounts, progress: Callable[[str], None]):
        self.family, self.problem, self.options = family, problem, options
        self.db, self.device, self.backend = db, device, backend
        self.stored = start.stored  # kernel name -> TrialRecord, grows as trials complete
        self.start = start
        self.counts = counts
        self.progress = progress
        self.compile_options = " ".join(compile_options(device.arch))

    def run(self, started: float) -> None:
        options, space = self.options, self.family.space
        exhaustive = [c.as_dict() for c in space.enumerate()] if options.sampler == "exhaustive" else []
        # Seeds are tried even where the shape would prune them: the default is the baseline.
        self.seed_keys = {_key(p) for p in self.start.seeds}
        study = create_study(space, options.sampler, options.seed, self.start.measured, self.start.seeds, exhaustive)
        dists = distributions(space)
        by_body: dict[str, str] = {}  # source hash with the name masked -> kernel name measured
        pending: collections.deque[_Pending] = collections.deque()
        in_flight: dict[str, _Pending] = {}
        depth = max(2, 2 * options.workers)
        queued = len(study.get_trials(states=(optuna.trial.TrialState.WAITING,)))
        asked = idle_asks = 0
        # The budget counts variants measured for this problem in earlier runs too, so running
        # the same command again finishes an interrupted search instead of starting another.
        launched = sum(1 for t in self.stored.values() if t.status != "rejected")

        def budget_left() -> bool:
            if options.timeout_s is not None and time.monotonic() - started > options.timeout_s:
                return False
            if options.stop_at_us is not None and any(
                    t.status == "ok" and t.time_us <= options.stop_at_us for t in self.stored.values()):
                return False
            if options.sampler == "exhaustive" and asked >= queued:
                return False  # every point was served: the space is exhausted
            # A sampler that keeps proposing measured or invalid points has run out of space.
            return launched < options.trials and idle_asks < MAX_IDLE_ASKS

        while True:
            while len(pending) < depth and budget_left():
                trial = study.ask(dists)
                asked += 1
                outcome = self._classify(trial, in_flight, by_body)
                if outcome is None:
                    idle_asks += 1
                    continue
                idle_asks = 0
                config, name, source = outcome
                entry = _Pending([trial], config, name, source, self.backend.compile(source, self.device.arch))
                pending.append(entry)
                in_flight[name] = entry
                launched += 1
            if not pending:
                break
            entry = pending.popleft()
            record = self._evaluate(entry)
            del in_flight[entry.name]
            self.stored[entry.name] = record
            by_body[_body_hash(entry.source, entry.name)] = entry.name
            value = record.time_us if record.status == "ok" else PENALTY_US
            for trial in entry.trials:
                study.tell(trial, value)
            self._report(record)
        if options.sampler == "exhaustive" and self._unmeasured(exhaustive):
            self.progress("note: the trial budget ended the exhaustive search early (raise --trials)")

    def _classify(self, trial, in_flight, by_body):
        """Reject, reuse or accept an asked trial; returns (config, name, source) to compile."""
        params = trial.params
        if self.family.space.violations(params):
            return self._reject(trial)
        config = self.family.space.check(params)
        if self.family.reject_reason(self.problem, config) and _key(params) not in self.seed_keys:
            return self._reject(trial)
        name = self.family.kernel_name(self.problem.dtype, config, self.problem.traits)
        if name in in_flight:
            in_flight[name].trials.append(trial)
            return None
        source = render(self.family, self.problem.dtype, config, traits=self.problem.traits)
        known = self.stored.get(name) or self.stored.get(by_body.get(_body_hash(source, name), ""))
        if known is not None:  # measured already (this run, or an earlier one): not measured again
            self.counts.reused += 1
            trial.study.tell(trial, known.time_us if known.status == "ok" else PENALTY_US)
            return None
        return config, name, source

    def _reject(self, trial) -> None:
        self.counts.rejected += 1
        trial.study.tell(trial, PENALTY_US)
        return None

    def _evaluate(self, entry: _Pending) -> TrialRecord:
        base = dict(family=self.problem.family, dtype=self.problem.dtype, shape_key=self.problem.shape_key,
                    kernel_name=entry.name, params=entry.config.as_dict(),
                    source_hash=source_hash(entry.source), compile_options=self.compile_options,
                    cache_mode=self.options.cache_mode)
        try:
            cubin = entry.future.result()
        except CompileError as exc:
            record = TrialRecord(status="failed", reason=f"compile: {exc}", **base)
        except Exception as exc:  # a compile worker died
            record = TrialRecord(status="failed", reason=f"compile: {type(exc).__name__}: {exc}", **base)
        else:
            best = min((t.time_us for t in self.stored.values() if t.status == "ok"), default=None)
            outcome = self.backend.evaluator.evaluate(entry.name, cubin, entry.config.as_dict(), best_us=best)
            if outcome.status == "ok":
                record = TrialRecord(status="ok", time_us=statistics.median(outcome.samples_us),
                                     samples_us=outcome.samples_us,
                                     spread_us=max(outcome.samples_us) - min(outcome.samples_us),
                                     error=outcome.error, **base)
            else:
                record = TrialRecord(status="failed", reason=outcome.reason, error=_finite(outcome.error), **base)
        if record.status == "ok":
            self.counts.measured += 1
        else:
            self.counts.failed += 1
        # Stored at once: an interrupted run loses at most the trial in flight.
        return self.db.record_trial(self.device, record)

    def _report(self, record: TrialRecord) -> None:
        done = self.counts.measured + self.counts.failed
        if record.status == "ok":
            best = min((t.time_us for t in self.stored.values() if t.status == "ok"), default=record.time_us)
            self.progress(f"[{done}/{self.options.trials}] {record.kernel_name}: {record.time_us:.2f} us "
                          f"(best {best:.2f} us)")
        else:
            self.progress(f"[{done}/{self.options.trials}] {record.kernel_name}: FAILED {record.reason[:160]}")

    def _unmeasured(self, points: list[dict]) -> int:
        configs = (self.family.space.check(p) for p in points)
        return sum(1 for c in configs if self.family.kernel_name(self.problem.dtype, c, self.problem.traits) not in self.stored
                   and not self.family.reject_reason(self.problem, c))


def _body_hash(source: str, kernel_name: str) -> str:
    # Two configs that render the same code under different names (and comments) are one variant.
    code = re.sub(r"//[^\n]*", "", source.replace(kernel_name, "KERNEL"))
    return source_hash(code)


def _finite(value):
    return value if value is not None and value == value and abs(value) != float("inf") else None
