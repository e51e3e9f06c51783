"""Optuna studies kept in the tuning database, shared by every worker that tunes the same problem.

A study lives in Optuna's RDB storage on the same database URL as autogen's own tables (Optuna's
tables are not prefixed ``autogen_``, so the two never collide), named after what makes its
measurements comparable: family, dtype, shape, cache mode and GPU model. Every process tuning
that problem on that GPU model, on this machine or another one, opens the same study, so each
sampler sees every trial. What keeps a variant from being measured twice, and the trial budget
global, is autogen's claim table (TuningDB.claim); a worker's Heartbeat keeps its claims alive,
and a worker that stops beating (killed, machine lost) loses them after the lease: the others take
its variants over (autogen.search.claims). Optuna's own trial heartbeat is not used: only
finished trials are written to the shared study (see SharedStudy), so none is ever left RUNNING.
Optuna's private interfaces that the batched writes need are in autogen.search.optuna_internals.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import secrets
import threading
import time
from typing import Callable

import optuna
from sqlalchemy import event
from optuna.trial import TrialState
from sqlalchemy.engine import make_url
from tuning_db import TuningDB

from autogen.core.problem import Problem
from autogen.core.space import Space
from autogen.search.optuna_internals import add_trials

log = logging.getLogger("autogen.search.studies")


SQLITE_TIMEOUT_S = 30.0
STORAGE_ATTEMPTS = 5  # workers starting together race to create Optuna's tables: retried
# Told to Optuna for rejected or failed variants: worse than any real time, still finite.
PENALTY_US = 1e9


def study_name(problem: Problem, cache_mode: str, device, space: Space) -> str:
    """One study per (family, dtype, shape, cache mode, GPU model, search space): identical GPUs
    share it. The space's parameters and choices are in the name because Optuna refuses trials
    whose distributions differ from a study's earlier ones: a new autogen whose family gained or
    lost a choice opens a new study (the stored trials that fit its space are told to it)."""
    return (f"autogen:{problem.family}:{problem.dtype}:{problem.shape_key}:{cache_mode}:"
            f"{device.name}:cc{device.compute_capability}:space-{space.digest()}")


_storages: dict[tuple, optuna.storages.BaseStorage] = {}
_storages_lock = threading.Lock()


def storage(url: str) -> optuna.storages.BaseStorage:
    """Optuna's storage on ``url`` (one per process and URL); an in-memory SQLite URL, which no
    other process can see, gets Optuna's in-memory storage."""
    with _storages_lock:
        if url not in _storages:
            _storages[url] = _open_storage(url)
        return _storages[url]


def open_storage_soon(url: str) -> None:
    """Open Optuna's storage on ``url`` (storage()) on a daemon thread, so that it overlaps what
    the caller waits for (the GPU worker's CUDA context). On a new database that takes a large
    share of the search's start: Optuna creates its tables and loads its alembic scripts. A failure here
    is left for the search's own storage() call to raise."""
    def open_() -> None:
        try:
            storage(url)
        except Exception:
            pass

    threading.Thread(target=open_, name="autogen-optuna-storage", daemon=True).start()


def _open_storage(url: str) -> optuna.storages.BaseStorage:
    parsed = make_url(url)
    sqlite = parsed.get_backend_name() == "sqlite"
    if sqlite and (parsed.database or "") in ("", ":memory:"):
        return optuna.storages.InMemoryStorage()
    engine_kwargs: dict = {"pool_pre_ping": True}
    if sqlite:
        # The driver must not begin transactions itself: SQLAlchemy's begin event below emits
        # BEGIN IMMEDIATE, so processes queue for the write lock (busy timeout) instead of
        # failing on a stale snapshot, as tuning_db's own engine does.
        engine_kwargs["connect_args"] = {"timeout": SQLITE_TIMEOUT_S, "isolation_level": None}
    last: Exception | None = None
    for attempt in range(STORAGE_ATTEMPTS):
        try:
            rdb = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
            break
        except Exception as exc:  # two workers creating Optuna's tables at once: one loses
            last = exc
            threading.Event().wait(0.2 * (attempt + 1) + secrets.randbelow(100) / 1000)
    else:
        raise last  # type: ignore[misc]
    if sqlite:
        rdb.engine.dispose()  # connections made from now on get the settings below

        @event.listens_for(rdb.engine, "connect")
        def configure(dbapi_connection, _record) -> None:
            dbapi_connection.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at checkpoints

        @event.listens_for(rdb.engine, "begin")
        def begin(connection) -> None:
            connection.exec_driver_sql("BEGIN IMMEDIATE")
    return rdb


def open_study(db: TuningDB, name: str, sampler: optuna.samplers.BaseSampler, attrs: dict) -> optuna.Study:
    """The shared study ``name`` (created if missing) with this worker's sampler; ``attrs`` are
    stored as the study's user attributes (what optuna-dashboard shows beside its name)."""
    shared = storage(db.url)
    for attempt in range(STORAGE_ATTEMPTS):
        try:
            study = optuna.create_study(storage=shared, study_name=name, sampler=sampler,
                                        direction="minimize", load_if_exists=True)
            break
        except (optuna.exceptions.DuplicatedStudyError, optuna.exceptions.StorageInternalError):
            if attempt == STORAGE_ATTEMPTS - 1:
                raise
            threading.Event().wait(0.1 * (attempt + 1))
    known = study.user_attrs
    for key, value in attrs.items():
        if known.get(key) != value:
            study.set_user_attr(key, value)
    return study


# How often a worker's writer thread adds its measured variants to the shared study (seconds);
# the other workers read it every autogen.search.loop.REFRESH_S.
FLUSH_S = 0.5
# Each write holds the study's row lock (PostgreSQL) or the file's write lock (SQLite), and every
# worker writes on its own clock, so the lock's load grows with the workers, not the trials; many
# simulated workers queued behind it (measured: docs/distributed.md, "On 32 cores"). So a worker
# spaces its writes by FLUSH_SPACING times what its last write took, lock wait included (at most
# MAX_FLUSH_S): alone it writes every FLUSH_S; where the lock is contended, every worker writes
# less often, in bigger batches.
FLUSH_SPACING = 40
MAX_FLUSH_S = 10.0


def flush_interval(last_write_s: float) -> float:
    """Seconds between a worker's writes to the shared study, after one that took ``last_write_s``."""
    return min(MAX_FLUSH_S, max(FLUSH_S, FLUSH_SPACING * last_write_s))


class StudyWriteError(Exception):
    """A batch of ``trials`` finished trials could not be added to the shared study."""

    def __init__(self, trials: int, cause: Exception):
        super().__init__(f"{trials} trial(s): {type(cause).__name__}: {cause}")
        self.trials = trials


class SharedStudy:
    """A worker's view of a shared study: its sampler runs on a local in-memory mirror.

    Optuna's RDB storage costs a transaction per suggested parameter (tens of ms per ask on
    SQLite), which would leave the GPU idle, and most asks are rejected (invalid for the shape) or
    duplicates that other workers need not see. So the sampler asks and is told locally; each
    variant this worker measures is added to the shared study as a finished trial, from a
    background thread, off the GPU's critical path. ``refresh`` pulls into the mirror the other
    workers' finished trials and, from autogen's claims, the variants they are measuring now
    (RUNNING, which TPE's constant liar counts), so every sampler sees every trial; a random
    sampler, which reads no history, gets none of them.

    The shared study itself is opened on that thread too: Optuna's storage on a new database
    (its tables, its Alembic stamp) held up the search's first variant while the GPU waited
    (docs/history/sessions.md, eleventh session). The mirror needs none of it to start: what this problem's
    earlier runs measured comes from autogen's tables (add_known), and the other workers'
    trials arrive with the first refresh after the opening."""

    def __init__(self, db: TuningDB, name: str, sampler: optuna.samplers.BaseSampler, attrs: dict,
                 dists: dict, owner: str, problem_key: tuple, complete: Callable[[dict], dict] = dict):
        self.db, self.dists, self.owner = db, dists, owner
        # The family's Space.complete: a trial or claim of an older autogen, from before a parameter
        # was added, is mirrored with that parameter's old behaviour, so TPE (which fits only the
        # trials holding every parameter of its space) still learns from it.
        self.complete = complete
        self.problem_key = problem_key  # (device, family, dtype, shape key, cache mode): its claims
        # The mirror's storage, kept to write trials with their states (and RUNNING ones' ids) as
        # Study.add_trial cannot: BaseStorage's public interface, no Study internals.
        self._mirror = optuna.storages.InMemoryStorage()
        self.local = optuna.create_study(storage=self._mirror, direction="minimize", sampler=sampler)
        self._mirror_id = self._mirror.get_study_id_from_name(self.local.study_name)
        # A random sampler reads no history: copying the other workers' trials and claims into its
        # mirror would only cost this worker's CPU, (workers - 1) copies per trial of its own.
        self._learns = not isinstance(sampler, optuna.samplers.RandomSampler)
        self._shared_id: int | None = None  # the shared study's id in its storage, once written to
        self._mirrored: set[int] = set()  # numbers of the shared trials in the mirror
        self._known: set[str] = set()  # kernels in the mirror: from autogen's tables, or measured here
        self._running: dict[str, int] = {}  # others' claimed variants -> their RUNNING local trial
        self._last_refresh = -math.inf
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="autogen-study")
        # The writer's first task: every later one (writes, add_known's, add_missing's) finds it done.
        self._opened = self._writer.submit(open_study, db, name, optuna.samplers.RandomSampler(), attrs)
        self._writes: list[concurrent.futures.Future] = []
        # Measured variants waiting for the writer, written together (see record).
        self._queue: list[optuna.trial.FrozenTrial] = []
        self._queue_lock = threading.Lock()
        self._closing = threading.Event()
        self._last_flush = -math.inf
        self._flush_s = FLUSH_S  # flush_interval of the last write
        self._checked_params = False  # the stored distributions of the params were compared once

    @property
    def shared(self) -> optuna.Study:
        """The shared study, once open (waits for it; raises what opening it raised)."""
        return self._opened.result()

    def refresh(self, min_interval_s: float = 0.0, wait: bool = True) -> None:
        """Mirror the other workers' finished trials and running claims. ``wait``: for the shared
        study to be open (else its trials wait for a later refresh; a failure to open it is
        raised as soon as it is known either way)."""
        now = time.monotonic()
        if now - self._last_refresh < min_interval_s:
            return
        self._last_refresh = now
        if not self._learns:
            if wait or self._opened.done():
                self.wait_open()
            return
        if wait or self._opened.done():
            self._mirror_finished()
        self._mirror_running()

    def _mirror_finished(self) -> None:
        for trial in self.shared.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if trial.number in self._mirrored or trial.user_attrs.get("worker") == self.owner:
                continue
            self._mirrored.add(trial.number)
            if trial.user_attrs.get("kernel") in self._known:
                continue  # in the mirror already (from autogen's tables, or measured here)
            params = self.complete(trial.params)
            dists = {name: trial.distributions.get(name) or self.dists[name] for name in params}
            self._mirror.create_new_trial(self._mirror_id, template_trial=optuna.trial.create_trial(
                params=params, distributions=dists, value=trial.value))

    def _mirror_running(self) -> None:
        live = {c.variant: c for c in self.db.claims(*self.problem_key, running=True)
                if c.owner != self.owner and c.expires_in_s > 0 and c.params is not None}
        for variant, local in list(self._running.items()):
            if variant not in live:  # measured (its finished trial arrives above) or abandoned
                self._mirror.set_trial_state_values(local, TrialState.FAIL)
                del self._running[variant]
        for variant, claim in live.items():
            params = self.complete(claim.params)
            if variant in self._running or set(params) != set(self.dists):
                continue
            try:
                template = optuna.trial.create_trial(state=TrialState.RUNNING, params=params,
                                                     distributions=self.dists)
            except ValueError:  # params outside this space (another autogen version)
                continue
            self._running[variant] = self._mirror.create_new_trial(self._mirror_id, template_trial=template)

    def record(self, params: dict, dists: dict, value: float, user_attrs: dict) -> None:
        """Add a measured variant to the shared study (in the background, in order).

        The writer thread writes what is queued in one transaction, at most every FLUSH_S (more
        seldom where the study's lock is contended: flush_interval): an
        Optuna add_trial costs ~35 statements (a query per parameter) and took the GIL and the
        write lock from the search loop's claims once per trial. What a killed worker had queued
        is added by whoever takes its claims over (add_missing), or by the next run (add_known):
        autogen's tables, not the study, hold the measurements."""
        template = optuna.trial.create_trial(params=params, distributions=dists, value=value,
                                             user_attrs={**user_attrs, "worker": self.owner})
        if "kernel" in user_attrs:
            self._known.add(user_attrs["kernel"])
        with self._queue_lock:
            self._queue.append(template)
            if len(self._queue) > 1:
                return  # a flush is submitted already and has not taken the queue yet
        self._writes.append(self._writer.submit(self._flush))

    def _flush(self) -> None:
        self._closing.wait(self._last_flush + self._flush_s - time.monotonic())  # close() cuts the wait short
        with self._queue_lock:
            batch, self._queue = self._queue, []
        self._last_flush = time.monotonic()
        if batch:
            started = None
            try:
                self._opened.result()  # the study's opening (its tables, on a new database) is not a write's cost
                started = time.monotonic()
                self._add_trials(batch)
            except Exception as exc:
                raise StudyWriteError(len(batch), exc) from exc
            finally:
                if started is not None:
                    self._flush_s = flush_interval(time.monotonic() - started)

    def _add_trials(self, templates: list) -> None:
        """Add finished trials to the shared study in one transaction."""
        shared = self.shared  # opened on storage(self.db.url)
        rdb = storage(self.db.url)
        if not isinstance(rdb, optuna.storages.RDBStorage):
            for template in templates:  # Optuna's in-memory storage (an in-memory database URL)
                shared.add_trial(template)
            return
        if self._shared_id is None:
            self._shared_id = rdb.get_study_id_from_name(shared.study_name)
        add_trials(rdb, self._shared_id, templates, check_params=not self._checked_params)
        self._checked_params = True

    def wait_open(self) -> None:
        """Wait for the shared study to be open; raise what opening it raised."""
        self._opened.result()

    def close(self) -> int:
        """Wait for the background writes; returns how many trials could not be written (each
        failure is logged)."""
        self._closing.set()
        self._writer.shutdown(wait=True)
        failed = 0
        for future in self._writes:
            exc = future.exception()
            if exc is not None:
                failed += exc.trials if isinstance(exc, StudyWriteError) else 1
                log.warning("a trial could not be added to the shared study: %s", exc)
        return failed

    def add_missing(self, measured: dict[str, tuple[dict, float]], attrs: dict) -> None:
        """Add (in the background, after this worker's own writes) the measured variants the
        shared study lacks: a killed worker's last trials, stored in autogen's tables but not yet
        written to the study when it died."""
        self._add_lacking(measured, self.dists, attrs)

    def add_known(self, measured: dict[str, tuple[dict, float]], dists: dict) -> None:
        """Mirror what autogen's tables hold of this problem (kernel -> (params, value), every
        run's and worker's), and tell the shared study, in the background, those it does not know
        yet (measured before studies were shared, or by an older autogen)."""
        if self._learns:
            for name, (params, value) in measured.items():
                self._mirror.create_new_trial(self._mirror_id, template_trial=optuna.trial.create_trial(
                    params=params, distributions=dists, value=value))
                self._known.add(name)
        self._add_lacking(measured, dists, {})

    def _add_lacking(self, measured: dict[str, tuple[dict, float]], dists: dict, attrs: dict) -> None:
        """On the writer thread: add to the shared study the variants of ``measured`` it lacks."""
        def add() -> None:
            have = {t.user_attrs.get("kernel") for t in self.shared.get_trials(deepcopy=False)}
            missing = [optuna.trial.create_trial(params=params, distributions=dists, value=value,
                                                 user_attrs={"kernel": name, **attrs})
                       for name, (params, value) in measured.items() if name not in have]
            if missing:
                self._add_trials(missing)
        self._writes.append(self._writer.submit(add))
