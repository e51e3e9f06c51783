"""The one module through which every read and write of the tuning database passes.

TuningDB turns rows into the frozen records of tuning_db.records inside a transaction, so
nothing a caller holds depends on a live session. Writes are upserts on unique keys
(INSERT ... ON CONFLICT DO UPDATE), which keeps concurrent processes safe without read-then-write;
the one decision that must read first, whether a new winner replaces the stored one, is taken
under the write lock (TuningDB.set_winner).

Reads check every row: a row that cannot become a record (params that are not a JSON object, a
time stored as text, a malformed shape key, a winner whose trial failed...) is skipped and
reported as an InvalidRow by the ``*_checked`` methods, never raised from the middle of a listing.

``TuningDB(url, readonly=True)`` only reads: it never creates a file or folder, migrates,
switches the journal mode or creates tables, and it reads older schemas where it can.

Beside it: tuning_db.engine (URLs, engines, the transaction helper, opening and migrating) and
tuning_db.rows (what the schema at hand holds, rows checked into records).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, timezone
from typing import Any, TypeVar

from sqlalchemy import bindparam, delete, func, insert, literal, select, text, true, update
from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import Session

from tuning_db import migrations
from tuning_db.engine import (
    as_url,
    autocommitted,
    BEGIN_OPTION,
    _create_engine,
    DatabaseError,
    display_url,
    forget_writer,
    InvalidRowError,
    _migrate,
    note_writer,
    _prepare,
    _readonly_engine,
    _require_head,
    _require_head_readonly,
    _sqlite_file,
    transaction,
    UPGRADE_HINT,
    upsert_template,
    write_queue,
)
from tuning_db.rows import (
    CACHE_MODES,
    _EMPTY,
    _HEAD,
    _invalid_trial,
    _invalid_winner,
    _Malformed,
    _read_schema,
    _Schema,
    _sorted_checked,
    _trial_columns,
    _trial_record,
    TRIAL_STATUSES,
    _winner_columns,
    _winner_mode,
    _winner_record,
)
from tuning_db.models import Base, ClaimRow, GpuRow, TrialRow, ValidationRow, WinnerRow
from tuning_db.records import (
    Claim,
    ClaimRecord,
    DeviceIdentity,
    InvalidRow,
    TrialRecord,
    ValidationRecord,
    WinnerRecord,
)

T = TypeVar("T")


GPU_KEY = ("name", "compute_capability")
TRIAL_KEY = ("gpu_id", "family", "dtype", "shape_key", "kernel_name", "cache_mode")
WINNER_KEY = ("gpu_id", "family", "dtype", "shape_key", "cache_mode")
VALIDATION_KEY = ("gpu_id", "family", "dtype", "shape_key", "source_hash")

UNSYNCHRONIZED = {"synchronize_session": False}  # bulk deletes: the session holds no rows to update


# -- the repository -------------------------------------------------------------------------------


class TuningDB:
    """Trials, winners and validations of autogen, stored through SQLAlchemy.

    ``TuningDB(url)`` creates a missing SQLite file (and its folder) and migrates the schema to
    head; a database holding other applications' tables and no autogen table is refused (the
    explicit ``upgrade(url)``, `autogen db upgrade`, adds autogen's tables to it).
    ``upgrade=False`` requires the head schema instead, except that ``create=True`` still creates
    it in a new database. ``readonly=True`` never writes anything anywhere: see _readonly_engine;
    a missing SQLite file reads as an empty database, an older schema is read where it can be.
    """

    def __init__(
        self,
        url: str | os.PathLike | None = None,
        *,
        upgrade: bool = True,
        readonly: bool = False,
        create: bool = False,
    ):
        self._url = as_url(url)
        self._readonly = readonly
        self._gpu_ids: dict[tuple[str, str], int] = {}  # see _gpu_id
        self._schema: _Schema | None = None if readonly else _HEAD
        if readonly:
            self._engine = _readonly_engine(self._url)
            self._writer = None
            return
        if not upgrade:
            # Refused before a writing connection exists: that one would already switch the
            # journal mode of a database it is not going to use.
            _require_head_readonly(self._url, create)
        _prepare(self._url)
        self._engine = _create_engine(self._url)
        # SQLite writers take the write lock at BEGIN, so a transaction that reads before it
        # writes waits for other writers (busy_timeout) instead of failing on a stale snapshot.
        self._writer = self._engine.execution_options(**{BEGIN_OPTION: "IMMEDIATE"})
        try:
            if upgrade:
                _migrate(self._engine, self._url)
            else:
                _require_head(self._engine, self._url, create)
        except BaseException:
            self._engine.dispose()
            raise
        note_writer(self._url, self._engine)

    @classmethod
    def open_readonly(cls, url: str | os.PathLike | None = None) -> TuningDB:
        """Same as ``TuningDB(url, readonly=True)``."""
        return cls(url, readonly=True)

    @property
    def url(self) -> str:
        return self._url

    @property
    def readonly(self) -> bool:
        return self._readonly

    def close(self) -> None:
        if self._engine is not None:
            forget_writer(self._engine)
            self._engine.dispose()

    def __enter__(self) -> TuningDB:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = ", readonly=True" if self._readonly else ""
        return f"TuningDB({display_url(self._url)!r}{mode})"

    # -- trials -----------------------------------------------------------------------------------

    def record_trial(self, device: DeviceIdentity, trial: TrialRecord) -> TrialRecord:
        """Store a trial, replacing an earlier measurement of the same kernel and cache mode."""
        _check_choice("status", trial.status, TRIAL_STATUSES)
        _check_choice("cache_mode", trial.cache_mode, CACHE_MODES)
        try:
            values = TrialRow.values_of(device, trial)
        except TypeError as exc:  # params that JSON cannot hold
            raise ValueError(f"{_describe(device, trial)}: params are not JSON: {exc}") from exc
        with self._write() as session:
            values.update(gpu_id=self._upsert_gpu(session, device), created_at=_now())
            trial_id = self._upsert(session, TrialRow, values, TRIAL_KEY)
            if trial.status != "ok":
                # A winner always points at an ok trial: a failed re-measurement withdraws it.
                session.execute(delete(WinnerRow).where(WinnerRow.trial_id == trial_id))
            return session.get_one(TrialRow, trial_id).to_record()

    def find_trial(
        self,
        device: DeviceIdentity,
        family: str,
        dtype: str,
        shape_key: str,
        kernel_name: str,
        cache_mode: str = "cold",
    ) -> TrialRecord | None:
        """The stored trial; None when there is none or the row is malformed (trials_checked
        reports it; recording the trial again replaces it)."""
        found, _bad = self.trials_checked(device, family, dtype, shape_key, cache_mode,
                                          kernel_name=kernel_name)
        return found[0] if found else None

    def trials(
        self,
        device: DeviceIdentity,
        family: str,
        dtype: str,
        shape_key: str,
        cache_mode: str | None = None,
    ) -> list[TrialRecord]:
        """Every well-formed trial of one problem, oldest first (malformed rows: trials_checked)."""
        return self.trials_checked(device, family, dtype, shape_key, cache_mode)[0]

    def trials_checked(
        self,
        device: DeviceIdentity,
        family: str,
        dtype: str,
        shape_key: str,
        cache_mode: str | None = None,
        *,
        kernel_name: str | None = None,
    ) -> tuple[list[TrialRecord], list[InvalidRow]]:
        """(the well-formed trials of one problem, oldest first; the malformed rows, as found)."""

        def read(session: Session, schema: _Schema):
            if not schema.has_table(TrialRow):
                return [], []
            query = (
                select(*_trial_columns(schema), GpuRow.name.label("g_name"))
                .join(GpuRow, TrialRow.gpu_id == GpuRow.id)
                .where(*_same_problem(TrialRow, device, family, dtype, shape_key))
            )
            if cache_mode is not None:
                query = query.where(schema.column(TrialRow, "cache_mode") == cache_mode)
            if kernel_name is not None:
                query = query.where(TrialRow.kernel_name == kernel_name)
            rows = session.execute(query.order_by(TrialRow.created_at, TrialRow.id))
            return _sorted_checked(rows, _trial_record, _invalid_trial)

        return self._reading(read, ([], []))

    def delete_trials(self, device: DeviceIdentity, family: str, dtype: str, shape_key: str) -> int:
        """Forget one problem's trials and winners (a forced re-tune); returns the trials deleted."""
        with self._write() as session:
            gpu_id = _lock_gpu(session, device)
            if gpu_id is None:
                return 0
            for cache_mode in CACHE_MODES:  # no claim of the problem is decided meanwhile
                _lock_problem(session, gpu_id, family, dtype, shape_key, cache_mode)
            deleted = 0
            for model in (ClaimRow, WinnerRow, TrialRow):  # the winner first: it references a trial
                statement = delete(model).where(
                    model.gpu_id == gpu_id,
                    model.family == family,
                    model.dtype == dtype,
                    model.shape_key == shape_key,
                )
                deleted = session.execute(statement, execution_options=UNSYNCHRONIZED).rowcount
            return deleted

    # -- winners ----------------------------------------------------------------------------------

    def set_winner(
        self,
        device: DeviceIdentity,
        trial: TrialRecord,
        *,
        peer_name: str = "",
        peer_time_us: float | None = None,
        margin: float | None = None,
        autogen_version: str = "",
        force: bool = False,
        retimed_against: str | None = None,
    ) -> WinnerRecord:
        """Propose a stored ok trial as the winner of its problem in its cache mode; returns the
        winner actually stored, which is the stored one when that one is better.

        There is one winner per (GPU model, family, dtype, shape, cache mode): the cache mode is
        the trial's, so a hot-cache run never touches the cold winner. The stored winner is
        replaced only when
          * there is none, or it is unusable (malformed, or its trial failed or is missing);
          * it is this very trial (its peer figures, margin and version are refreshed);
          * ``force`` is true (an explicit override);
          * ``retimed_against`` names the stored winner's kernel: the caller timed both side by
            side in one run on the GPU (and stored those timings) and chose this one;
          * or, by the stored figures, this trial is faster beyond the stored winner's spread:
            ``trial.time_us < stored.time_us - stored.spread_us`` (no spread counts as 0).
        Otherwise the stored winner stays as it is. The figures are the stored rows', read and
        compared in the same transaction that writes, holding the write lock (SQLite: BEGIN
        IMMEDIATE; PostgreSQL: the GPU row FOR UPDATE), so writers finishing in any order leave
        the better winner. ValueError when the trial is not stored, or not ok, or malformed.
        """
        with self._write() as session:
            gpu_id = _lock_gpu(session, device)  # a failed re-measurement now waits for us
            schema = _HEAD
            query = (
                select(*_trial_columns(schema), GpuRow.name.label("g_name"))
                .join(GpuRow, TrialRow.gpu_id == GpuRow.id)
                .where(*_same_problem(TrialRow, device, trial.family, trial.dtype, trial.shape_key))
                .where(TrialRow.kernel_name == trial.kernel_name,
                       TrialRow.cache_mode == trial.cache_mode)
            )
            found = session.execute(query).one_or_none()
            if found is None or gpu_id is None:
                raise ValueError(f"{_describe(device, trial)} is not stored; record it first")
            status = found._mapping["t_status"]
            if status != "ok":
                raise ValueError(
                    f"{_describe(device, trial)} has status {status!r}; only an ok trial can win"
                )
            try:
                candidate = _trial_record(found._mapping)
            except _Malformed as exc:
                raise ValueError(f"{_describe(device, trial)} is stored malformed: {exc}") from None
            candidate_id = found._mapping["t_id"]

            current = session.execute(
                _winners_query(schema).where(
                    WinnerRow.gpu_id == gpu_id,
                    WinnerRow.family == candidate.family,
                    WinnerRow.dtype == candidate.dtype,
                    WinnerRow.shape_key == candidate.shape_key,
                    WinnerRow.cache_mode == candidate.cache_mode,
                )
            ).one_or_none()
            if current is not None and not force:
                try:
                    stored = _winner_record(current._mapping)
                except _Malformed:
                    stored = None  # an unusable winner never blocks a usable one
                if stored is not None and current._mapping["w_trial_id"] != candidate_id:
                    side_by_side = retimed_against is not None and (
                        retimed_against == stored.trial.kernel_name)
                    spread = stored.trial.spread_us or 0.0
                    faster = candidate.time_us < stored.trial.time_us - spread
                    if not (side_by_side or faster):
                        return stored

            values = {
                "gpu_id": gpu_id,
                "family": candidate.family,
                "dtype": candidate.dtype,
                "shape_key": candidate.shape_key,
                "cache_mode": candidate.cache_mode,
                "trial_id": candidate_id,
                "peer_name": peer_name,
                "peer_time_us": peer_time_us,
                "margin": margin,
                "autogen_version": autogen_version,
                "updated_at": _now(),
            }
            winner_id = self._upsert(session, WinnerRow, values, WINNER_KEY)
            written = session.execute(_winners_query(schema).where(WinnerRow.id == winner_id)).one()
            try:
                return _winner_record(written._mapping)
            except _Malformed as exc:  # e.g. a peer time that is not a positive number
                raise ValueError(f"{_describe(device, trial)}: winner not stored: {exc}") from None

    def winner(
        self,
        device: DeviceIdentity,
        family: str,
        dtype: str,
        shape_key: str,
        cache_mode: str | None = None,
    ) -> WinnerRecord | None:
        """The stored winner of one problem in ``cache_mode`` (None: the cold one where both are
        stored, else the hot one). None when nothing is stored; InvalidRowError naming the row
        when only a malformed one is."""
        found, bad = self.winners_checked(
            family=family, gpu_name=device.name, compute_capability=device.compute_capability,
            dtype=dtype, shape_key=shape_key, cache_mode=cache_mode,
        )
        if found:
            return found[0]  # ordered by cache mode: cold first
        if bad:
            raise InvalidRowError(
                f"{display_url(self._url)}: the stored winner is invalid: {bad[0].describe()}",
                self._url, bad[0],
            )
        return None

    def winners(self, **filters: str | None) -> list[WinnerRecord]:
        """Every well-formed winner matching all the given filters (those of winners_checked),
        ordered by GPU, problem and cache mode; malformed rows are left out."""
        return self.winners_checked(**filters)[0]

    def winners_checked(
        self,
        *,
        family: str | None = None,
        gpu_name: str | None = None,
        compute_capability: str | None = None,
        dtype: str | None = None,
        shape_key: str | None = None,
        cache_mode: str | None = None,
    ) -> tuple[list[WinnerRecord], list[InvalidRow]]:
        """(the well-formed winners matching every given filter, ordered by GPU, family, dtype,
        shape and cache mode; the malformed winner rows matching them, each naming its table,
        id, problem and what is wrong). A winner is malformed when it or its trial or GPU row
        holds a value a record cannot (params that are not a JSON object, a time that is not a
        positive number, a bad shape key...), its trial is missing or not ok, or the two
        disagree on the problem."""

        def read(session: Session, schema: _Schema):
            if not schema.has_table(WinnerRow):
                return [], []
            query = _winners_query(schema)
            mode = _winner_mode(schema)
            for column, wanted in (
                (WinnerRow.family, family),
                (GpuRow.name, gpu_name),
                (GpuRow.compute_capability, compute_capability),
                (WinnerRow.dtype, dtype),
                (WinnerRow.shape_key, shape_key),
                (mode, cache_mode),
            ):
                if wanted is not None:
                    query = query.where(column == wanted)
            query = query.order_by(
                GpuRow.name, GpuRow.compute_capability, WinnerRow.family, WinnerRow.dtype,
                WinnerRow.shape_key, mode, WinnerRow.id,
            )
            return _one_per_key(*_sorted_checked(session.execute(query), _winner_with_id, _invalid_winner))

        return self._reading(read, ([], []))

    # -- claims (workers sharing the database) ----------------------------------------------------

    def claim(
        self,
        device: DeviceIdentity,
        trial: TrialRecord,
        variant: str,
        owner: str,
        lease_s: float,
        budget: int | None = None,
        longest_lease_s: float | None = None,
    ) -> Claim:
        """Claim the variant of ``trial`` (its problem, kernel name, params and cache mode) for
        ``owner`` for ``lease_s`` seconds, unless it is measured already, another worker holds a
        live lease on it, or ``budget`` trials of the problem (stored ones plus running claims)
        are reached. A lapsed lease is taken over (pass no budget: it holds its place already),
        and so is one with more than ``longest_lease_s`` left (no worker keeping to that bound
        wrote it: a worker killed holding it would block the variant). Decided under the write lock (SQLite: BEGIN
        IMMEDIATE; PostgreSQL: a transaction-level advisory lock on the problem, see _lock_problem),
        so concurrent workers never both win, and the budget is exact across them."""
        return self.claim_many(device, [(trial, variant)], owner, lease_s, budget, longest_lease_s)[0]

    def claim_many(
        self,
        device: DeviceIdentity,
        wanted: list[tuple[TrialRecord, str]],
        owner: str,
        lease_s: float,
        budget: int | None = None,
        longest_lease_s: float | None = None,
    ) -> list[Claim]:
        """claim() for several (trial, variant) pairs of ONE problem, in one transaction under
        one lock: a worker that keeps several variants in flight claims them together, paying
        the lock, its wait and the commit once. Decided in order, each as claim() would (the
        budget counts the ones claimed before it in the batch; a variant asked twice is claimed
        once); one Claim per pair, in order.

        PostgreSQL: one call of autogen_claim_many (_claim_on_server), which locks, reads, decides
        and writes on the server, in a statement of its own that the server commits as it ends
        (autocommitted): the lock is held for no round trip to this process at all, whose threads
        may be slow to get back to it. SQLite: the lock (BEGIN IMMEDIATE), one read
        (_CLAIMS_CHECK), the decision here (_decide_claim), one insert."""
        if not wanted:
            return []
        first = wanted[0][0]
        problem_of = lambda t: (t.family, t.dtype, t.shape_key, t.cache_mode)  # noqa: E731
        if any(problem_of(t) != problem_of(first) for t, _v in wanted):
            raise ValueError("claim_many: every variant must be of one problem and cache mode")
        if self._engine.dialect.name == "postgresql":
            self._require_writable()
            with autocommitted(self._engine, self._url) as session:
                return _claim_on_server(session, self._gpu_id(session, device), wanted, owner, lease_s, budget,
                                        longest_lease_s)
        with self._write() as session:
            return _claim_here(session, self._gpu_id(session, device), wanted, owner, lease_s, budget,
                               longest_lease_s)

    def complete_claim(self, device: DeviceIdentity, trial: TrialRecord, variant: str, owner: str) -> TrialRecord:
        """Store the measured ``trial`` and mark its claim done, in one transaction: a variant is
        never left measured but claimed, nor done but unstored. The claim is marked done even if
        its lease had lapsed and another worker took it over (the measurement is as good).

        No lock: the budget was settled when the variant was claimed, and this transaction turns
        a running claim into a stored trial at once (a claim counting the budget sees both or
        neither). A failed trial locks the GPU row, as set_winner does, to withdraw a winner. On
        PostgreSQL, storing the trial also adds to its problem's count (a trigger,
        tuning_db.migrations.functions): a row lock on one of the count's slots until the commit,
        which the claims, reading the count, never wait for."""
        _check_choice("status", trial.status, TRIAL_STATUSES)
        values = TrialRow.values_of(device, trial)
        with self._write() as session:
            connection = session.connection()
            gpu_id = _lock_gpu(session, device) if trial.status != "ok" else self._gpu_id(session, device)
            values.update(gpu_id=gpu_id, created_at=_now())
            stored = self._upsert(session, TrialRow, values, TRIAL_KEY, returning=_TRIAL_COLUMNS)
            if trial.status != "ok":
                connection.execute(_DELETE_WINNER_OF_TRIAL, {"trial_id": stored.id})
            connection.execute(_CLAIM_DONE, {**_problem_params(gpu_id, trial), "where_variant": variant,
                                             "kernel_name": trial.kernel_name, "updated_at": _now()})
            return _trial_record(stored._mapping, "")

    def release_claims(self, owner: str) -> int:
        """Give back every running claim of ``owner`` (an interrupted worker), so others need
        not wait for the leases to lapse; returns how many."""
        with self._write() as session:
            statement = delete(ClaimRow).where(ClaimRow.owner == owner, ClaimRow.state == "running")
            return session.execute(statement, execution_options=UNSYNCHRONIZED).rowcount

    def release_claim(self, device: DeviceIdentity, claim: ClaimRecord) -> int:
        """Give back one running claim as read (its owner and variant unchanged since): one whose
        params cannot be read or checked is released rather than waited for. Returns 0 or 1."""
        with self._write() as session:
            gpu_id = _lock_gpu(session, device)
            if gpu_id is None:
                return 0
            statement = delete(ClaimRow).where(
                ClaimRow.gpu_id == gpu_id, ClaimRow.family == claim.family, ClaimRow.dtype == claim.dtype,
                ClaimRow.shape_key == claim.shape_key, ClaimRow.cache_mode == claim.cache_mode,
                ClaimRow.variant == claim.variant, ClaimRow.owner == claim.owner, ClaimRow.state == "running")
            return session.execute(statement, execution_options=UNSYNCHRONIZED).rowcount

    def renew_claims(self, owner: str, lease_s: float) -> int:
        """The heartbeat: extend every running claim of ``owner`` to ``lease_s`` from now."""
        with self._write() as session:
            now = _db_epoch(session)
            statement = (update(ClaimRow).where(ClaimRow.owner == owner, ClaimRow.state == "running")
                         .values(expires_at=now + lease_s))
            return session.execute(statement, execution_options=UNSYNCHRONIZED).rowcount

    def claims(self, device: DeviceIdentity, family: str, dtype: str, shape_key: str,
               cache_mode: str = "cold", *, running: bool = False) -> list[ClaimRecord]:
        """Every claim of one problem (``running``: the running ones only), oldest first, with
        the lease time left as read now."""

        def read(session: Session, schema: _Schema) -> list[ClaimRecord]:
            if not schema.has_table(ClaimRow):
                return []
            now = _db_epoch(session)
            query = (select(ClaimRow).join(GpuRow, ClaimRow.gpu_id == GpuRow.id)
                     .where(*_same_problem(ClaimRow, device, family, dtype, shape_key),
                            ClaimRow.cache_mode == cache_mode)
                     .order_by(ClaimRow.created_at, ClaimRow.id))
            if running:
                query = query.where(ClaimRow.state == "running")
            return [ClaimRecord(row.family, row.dtype, row.shape_key, row.cache_mode, row.variant,
                                row.kernel_name, _claim_params(row.params), row.owner, row.state,
                                _lease_left(row.expires_at, now), row.attempts)
                    for row in session.scalars(query)]

        return self._reading(read, [])

    # -- validations ------------------------------------------------------------------------------

    def record_validation(self, device: DeviceIdentity, v: ValidationRecord) -> ValidationRecord:
        """Store a validation, replacing an earlier one of the same source on the same shape."""
        values = ValidationRow.values_of(v)
        with self._write() as session:
            values.update(gpu_id=self._upsert_gpu(session, device), created_at=_now())
            row_id = self._upsert(session, ValidationRow, values, VALIDATION_KEY)
            return session.get_one(ValidationRow, row_id).to_record()

    def validation(
        self, device: DeviceIdentity, family: str, dtype: str, shape_key: str, source_hash: str
    ) -> ValidationRecord | None:
        """The stored check; None when there is none or its row is malformed (check again)."""

        def read(session: Session, schema: _Schema):
            if not schema.has_table(ValidationRow):
                return None
            query = _rows_of(ValidationRow, device, family, dtype, shape_key).where(
                ValidationRow.source_hash == source_hash
            )
            try:
                row = session.scalars(query).one_or_none()
                record = None if row is None else row.to_record()
            except (ValueError, TypeError):  # e.g. ``passed`` stored as text
                return None
            if record is None or not all(isinstance(getattr(record, name), str) for name in (
                    "kernel_name", "source_hash", "reason", "created_at")):
                return None
            return record

        return self._reading(read, None)

    # -- plumbing ---------------------------------------------------------------------------------

    def _reading(self, work: Callable[[Session, _Schema], T], empty: T) -> T:
        """Run ``work`` in one read transaction with the schema at hand. A read-only SQLite file
        that changed during the read (a writer checkpointed into it) is read again."""
        if self._engine is None and self._readonly:
            self._engine = _readonly_engine(self._url)  # the file may exist by now
        if self._engine is None:
            return empty
        for attempt in range(2):
            before = self._file_state()
            with transaction(self._engine, self._url) as session:
                if self._schema is None:
                    self._schema = _read_schema(session.connection(), self._url)
                if self._schema is _EMPTY:
                    return empty
                result = self._work_on(work, session)
            if attempt == 1 or self._file_state() == before:
                return result
        raise AssertionError("unreachable")

    def _work_on(self, work: Callable[[Session, _Schema], T], session: Session) -> T:
        schema = self._schema
        try:
            return work(session, schema)
        except sa_exc.SQLAlchemyError as exc:
            if schema is _HEAD or schema.revision == migrations.head_revision():
                raise
            raise DatabaseError(
                f"{display_url(self._url)} is at schema revision {schema.revision}, which this "
                f"autogen could not read ({type(getattr(exc, 'orig', exc)).__name__}): "
                f"{UPGRADE_HINT} --db {display_url(self._url)}",
                self._url,
            ) from exc

    def _file_state(self) -> tuple | None:
        path = _sqlite_file(self._url) if self._readonly else None
        if path is None:
            return None
        try:
            stat = path.stat()
        except OSError:
            return None
        return (stat.st_ino, stat.st_size, stat.st_mtime_ns,
                path.with_name(path.name + "-wal").exists())

    def _write(self) -> AbstractContextManager[Session]:
        self._require_writable()
        return _queued_transaction(self._writer, self._url)

    def _require_writable(self) -> None:
        if self._readonly:
            raise DatabaseError(f"{display_url(self._url)} was opened read-only", self._url)

    def _upsert(self, session: Session, model: type[Base], values: Mapping[str, Any], key: tuple[str, ...],
                returning: tuple[str, ...] = ("id",)):
        """Insert or update the row with ``key``; returns its id (or, given ``returning``
        columns, the row of them)."""
        try:
            statement = upsert_template(session.get_bind().dialect.name, model, tuple(values), key, returning)
        except NotImplementedError as exc:
            raise DatabaseError(f"{display_url(self._url)}: {exc}", self._url) from exc
        result = session.connection().execute(statement, dict(values))
        return result.scalar_one() if returning == ("id",) else result.one()

    def _gpu_id(self, session: Session, device: DeviceIdentity) -> int:
        """The GPU row's id, inserted first where missing; remembered per TuningDB (GPU rows are
        never deleted), so a claim does not look it up again."""
        key = (device.name, device.compute_capability)
        gpu_id = self._gpu_ids.get(key)
        if gpu_id is None:
            found = session.connection().execute(_GPU_ID, {"name": device.name, "cc": device.compute_capability})
            gpu_id = found.scalar_one_or_none()
            if gpu_id is None:  # remembered once committed: found by the next call
                return self._upsert_gpu(session, device)
            self._gpu_ids[key] = gpu_id
        return gpu_id

    def _upsert_gpu(self, session: Session, device: DeviceIdentity) -> int:
        return self._upsert(session, GpuRow, GpuRow.values_of(device), GPU_KEY)


@contextmanager
def _queued_transaction(bind, url: str) -> Iterator[Session]:
    """A write transaction, queued behind this process's other writers of a SQLite file first
    (tuning_db.engine.write_queue)."""
    with write_queue(url), transaction(bind, url) as session:
        yield session


def _winner_with_id(m: Mapping) -> tuple[object, WinnerRecord]:
    return m["w_id"], _winner_record(m)


def _one_per_key(found: list[tuple[object, WinnerRecord]], bad: list[InvalidRow]
                 ) -> tuple[list[WinnerRecord], list[InvalidRow]]:
    """One winner per (GPU model, problem, cache mode), as the schema's unique keys promise: a
    database whose keys were dropped, or whose GPU rows repeat a model, may hold several. The
    first in read order (the lowest row id) is read; the others are reported as invalid rows."""
    kept: dict[tuple, WinnerRecord] = {}
    for row_id, w in found:
        key = (w.device.name, w.device.compute_capability, w.trial.family, w.trial.dtype, w.trial.shape_key,
               w.trial.cache_mode)
        first = kept.setdefault(key, w)
        if first is not w:
            bad.append(InvalidRow(WinnerRow.__tablename__, row_id, "a second winner of the same GPU model, "
                                  f"problem and cache mode (the first, of kernel {first.trial.kernel_name}, is read)",
                                  gpu=w.device.name, family=w.trial.family, dtype=w.trial.dtype,
                                  shape_key=w.trial.shape_key, cache_mode=w.trial.cache_mode))
    return list(kept.values()), bad


def _claim_params(stored: object) -> dict | None:
    """A claim's params, or None where they are not a JSON object (a tampered or foreign row):
    whoever reads the claim releases it rather than waiting for it."""
    try:
        params = json.loads(stored) if isinstance(stored, str) else None
    except ValueError:
        return None
    return params if isinstance(params, dict) else None


class _ClaimRow:
    """A claim row as _CLAIMS_CHECK reads it (its columns prefixed c_)."""

    def __init__(self, found):
        self.id, self.owner, self.state = found.c_id, found.c_owner, found.c_state
        self.expires_at, self.kernel_name, self.attempts = found.c_expires_at, found.c_kernel_name, found.c_attempts


class _Claimed:
    """A claim inserted earlier in the same batch, as _decide_claim reads a claim row."""

    def __init__(self, owner: str):
        self.owner, self.state, self.expires_at, self.kernel_name = owner, "running", math.inf, ""


def _decide_claim(row, stored: bool, launched: int, now: float, kernel_name: str, owner: str,
                  budget: int | None, longest_lease_s: float | None) -> Claim:
    """One variant's claim, decided on its claim row (None: none), whether its kernel is stored,
    and the problem's launched count (stored trials plus running claims), the lock held."""
    if row is not None and row.state == "done":
        return Claim("done", row.kernel_name)
    left = None if row is None else _lease_left(row.expires_at, now)
    if row is not None and row.owner == owner and isinstance(row, _Claimed):
        return Claim("taken", kernel_name)  # asked twice in one batch: claimed once
    if left is not None and 0 < left <= (longest_lease_s or math.inf) and row.owner != owner:
        return Claim("taken", row.kernel_name)
    if stored:  # measured before claims existed, or without one
        return Claim("done", kernel_name)
    # Stored trials (not rejected) and running claims, lapsed ones included: a dead worker's
    # variant keeps its place in the budget until a live worker takes it over.
    if budget is not None and launched >= budget:
        return Claim("budget")
    if row is None:
        return Claim("claimed", kernel_name)
    return Claim("claimed", kernel_name, taken_over=row.owner != owner, previous=row.owner)


def _lease_left(expires_at: object, now: float) -> float:
    """Seconds left on a claim's lease; a value that is not a finite number reads as lapsed."""
    if isinstance(expires_at, bool) or not isinstance(expires_at, (int, float)) or not math.isfinite(expires_at):
        return -1.0
    return expires_at - now


def _lock_gpu(session: Session, device: DeviceIdentity) -> int | None:
    """Lock the device's GPU row (PostgreSQL; SQLite's BEGIN IMMEDIATE already serializes) and
    return its id; None where there is no such row.

    Every write transaction locks its GPU row first (the upserts of record_* do it too), so
    writers of one GPU queue up there and can never deadlock on the rows behind it.
    """
    found = session.connection().execute(_LOCK_GPU, {"name": device.name, "cc": device.compute_capability})
    return found.scalar_one_or_none()


def _lock_problem(session: Session, gpu_id: int, family: str, dtype: str, shape_key: str, cache_mode: str) -> float:
    """Serialize the claims of one problem (on the GPU row ``gpu_id``) and return the
    database's clock (_db_epoch). SQLite: BEGIN IMMEDIATE holds the file's write lock already.
    PostgreSQL: a transaction-level advisory lock on a 64-bit hash of the problem (a collision
    only serializes two problems), so workers of different problems never wait for each other;
    in the same round trip the transaction stops waiting for its commit to reach the disk
    (``synchronous_commit`` off): the lock is released only after the commit, and a claim is a
    lease, which a server crash may lose (its variant is claimed again) at no cost to the
    stored trials, whose transactions still wait for the disk."""
    connection = session.connection()
    if connection.dialect.name != "postgresql":
        return _db_epoch(session)
    key = _problem_lock_key(gpu_id, family, dtype, shape_key, cache_mode)
    return float(connection.execute(_LOCK_PROBLEM, {"key": key}).scalar_one())


def _problem_lock_key(gpu_id: int, family: str, dtype: str, shape_key: str, cache_mode: str) -> int:
    """The PostgreSQL advisory lock key of one problem: a signed 64-bit hash (_lock_problem,
    autogen_claim_many)."""
    digest = hashlib.blake2b(json.dumps([gpu_id, family, dtype, shape_key, cache_mode]).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _claim_here(session: Session, gpu_id: int, wanted: list[tuple[TrialRecord, str]], owner: str, lease_s: float,
                budget: int | None, longest_lease_s: float | None) -> list[Claim]:
    """claim_many decided in Python (SQLite): the lock, one read (_CLAIMS_CHECK), _decide_claim
    per pair, one insert of the new claims and an update per claim taken over."""
    connection = session.connection()
    first = wanted[0][0]
    now = _lock_problem(session, gpu_id, first.family, first.dtype, first.shape_key, first.cache_mode)
    found = connection.execute(_CLAIMS_CHECK, {**_problem_params(gpu_id, first),
                                               "variants": [variant for _t, variant in wanted],
                                               "names": [trial.kernel_name for trial, _v in wanted]}).all()
    launched = found[0].launched
    rows = {r.c_variant: _ClaimRow(r) for r in found if r.c_id is not None}
    stored = {r.stored for r in found if r.stored is not None}
    answers, new, taken_over = [], [], []
    for trial, variant in wanted:
        answer = _decide_claim(rows.get(variant), trial.kernel_name in stored, launched, now, trial.kernel_name,
                               owner, budget, longest_lease_s)
        answers.append(answer)
        if answer.status != "claimed":
            continue
        values = dict(kernel_name=trial.kernel_name, params=json.dumps(trial.params, sort_keys=True),
                      owner=owner, state="running", expires_at=now + lease_s, updated_at=_now())
        row = rows.get(variant)
        if row is None:
            launched += 1  # a lapsed claim taken over counted already
            new.append({**_problem_values(gpu_id, trial), "variant": variant, "attempts": 1,
                        "created_at": values["updated_at"], **values})
            rows[variant] = _Claimed(owner)  # a second ask of it in this batch: held
        else:
            taken_over.append({"claim_id": row.id, "attempts": row.attempts + 1, **values})
    if new:
        connection.execute(_NEW_CLAIM, new)
    for values in taken_over:
        connection.execute(_UPDATE_CLAIM, values)
    return answers


def _claim_on_server(session: Session, gpu_id: int, wanted: list[tuple[TrialRecord, str]], owner: str, lease_s: float,
                     budget: int | None, longest_lease_s: float | None) -> list[Claim]:
    """claim_many on PostgreSQL: autogen_claim_many (tuning_db.migrations.functions) takes the
    problem's lock (as _lock_problem does, synchronous_commit off), reads and decides each pair as
    _decide_claim would, writes the claim rows, and answers one row per pair, in order."""
    first = wanted[0][0]
    found = session.connection().execute(_CLAIM_MANY, {
        **_problem_values(gpu_id, first),
        "variants": [variant for _t, variant in wanted],
        "names": [trial.kernel_name for trial, _v in wanted],
        "params": [json.dumps(trial.params, sort_keys=True) for trial, _v in wanted],
        "lock_key": _problem_lock_key(gpu_id, first.family, first.dtype, first.shape_key, first.cache_mode),
        "owner": owner, "lease_s": lease_s, "budget": budget, "longest_lease_s": longest_lease_s, "stamp": _now()})
    return [Claim(*row) for row in found]


def _same_problem(model, device: DeviceIdentity, family: str, dtype: str, shape_key: str):
    """Where-clauses for one problem of ``model`` (joined with GpuRow) on one GPU model."""
    return (
        GpuRow.name == device.name,
        GpuRow.compute_capability == device.compute_capability,
        model.family == family,
        model.dtype == dtype,
        model.shape_key == shape_key,
    )


# -- the statements of every measured variant, built once ----------------------------------------
#
# A variant's claim and its completion are about ten statements in two transactions. Built per
# call, through the ORM, the two cost mostly SQLAlchemy building statements and their cache keys,
# on the thread that asks, claims and stores. Built once, with bound parameters, and run on the
# session's connection, they cost a fraction of that (docs/history/sessions.md, eleventh session).

PROBLEM_COLUMNS = ("gpu_id", "family", "dtype", "shape_key", "cache_mode")


def _where_problem(model) -> tuple:
    """One problem of ``model`` on one GPU row, bound as ``where_<column>`` (_problem_params): an
    UPDATE takes the bound names of its columns for its SET clause."""
    return tuple(getattr(model, name) == bindparam(f"where_{name}") for name in PROBLEM_COLUMNS)


def _problem_values(gpu_id: int, trial: TrialRecord) -> dict[str, Any]:
    """The problem columns of ``trial``'s rows on the GPU row ``gpu_id``."""
    return {"gpu_id": gpu_id, "family": trial.family, "dtype": trial.dtype, "shape_key": trial.shape_key,
            "cache_mode": trial.cache_mode}


def _problem_params(gpu_id: int, trial: TrialRecord) -> dict[str, Any]:
    """_where_problem's parameters for ``trial``'s problem."""
    return {f"where_{name}": value for name, value in _problem_values(gpu_id, trial).items()}


_GPU_ID = select(GpuRow.id).where(GpuRow.name == bindparam("name"), GpuRow.compute_capability == bindparam("cc"))
# FOR NO KEY UPDATE: the GPU row's lockers queue behind each other, while the foreign-key checks
# of claims and trials inserted meanwhile (FOR KEY SHARE) do not wait for them.
_LOCK_GPU = _GPU_ID.with_for_update(key_share=True)
_NEW_CLAIM = insert(ClaimRow.__table__)
# What a batch of claims decides on, in one round trip (claim_many holds the problem's lock
# meanwhile): the problem's stored trials (not rejected) plus running claims, the claim rows of
# the batch's variants (c_*), and which of its kernels are stored (stored): a row per pair of
# claim row and stored kernel (outer joins on a one-row select), a few rows for a batch of a few.
_claims_of = select(ClaimRow.__table__).where(*_where_problem(ClaimRow),
                                              ClaimRow.variant.in_(bindparam("variants", expanding=True))).subquery()
_stored_of = (select(TrialRow.kernel_name).where(*_where_problem(TrialRow), TrialRow.status != "rejected",
                                                 TrialRow.kernel_name.in_(bindparam("names", expanding=True)))
              .subquery())
_CLAIMS_CHECK = select(
    (select(func.count()).select_from(TrialRow)
     .where(*_where_problem(TrialRow), TrialRow.status != "rejected").scalar_subquery()
     + select(func.count()).select_from(ClaimRow)
     .where(*_where_problem(ClaimRow), ClaimRow.state == "running").scalar_subquery()).label("launched"),
    *(column.label(f"c_{column.name}") for column in _claims_of.columns),
    _stored_of.c.kernel_name.label("stored"),
).select_from(select(literal(1).label("one")).subquery().outerjoin(_claims_of, true()).outerjoin(_stored_of, true()))
# Executed with the new values by column name (kernel_name, params, owner, ...): the SET clause.
_UPDATE_CLAIM = update(ClaimRow.__table__).where(ClaimRow.id == bindparam("claim_id"))
_CLAIM_DONE = (update(ClaimRow.__table__)
               .where(*_where_problem(ClaimRow), ClaimRow.variant == bindparam("where_variant"))
               .values(state="done"))
_DELETE_WINNER_OF_TRIAL = delete(WinnerRow.__table__).where(WinnerRow.trial_id == bindparam("trial_id"))
_TRIAL_COLUMNS = tuple(column.name for column in TrialRow.__table__.columns)
_LOCK_PROBLEM = text("SELECT extract(epoch from clock_timestamp()) FROM "
                     "(SELECT set_config('synchronous_commit', 'off', true), pg_advisory_xact_lock(:key)) AS locked")
_CLAIM_MANY = text(
    "SELECT claim_status, claim_kernel_name, claim_taken_over, claim_previous FROM autogen_claim_many("
    "CAST(:variants AS text[]), CAST(:names AS text[]), CAST(:params AS text[]), CAST(:gpu_id AS integer), "
    "CAST(:family AS text), CAST(:dtype AS text), CAST(:shape_key AS text), CAST(:cache_mode AS text), "
    "CAST(:lock_key AS bigint), CAST(:owner AS text), CAST(:lease_s AS double precision), "
    "CAST(:budget AS bigint), CAST(:longest_lease_s AS double precision), CAST(:stamp AS text)) "
    "WITH ORDINALITY ORDER BY ordinality")
_EPOCH = {"postgresql": text("SELECT extract(epoch from clock_timestamp())"),
          "sqlite": text("SELECT (julianday('now') - 2440587.5) * 86400.0")}


def _db_epoch(session: Session) -> float:
    """Seconds since the epoch on the database's clock: leases written by workers on several
    machines are compared on one clock."""
    connection = session.connection()
    return float(connection.execute(_EPOCH[connection.dialect.name]).scalar_one())


def _rows_of(model, device: DeviceIdentity, family: str, dtype: str, shape_key: str):
    return (
        select(model)
        .join(GpuRow, model.gpu_id == GpuRow.id)
        .where(*_same_problem(model, device, family, dtype, shape_key))
    )


def _winners_query(schema: _Schema):
    """Winner rows with their GPU and trial; outer joins, so that a winner whose GPU or trial
    row is missing is reported rather than silently dropped."""
    return (
        select(*_winner_columns(schema))
        .select_from(WinnerRow)
        .outerjoin(GpuRow, WinnerRow.gpu_id == GpuRow.id)
        .outerjoin(TrialRow, WinnerRow.trial_id == TrialRow.id)
    )


def _now() -> str:
    """ISO-8601 UTC of fixed width, so that text order is time order."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def _check_choice(field: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{field} must be one of {', '.join(allowed)}, not {value!r}")


def _describe(device: DeviceIdentity, trial: TrialRecord) -> str:
    return (
        f"trial {trial.kernel_name} of {trial.family}/{trial.dtype}/{trial.shape_key} "
        f"({trial.cache_mode} cache) on {device.name} (cc {device.compute_capability})"
    )

