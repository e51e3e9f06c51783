"""The one module through which every read and write of the tuning database passes.

TuningDB turns ORM rows into the frozen records of tuning_db.records inside a transaction, so
nothing a caller holds depends on a live session. Writes are upserts on unique keys
(INSERT ... ON CONFLICT DO UPDATE), which keeps concurrent processes safe without read-then-write.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, delete, event, select
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.orm import Session
from sqlalchemy.sql import Insert

from tuning_db import migrations
from tuning_db.models import Base, GpuRow, TrialRow, ValidationRow, WinnerRow
from tuning_db.records import DeviceIdentity, TrialRecord, ValidationRecord, WinnerRecord

TRIAL_STATUSES = ("ok", "failed", "rejected")
CACHE_MODES = ("cold", "hot")
GPU_KEY = ("name", "compute_capability")
TRIAL_KEY = ("gpu_id", "family", "dtype", "shape_key", "kernel_name", "cache_mode")
WINNER_KEY = ("gpu_id", "family", "dtype", "shape_key")
VALIDATION_KEY = ("gpu_id", "family", "dtype", "shape_key", "source_hash")

SQLITE_BUSY_TIMEOUT_MS = 30000
SQLITE_PRAGMAS = (
    f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}",
    "PRAGMA synchronous=NORMAL",
    "PRAGMA foreign_keys=ON",
)
BEGIN_OPTION = "autogen_sqlite_begin"  # execution option: "DEFERRED" (default) or "IMMEDIATE"
_DIALECT_INSERTS = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}
UNSYNCHRONIZED = {"synchronize_session": False}  # bulk deletes: the session holds no rows to update


class DatabaseError(Exception):
    """A tuning database operation failed; the message names the database."""

    def __init__(self, message: str, url: str = ""):
        super().__init__(message)
        self.url = url


class CorruptDatabaseError(DatabaseError):
    """The database is not a readable autogen tuning database; it was left untouched."""


# -- locations ------------------------------------------------------------------------------------


def default_url() -> str:
    """$AUTOGEN_DB if set, else a SQLite file in the user's cache directory."""
    configured = os.environ.get("AUTOGEN_DB")
    if configured:
        return as_url(configured)
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return as_url(Path(cache) / "autogen" / "tuning.db")


def as_url(target: str | os.PathLike | None) -> str:
    """A SQLAlchemy URL for ``target``: a URL as given, a bare file path as a SQLite URL."""
    if target is None:
        return default_url()
    target = os.fspath(target)
    if "://" in target:
        return target
    return "sqlite:///" + str(Path(target).expanduser().resolve())


def display_url(url: str) -> str:
    """The URL for messages, with any password masked."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except sa_exc.ArgumentError:
        return url


def _sqlite_file(url: str) -> Path | None:
    """The file behind a SQLite URL; None for other dialects and in-memory databases."""
    parsed = make_url(url)
    database = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or database in ("", ":memory:"):
        return None
    if database.startswith("file:"):  # a URI filename (uri=true): left to SQLite
        return None
    return Path(database)


# -- engines and the transaction helper -----------------------------------------------------------


def _create_engine(url: str) -> Engine:
    with _errors_named(url):
        try:
            engine = create_engine(url)
        except ImportError as exc:
            raise DatabaseError(f"{display_url(url)}: no database driver: {exc}", url) from exc
    if engine.dialect.name == "sqlite":
        _configure_sqlite(engine)
    return engine


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def set_pragmas(dbapi_connection, _record) -> None:
        # SQLAlchemy, not the driver, emits BEGIN (below): the driver would neither begin before
        # DDL (so migrations would not be atomic) nor begin IMMEDIATE.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            for pragma in SQLITE_PRAGMAS:
                cursor.execute(pragma)
            _use_wal(cursor)
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def begin(connection: Connection) -> None:
        mode = connection.get_execution_options().get(BEGIN_OPTION, "DEFERRED")
        connection.exec_driver_sql(f"BEGIN {mode}")


def _use_wal(cursor: sqlite3.Cursor) -> None:
    """Switch the database to WAL (a no-op once it is). Processes opening a new database together
    race for the switch, and SQLite reports the loser's SQLITE_BUSY at once, without waiting
    busy_timeout; so the loser retries here for as long."""
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorname != "SQLITE_BUSY" or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


@contextmanager
def _errors_named(url: str) -> Iterator[None]:
    """Re-raise SQLAlchemy errors as DatabaseError naming the database."""
    try:
        yield
    except sa_exc.SQLAlchemyError as exc:
        raise _translate(exc, url) from exc


def _translate(exc: sa_exc.SQLAlchemyError, url: str) -> DatabaseError:
    cause = getattr(exc, "orig", None) or exc
    where = display_url(url)
    # Python's sqlite3 names the result code, e.g. SQLITE_NOTADB or SQLITE_CORRUPT_INDEX.
    if getattr(cause, "sqlite_errorname", "").startswith(migrations.SQLITE_CORRUPTION):
        return CorruptDatabaseError(f"{where} is corrupt: {cause}", url)
    return DatabaseError(f"{where}: {type(cause).__name__}: {cause}", url)


@contextmanager
def transaction(bind: Engine | Connection, url: str) -> Iterator[Session]:
    """A session in one transaction: committed on success, rolled back on any error, and
    SQLAlchemy errors re-raised as DatabaseError naming ``url``."""
    with _errors_named(url), Session(bind) as session, session.begin():
        yield session


# -- opening and migrating ------------------------------------------------------------------------


def _prepare(url: str) -> None:
    """Create a SQLite file's folder and refuse a file that is not ours, before connecting."""
    path = _sqlite_file(_checked(url))
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DatabaseError(f"cannot create the folder of {path}: {exc.strerror}", url) from exc
    try:
        with _errors_named(url):
            migrations.check_sqlite_file(path)
    except migrations.ForeignDatabaseError as exc:
        raise _not_ours(str(path), exc, url) from exc


def _checked(url: str) -> str:
    with _errors_named(url):
        make_url(url)
    return url


def _not_ours(where: str, problem: Exception, url: str) -> CorruptDatabaseError:
    return CorruptDatabaseError(
        f"{where} is not an autogen tuning database: {problem}; it was left untouched", url
    )


def _migrate(engine: Engine, url: str) -> str:
    """Bring the schema to head in one transaction that holds the write lock; returns the head."""
    with _errors_named(url), engine.connect() as connection:
        on_sqlite = engine.dialect.name == "sqlite"
        driver = connection.connection.driver_connection if on_sqlite else None
        if driver is not None:
            # Batch migrations rebuild tables that others reference, which SQLite refuses with
            # foreign keys on. The pragma is ignored inside a transaction, hence the driver
            # connection; upgrade_database checks the keys before committing instead.
            driver.execute("PRAGMA foreign_keys=OFF")
        try:
            locked = connection.execution_options(**{BEGIN_OPTION: "IMMEDIATE"})
            with transaction(locked, url) as session:
                return migrations.upgrade_database(session.connection())
        except migrations.ForeignDatabaseError as exc:
            raise _not_ours(display_url(url), exc, url) from exc
        except migrations.NewerSchemaError as exc:
            raise DatabaseError(f"{display_url(url)}: {exc}", url) from exc
        finally:
            if driver is not None:
                driver.execute("PRAGMA foreign_keys=ON")


def _require_head(engine: Engine, url: str) -> None:
    with transaction(engine, url) as session:
        revision = migrations.stamped_revision(session.connection())
    head = migrations.head_revision()
    if revision != head:
        raise DatabaseError(
            f"{display_url(url)} is at schema revision {revision or '(none)'}, not {head}: "
            "open it with upgrade=True or run tuning_db.upgrade()",
            url,
        )


def upgrade(url: str | os.PathLike | None = None) -> str:
    """Migrate the database at ``url`` (default: default_url()) to head; returns the head."""
    url = as_url(url)
    _prepare(url)
    engine = _create_engine(url)
    try:
        return _migrate(engine, url)
    finally:
        engine.dispose()


def current_revision(url: str | os.PathLike | None) -> str | None:
    """The schema revision stored at ``url``; None for a database autogen never migrated."""
    url = as_url(url)
    path = _sqlite_file(_checked(url))
    if path is not None and not path.exists():
        return None  # reading must not create the file
    _prepare(url)
    engine = _create_engine(url)
    try:
        with transaction(engine, url) as session:
            return migrations.stamped_revision(session.connection())
    finally:
        engine.dispose()


def upsert_statement(
    dialect_name: str, model: type[Base], values: Mapping[str, Any], key: tuple[str, ...]
) -> Insert:
    """INSERT ... ON CONFLICT (key) DO UPDATE of every other column, returning the row id."""
    dialect_insert = _DIALECT_INSERTS.get(dialect_name)
    if dialect_insert is None:
        raise NotImplementedError(
            f"tuning_db writes through ON CONFLICT upserts, which it implements for sqlite and "
            f"postgresql, not {dialect_name}"
        )
    statement = dialect_insert(model).values(dict(values))
    changed = {name: statement.excluded[name] for name in values if name not in key}
    upsert = statement.on_conflict_do_update(index_elements=list(key), set_=changed)
    return upsert.returning(model.id)


class TuningDB:
    """Trials, winners and validations of autogen, stored through SQLAlchemy."""

    def __init__(self, url: str | os.PathLike | None = None, *, upgrade: bool = True):
        self._url = as_url(url)
        _prepare(self._url)
        self._engine = _create_engine(self._url)
        # SQLite writers take the write lock at BEGIN, so a transaction that reads before it
        # writes waits for other writers (busy_timeout) instead of failing on a stale snapshot.
        self._writer = self._engine.execution_options(**{BEGIN_OPTION: "IMMEDIATE"})
        try:
            if upgrade:
                _migrate(self._engine, self._url)
            else:
                _require_head(self._engine, self._url)
        except BaseException:
            self._engine.dispose()
            raise

    @property
    def url(self) -> str:
        return self._url

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> TuningDB:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TuningDB({display_url(self._url)!r})"

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
        query = _rows_of(TrialRow, device, family, dtype, shape_key).where(
            TrialRow.kernel_name == kernel_name, TrialRow.cache_mode == cache_mode
        )
        with self._read() as session:
            row = session.scalars(query).one_or_none()
            return None if row is None else row.to_record()

    def trials(
        self,
        device: DeviceIdentity,
        family: str,
        dtype: str,
        shape_key: str,
        cache_mode: str | None = None,
    ) -> list[TrialRecord]:
        """Every trial of one problem, oldest first."""
        query = _rows_of(TrialRow, device, family, dtype, shape_key)
        if cache_mode is not None:
            query = query.where(TrialRow.cache_mode == cache_mode)
        with self._read() as session:
            rows = session.scalars(query.order_by(TrialRow.created_at, TrialRow.id))
            return [row.to_record() for row in rows]

    def delete_trials(self, device: DeviceIdentity, family: str, dtype: str, shape_key: str) -> int:
        """Forget one problem's trials and winner (a forced re-tune); returns the trials deleted."""
        with self._write() as session:
            gpu = _lock_gpu(session, device)
            if gpu is None:
                return 0
            deleted = 0
            for model in (WinnerRow, TrialRow):  # the winner first: it references a trial
                statement = delete(model).where(
                    model.gpu_id == gpu.id,
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
    ) -> WinnerRecord:
        """Make a stored ok trial the winner of its problem, replacing any earlier winner."""
        query = _rows_of(TrialRow, device, trial.family, trial.dtype, trial.shape_key).where(
            TrialRow.kernel_name == trial.kernel_name, TrialRow.cache_mode == trial.cache_mode
        )
        with self._write() as session:
            gpu = _lock_gpu(session, device)  # a failed re-measurement now waits for us
            stored = session.scalars(query).one_or_none()
            if stored is None:
                raise ValueError(f"{_describe(device, trial)} is not stored; record it first")
            if stored.status != "ok":
                raise ValueError(
                    f"{_describe(device, trial)} has status {stored.status!r}; "
                    "only an ok trial can win"
                )
            values = {
                "gpu_id": gpu.id,
                "family": stored.family,
                "dtype": stored.dtype,
                "shape_key": stored.shape_key,
                "trial_id": stored.id,
                "peer_name": peer_name,
                "peer_time_us": peer_time_us,
                "margin": margin,
                "autogen_version": autogen_version,
                "updated_at": _now(),
            }
            self._upsert(session, WinnerRow, values, WINNER_KEY)
            return WinnerRow(**values).to_record(gpu, stored)

    def winner(
        self, device: DeviceIdentity, family: str, dtype: str, shape_key: str
    ) -> WinnerRecord | None:
        query = _winners_query().where(*_same_problem(WinnerRow, device, family, dtype, shape_key))
        with self._read() as session:
            found = session.execute(query).one_or_none()
            return None if found is None else _winner_record(found)

    def winners(
        self,
        *,
        family: str | None = None,
        gpu_name: str | None = None,
        compute_capability: str | None = None,
        dtype: str | None = None,
    ) -> list[WinnerRecord]:
        """Every winner matching all the given filters, ordered by GPU and problem."""
        query = _winners_query()
        for column, wanted in (
            (WinnerRow.family, family),
            (GpuRow.name, gpu_name),
            (GpuRow.compute_capability, compute_capability),
            (WinnerRow.dtype, dtype),
        ):
            if wanted is not None:
                query = query.where(column == wanted)
        query = query.order_by(
            GpuRow.name, GpuRow.compute_capability, WinnerRow.family, WinnerRow.dtype,
            WinnerRow.shape_key,
        )
        with self._read() as session:
            return [_winner_record(found) for found in session.execute(query)]

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
        query = _rows_of(ValidationRow, device, family, dtype, shape_key).where(
            ValidationRow.source_hash == source_hash
        )
        with self._read() as session:
            row = session.scalars(query).one_or_none()
            return None if row is None else row.to_record()

    # -- plumbing ---------------------------------------------------------------------------------

    def _read(self) -> AbstractContextManager[Session]:
        return transaction(self._engine, self._url)

    def _write(self) -> AbstractContextManager[Session]:
        return transaction(self._writer, self._url)

    def _upsert(
        self, session: Session, model: type[Base], values: Mapping[str, Any], key: tuple[str, ...]
    ) -> int:
        """Insert or update the row with ``key``; returns its id."""
        try:
            statement = upsert_statement(session.get_bind().dialect.name, model, values, key)
        except NotImplementedError as exc:
            raise DatabaseError(f"{display_url(self._url)}: {exc}", self._url) from exc
        return session.execute(statement).scalar_one()

    def _upsert_gpu(self, session: Session, device: DeviceIdentity) -> int:
        return self._upsert(session, GpuRow, GpuRow.values_of(device), GPU_KEY)


def _lock_gpu(session: Session, device: DeviceIdentity) -> GpuRow | None:
    """Lock the device's GPU row (PostgreSQL; SQLite's BEGIN IMMEDIATE already serializes).

    Every write transaction locks its GPU row first (the upserts of record_* do it too), so
    writers of one GPU queue up there and can never deadlock on the rows behind it.
    """
    query = select(GpuRow).where(
        GpuRow.name == device.name, GpuRow.compute_capability == device.compute_capability
    )
    return session.scalars(query.with_for_update()).one_or_none()


def _same_problem(model, device: DeviceIdentity, family: str, dtype: str, shape_key: str):
    """Where-clauses for one problem of ``model`` (joined with GpuRow) on one GPU model."""
    return (
        GpuRow.name == device.name,
        GpuRow.compute_capability == device.compute_capability,
        model.family == family,
        model.dtype == dtype,
        model.shape_key == shape_key,
    )


def _rows_of(model, device: DeviceIdentity, family: str, dtype: str, shape_key: str):
    return (
        select(model)
        .join(GpuRow, model.gpu_id == GpuRow.id)
        .where(*_same_problem(model, device, family, dtype, shape_key))
    )


def _winners_query():
    return (
        select(WinnerRow, GpuRow, TrialRow)
        .join(GpuRow, WinnerRow.gpu_id == GpuRow.id)
        .join(TrialRow, WinnerRow.trial_id == TrialRow.id)
    )


def _winner_record(found) -> WinnerRecord:
    winner, gpu, trial = found
    return winner.to_record(gpu, trial)


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
