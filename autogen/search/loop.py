"""The search: Optuna's study (one categorical per parameter) and the loop that feeds it.

The study lives in the tuning database (autogen.search.studies), shared by every worker tuning the same
problem on the same GPU model; autogen's own tables stay the source of truth: a variant is
claimed there before it is compiled (TuningDB.claim), so no two workers measure it, the trial
budget counts every worker's trials, and running the same command again continues the search.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import optuna
from optuna.distributions import CategoricalDistribution
from tuning_db import TuningDB
from tuning_db.records import TrialRecord

from autogen.core.problem import Config, Problem
from autogen.core.render import render, source_hash
from autogen.core.space import Space
from autogen.errors import CompileError, UsageError
from autogen.gpu.compile import compile_options
from autogen.gpu.measure import time_into
from autogen.search import dbstats, studies
from autogen.search.claims import BatchClaims, body_hash, CLAIM_BATCH, Heartbeat, Lease, new_owner, TakeOver
from autogen.search.optuna_internals import FixedSpaceTPESampler
from autogen.search.random_sampler import FixedSpaceRandomSampler
from autogen.search.progress import TrialDone
from autogen.search.studies import PENALTY_US
from autogen.search.winner import trial_from_outcome

SAMPLERS = ("tpe", "random", "exhaustive")

optuna.logging.set_verbosity(logging.WARNING)


def distributions(space: Space) -> dict[str, CategoricalDistribution]:
    return {p.name: CategoricalDistribution(p.choices) for p in space.params}


def make_sampler(name: str, seed: int | None, space: dict[str, CategoricalDistribution]) -> optuna.samplers.BaseSampler:
    if name == "tpe":
        # multivariate: parameters interact (vector width x threads per row);
        # constant_liar: several trials are in flight while the compile pool works ahead.
        return FixedSpaceTPESampler(space, penalty=PENALTY_US, seed=seed, multivariate=True, constant_liar=True,
                                    n_startup_trials=10)
    if name == "random":
        # whole points the search would measure (autogen.search.random_sampler)
        return FixedSpaceRandomSampler(space, seed=seed)
    if name == "exhaustive":
        # every valid point is enqueued first (SearchLoop.run); Optuna's sampler only serves a
        # search that outlives them
        return optuna.samplers.RandomSampler(seed=seed)
    raise UsageError(f"unknown sampler {name!r}; choose one of {', '.join(SAMPLERS)}")


def _key(params: dict) -> tuple:
    return tuple(sorted(params.items()))


# -- the search loop ------------------------------------------------------------------------------

# Consecutive asks that yield only measured, rejected or in-flight points before the search
# counts the space as exhausted (small spaces, or budgets larger than the space).
MAX_IDLE_ASKS = 1000
# Trials stored before the sampler's proposals of measured points are skipped (_would_skip).
SKIP_MEASURED_AFTER = 100
# How stale the sampler's view of the other workers' trials may get (seconds).
REFRESH_S = 1.0


@dataclass
class SearchCounts:
    measured: int = 0
    failed: int = 0
    rejected: int = 0
    reused: int = 0
    taken_over: int = 0  # variants whose worker died, measured here instead
    evaluated: list = field(default_factory=list)  # kernel names evaluated by this loop, in order
    # Seconds this loop's thread spent per part of the search (study_open, ask, prepare, claim,
    # store, wait_gpu, refresh, take_over, wait_others, study_close), its GPU thread's
    # (gpu_thread_idle: between variants, none queued; gpu_thread_compile_wait,
    # gpu_thread_evaluate), and the process's database work over the loop
    # (autogen.search.dbstats: db_*): where the search's wall time goes, reported as phases.
    spent_s: collections.Counter = field(default_factory=collections.Counter)

    def add(self, other: "SearchCounts") -> None:
        for name in ("measured", "failed", "rejected", "reused", "taken_over"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.evaluated += other.evaluated
        self.spent_s.update(other.spent_s)


@dataclass
class _Pending:
    trials: list  # local optuna trials waiting for this variant (none for a take-over)
    config: Config
    name: str
    source: str
    variant: str
    future: concurrent.futures.Future
    taken_over_from: str = ""  # the dead worker whose claim this was


class SearchLoop(TakeOver, BatchClaims):
    """Ask the shared study, claim the variant, render, compile ahead in the backend's pool,
    evaluate in order on the GPU worker, store every trial as it completes (marking its claim
    done), tell Optuna. A variant already measured (this run, an earlier one, or another worker),
    claimed by a live worker, or rendering the same code as one, is not measured again.

    ``owner`` names this worker in claims (autogen.search.claims.new_owner); ``slot`` is its index
    among the problem's loops (its sampler's seed is offset by it, so two GPUs of one machine do
    not propose the same points). Once ``stop`` is set, the loop gives its claims back and ends
    at its next step, never midway through a database transaction as an exception raised by a
    signal would (a GPU agent's SIGTERM: autogen.distributed.gpu_agent)."""

    def __init__(self, family, problem: Problem, options, db: TuningDB, device, backend, start,
                 counts: SearchCounts, progress: Callable[[str], None], owner: str | None = None,
                 slot: int = 0, stop: threading.Event | None = None):
        self.family, self.problem, self.options = family, problem, options
        self.db, self.device, self.backend = db, device, backend
        self.stored = dict(start.stored)  # kernel name -> TrialRecord, grows as trials complete
        self.start = start
        self.counts = counts
        self.progress = progress
        self.compile_options = " ".join(compile_options(device.arch, family.compiler_options))
        self.owner = owner or new_owner()
        self.slot = slot
        self.stop = stop or threading.Event()
        self.lease = Lease(options.lease_s)

    def open_study(self) -> studies.SharedStudy:
        seed = self.options.seed
        if seed is not None and self.slot:
            seed = (seed + 7919 * self.slot) % 2**32
        name = studies.study_name(self.problem, self.options.cache_mode, self.device, self.family.space)
        attrs = {"family": self.problem.family, "dtype": self.problem.dtype, "shape": self.problem.shape_key,
                 "cache_mode": self.options.cache_mode, "gpu": self.device.name,
                 "compute_capability": self.device.compute_capability, "trials_budget": self.options.trials}
        key = (self.device, self.problem.family, self.problem.dtype, self.problem.shape_key, self.options.cache_mode)
        return studies.SharedStudy(self.db, name, make_sampler(self.options.sampler, seed, self.dists), attrs,
                                   self.dists, self.owner, key, complete=self.family.space.complete)

    def run(self, started: float) -> None:
        options, space = self.options, self.family.space
        exhaustive = [c.as_dict() for c in space.enumerate()] if options.sampler == "exhaustive" else []
        # Seeds are tried even where the shape would prune them: the default is the baseline.
        self.seed_keys = {_key(p) for p in self.start.seeds}
        self.dists = dists = distributions(space)
        db_before = dbstats.snapshot()
        with self._timed("study_open"):  # the shared study opens on its writer thread meanwhile
            study = self.study = self.open_study()
            study.add_known(self.start.measured, dists)
            study.refresh(wait=False)
        self.local = study.local
        self.judged_points: dict[tuple, tuple[Config, str] | None] = {}  # see _judged
        if isinstance(self.local.sampler, (FixedSpaceTPESampler, FixedSpaceRandomSampler)):
            self.local.sampler.skip = self._would_skip
        self.fixed = collections.deque(self.start.seeds + exhaustive)  # asked first, in order
        self.by_body: dict[str, str] = {}  # source hash with the name masked -> kernel name measured
        self.in_flight: dict[str, _Pending] = {}
        depth = max(2, 2 * options.compile_workers()) + CLAIM_BATCH - 1
        self.idle_asks = 0
        self.budget_reached = self.space_done = False
        last_check = 0.0

        def may_ask() -> bool:
            if self.timed_out(started):
                return False
            if options.stop_at_us is not None and any(
                    t.status == "ok" and t.time_us <= options.stop_at_us for t in self.stored.values()):
                return False
            # A sampler that keeps proposing measured or invalid points has run out of space.
            return not (self.budget_reached or self.space_done) and self.idle_asks < MAX_IDLE_ASKS

        # The GPU measures the variants in the "autogen-gpu" thread (which waits on the GPU
        # worker's pipe), each queued as soon as it is claimed, so the GPU goes from one to the
        # next while this thread asks, renders, claims and stores. `pending` holds every variant
        # claimed and not yet stored, in order; `depth` bounds it.
        gpu = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="autogen-gpu")
        pending: collections.deque[tuple[_Pending, concurrent.futures.Future]] = collections.deque()
        self.gpu_best_us = None  # the best time the GPU thread measured in this search
        self.gpu_free_at = None  # when the GPU thread finished its last variant (gpu_thread_idle)

        def submit(entry: _Pending) -> None:
            best = min((t.time_us for t in self.stored.values() if t.status == "ok"), default=None)
            pending.append((entry, gpu.submit(self._measure, entry, best)))

        with Heartbeat(self.db, self.owner, self.lease):
            try:
                while True:
                    if self.stop.is_set():
                        self._abandon()
                        break
                    if time.monotonic() - last_check > self.lease.heartbeat_s / 2:
                        last_check = time.monotonic()
                        with self._timed("take_over"):
                            taken = self._take_over_lapsed()
                        for entry in taken:
                            submit(entry)
                    with self._timed("refresh"):
                        study.refresh(min_interval_s=REFRESH_S, wait=False)
                    can_ask = len(pending) <= depth - CLAIM_BATCH and may_ask()
                    # Results are stored and told only once asking is done for now (not as soon
                    # as the GPU is done), oldest first: the order of asks and tells, hence a
                    # seeded search, does not depend on timing.
                    if pending and not can_ask:
                        entry, future = pending.popleft()
                        with self._timed("wait_gpu"):
                            outcome = future.result()
                        self._complete(entry, outcome)
                        continue
                    if can_ask:
                        for entry in self._next_batch(depth - len(pending), may_ask):
                            self.in_flight[entry.name] = entry
                            submit(entry)
                        continue
                    # Done asking (or out of time: then the drain only says what others still
                    # hold): wait for the other workers' variants of this problem, and take over
                    # those whose worker died.
                    with self._timed("wait_others"):  # the other workers' claims in flight
                        taken = self._drain(started)
                    for entry in taken:
                        submit(entry)
                    if not pending:
                        break
            except BaseException:
                self._abandon()
                raise
            finally:
                gpu.shutdown(wait=True, cancel_futures=True)
                with self._timed("study_close"):
                    study.close()
                self.counts.spent_s.update(dbstats.snapshot().minus(db_before).as_phases())
        study.wait_open()  # a search that ended before a refresh saw the study fail to open fails too
        if options.sampler == "exhaustive" and self._unmeasured(exhaustive):
            self.progress("note: the trial budget ended the exhaustive search early (raise --trials)")

    def timed_out(self, started: float) -> bool:
        return self.options.timeout_s is not None and time.monotonic() - started > self.options.timeout_s

    # -- asking and claiming ----------------------------------------------------------------------

    def _ask(self) -> optuna.trial.Trial | None:
        """The next trial: the fixed points first (seeds, then the exhaustive sweep), then the
        sampler's. None when an exhaustive sweep is over."""
        while self.fixed:
            params = self.fixed.popleft()
            if self._locally_known(params):
                continue
            self.local.enqueue_trial(params)
            return self._ask_local()
        if self.options.sampler == "exhaustive":
            self.space_done = True
            return None
        return self._ask_local()

    def _ask_local(self) -> optuna.trial.Trial:
        trial = self.local.ask(self.dists)
        self._tell_unasked()
        return trial

    def _tell_unasked(self) -> None:
        """Tell TPE the proposals its sampler made for the search during the ask without asking
        (the best of each group of candidate batches all skipped: FixedSpaceTPESampler.unasked),
        as their own asks would have been told: rejected (very slow), or a measured point's time.
        Each was an ask and a TPE fit before, the most of a new user's first tune; told, they
        still steer TPE away from the space's invalid regions (docs/internals.md, "The search")."""
        points = getattr(self.local.sampler, "unasked", None)
        if not points:
            return
        self.local.sampler.unasked = []
        for params in points:
            self.idle_asks += 1
            judged = self._judged(params)
            known = self.stored.get(judged[1]) if judged is not None else None
            if judged is not None and known is None:
                continue  # in flight: told its measurement with the asks that wait on it
            if known is None:
                self.counts.rejected += 1
            else:
                self.counts.reused += 1
            value = known.time_us if known is not None and known.status == "ok" else PENALTY_US
            self.local.add_trial(optuna.trial.create_trial(params=params, distributions=self.dists, value=value))

    def _would_skip(self, params: dict) -> bool:
        """Whether the search would not measure a point the sampler may propose: invalid, or
        pruned for this shape (seeds aside); and in a long search, measured or in flight.
        Early on, TPE's repeated proposals of measured points (told their known times) sharpen
        its model: skipping them then found worse winners (replayed recordings, the tests' aid);
        past SKIP_MEASURED_AFTER trials they only cost a TPE fit each, for no better winner."""
        judged = self._judged(params)
        if judged is None:
            return True
        name = judged[1]
        return len(self.stored) >= SKIP_MEASURED_AFTER and (name in self.stored or name in self.in_flight)

    def _judged(self, params: dict) -> tuple[Config, str] | None:
        """(config, kernel name) of a point the search would measure, None for one it rejects
        (invalid, or pruned for this shape unless it is a seed); judged once per point, for the
        sampler's candidates (_would_skip) and the asked trials (_classify) alike."""
        key = _key(params)
        if key not in self.judged_points:
            judged = None
            if not self.family.space.violations(params):
                config = self.family.space.check(params)
                if not self.family.reject_reason(self.problem, config) or key in self.seed_keys:
                    judged = config, self.family.kernel_name(self.problem.dtype, config, self.problem.traits)
            self.judged_points[key] = judged
        return self.judged_points[key]

    def _locally_known(self, params: dict) -> bool:
        if self.family.space.violations(params):
            return False  # rejected (and counted) when asked
        name = self.family.kernel_name(self.problem.dtype, self.family.space.check(params), self.problem.traits)
        return name in self.stored or name in self.in_flight

    def _timed(self, part: str):
        return time_into(self.counts.spent_s, part)

    def _pending(self, trials: list, config: Config, name: str, source: str, variant: str,
                 taken_over_from: str = "") -> _Pending:
        """Claimed: handed to the compile pool."""
        return _Pending(trials, config, name, source, variant, self.backend.compile(source, self.device.arch,
                                                                                   self.family.compiler_options),
                        taken_over_from)

    def _classify(self, trial):
        """Reject, reuse or accept an asked trial; returns (config, name, source) to claim."""
        judged = self._judged(trial.params)
        if judged is None:
            return self._reject(trial)
        config, name = judged
        if name in self.in_flight:
            self.in_flight[name].trials.append(trial)
            return None
        source = render(self.family, self.problem.dtype, config, traits=self.problem.traits)
        known = self.stored.get(name) or self.stored.get(self.by_body.get(body_hash(source, name), ""))
        if known is not None:  # measured already (this run, or an earlier one): not measured again
            self.counts.reused += 1
            self.local.tell(trial, known.time_us if known.status == "ok" else PENALTY_US)
            return None
        return config, name, source

    def _reject(self, trial) -> None:
        self.counts.rejected += 1
        self.local.tell(trial, PENALTY_US)
        return None

    # -- measuring ----------------------------------------------------------------------------------

    def _complete(self, entry: _Pending, outcome) -> None:
        """Store a measured variant (its claim marked done) and tell the samplers."""
        with self._timed("store"):
            self._store(entry, outcome)

    def _store(self, entry: _Pending, outcome) -> None:
        record = self._record(entry, outcome)
        del self.in_flight[entry.name]
        self.stored[entry.name] = record
        self.by_body[entry.variant] = entry.name
        value = record.time_us if record.status == "ok" else PENALTY_US
        attrs = {"kernel": entry.name, "status": record.status}
        if entry.taken_over_from:
            attrs["taken_over_from"] = entry.taken_over_from
        self.study.record(entry.config.as_dict(), self.dists, value, attrs)
        for trial in entry.trials:
            self.local.tell(trial, value)
        if not entry.trials:  # a take-over: the local sampler learns it too
            self.local.add_trial(optuna.trial.create_trial(
                params=entry.config.as_dict(), distributions=self.dists, value=value))
        self._report(record)

    def _record_base(self, name: str, config: Config, source: str) -> TrialRecord:
        return TrialRecord(family=self.problem.family, dtype=self.problem.dtype, shape_key=self.problem.shape_key,
                           kernel_name=name, params=config.as_dict(), status="rejected",
                           source_hash=source_hash(source, self.family.compiler_options),
                           compile_options=self.compile_options,
                           cache_mode=self.options.cache_mode)

    def _measure(self, entry: _Pending, best_us: float | None):
        """On the "autogen-gpu" thread: wait for the variant's compile, then time it on the GPU
        worker (`best_us`: the best time so far, for stopping a clearly slower variant early).
        Returns the Outcome, or the compile error."""
        if self.gpu_free_at is not None:  # the GPU waited for the loop to queue this variant
            self.counts.spent_s["gpu_thread_idle"] += time.monotonic() - self.gpu_free_at
        try:
            return self._compiled_and_measured(entry, best_us)
        finally:
            self.gpu_free_at = time.monotonic()

    def _compiled_and_measured(self, entry: _Pending, best_us: float | None):
        try:
            with self._timed("gpu_thread_compile_wait"):
                cubin = entry.future.result()
        except CompileError as exc:
            return exc
        except Exception as exc:  # a compile worker died
            return CompileError(f"{type(exc).__name__}: {exc}")
        # The best so far: stored when this variant was queued, or measured since by this thread
        # (in queue order, so a seeded search stops the same variants early every time).
        if self.gpu_best_us is not None:
            best_us = self.gpu_best_us if best_us is None else min(best_us, self.gpu_best_us)
        with self._timed("gpu_thread_evaluate"):
            outcome = self.backend.evaluator.evaluate(entry.name, cubin, entry.config.as_dict(), best_us=best_us)
        if outcome.status == "ok" and outcome.samples_us:
            measured = statistics.median(outcome.samples_us)
            self.gpu_best_us = measured if self.gpu_best_us is None else min(self.gpu_best_us, measured)
        return outcome

    def _record(self, entry: _Pending, outcome) -> TrialRecord:
        base = dict(family=self.problem.family, dtype=self.problem.dtype, shape_key=self.problem.shape_key,
                    kernel_name=entry.name, params=entry.config.as_dict(),
                    source_hash=source_hash(entry.source, self.family.compiler_options),
                    compile_options=self.compile_options,
                    cache_mode=self.options.cache_mode)
        if isinstance(outcome, CompileError):
            record = TrialRecord(status="failed", reason=f"compile: {outcome}", **base)
        else:
            self.counts.evaluated.append(entry.name)
            record = trial_from_outcome(outcome, base)
        if record.status == "ok":
            self.counts.measured += 1
        else:
            self.counts.failed += 1
        # Stored at once, with its claim marked done: an interrupted run loses at most the trials
        # in flight, and their claims are given back (or lapse).
        return self.db.complete_claim(self.device, record, entry.variant, self.owner)

    def _report(self, record: TrialRecord) -> None:
        done = self.counts.measured + self.counts.failed
        best = min((t.time_us for t in self.stored.values() if t.status == "ok"), default=None)
        stored = sum(1 for t in self.stored.values() if t.status != "rejected")
        ok = record.status == "ok"
        self.progress(TrialDone(str(self.problem), done, stored, self.options.trials, record.kernel_name,
                                record.time_us if ok else None, best, "" if ok else record.reason))

    def _unmeasured(self, points: list[dict]) -> int:
        configs = (self.family.space.check(p) for p in points)
        return sum(1 for c in configs if self.family.kernel_name(self.problem.dtype, c, self.problem.traits) not in self.stored
                   and not self.family.reject_reason(self.problem, c))
