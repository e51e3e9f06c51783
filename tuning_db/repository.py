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
"""

from __future__ import annotations

import json
import math
import os
import re
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import create_engine, delete, event, func, inspect, literal, null, select, text, update
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool, StaticPool
from sqlalchemy.sql import Insert

from tuning_db import migrations
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

TRIAL_STATUSES = ("ok", "failed", "rejected")
CACHE_MODES = ("cold", "hot")
GPU_KEY = ("name", "compute_capability")
TRIAL_KEY = ("gpu_id", "family", "dtype", "shape_key", "kernel_name", "cache_mode")
WINNER_KEY = ("gpu_id", "family", "dtype", "shape_key", "cache_mode")
VALIDATION_KEY = ("gpu_id", "family", "dtype", "shape_key", "source_hash")
# "m=16384,n=16": name=size pairs. Families check their own dimension names, order and ranges.
SHAPE_KEY_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=(?:[0-9]+|[A-Za-z_][A-Za-z0-9_]*)(?:,[A-Za-z_][A-Za-z0-9_]*=(?:[0-9]+|[A-Za-z_][A-Za-z0-9_]*))*")

SQLITE_BUSY_TIMEOUT_MS = 30000
SQLITE_PRAGMAS = (
    f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}",
    "PRAGMA synchronous=NORMAL",
    "PRAGMA foreign_keys=ON",
)
BEGIN_OPTION = "autogen_sqlite_begin"  # execution option: "DEFERRED" (default) or "IMMEDIATE"
_DIALECT_INSERTS = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}
UNSYNCHRONIZED = {"synchronize_session": False}  # bulk deletes: the session holds no rows to update
UPGRADE_HINT = "run `autogen db upgrade`"


class DatabaseError(Exception):
    """A tuning database operation failed; the message names the database."""

    def __init__(self, message: str, url: str = ""):
        super().__init__(message)
        self.url = url


class CorruptDatabaseError(DatabaseError):
    """The database is not a readable autogen tuning database; it was left untouched."""


class InvalidRowError(DatabaseError):
    """The one row asked for is malformed (``row`` says which and why)."""

    def __init__(self, message: str, url: str, row: InvalidRow):
        super().__init__(message, url)
        self.row = row


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


def _plain_engine(url: str, **options: Any) -> Engine:
    with _errors_named(url):
        try:
            parsed = make_url(url)
            if parsed.get_backend_name() == "sqlite" and (parsed.database or "") in ("", ":memory:"):
                # One in-memory database per engine, shared by every thread (the default pool
                # would give each thread a database of its own).
                options.update(poolclass=StaticPool, connect_args={"check_same_thread": False})
            return create_engine(url, **options)
        except ImportError as exc:
            raise DatabaseError(f"{display_url(url)}: no database driver: {exc}", url) from exc


def _create_engine(url: str) -> Engine:
    engine = _plain_engine(url)
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

    _begin_explicitly(engine)


def _begin_explicitly(engine: Engine) -> None:
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


def _readonly_engine(url: str) -> Engine | None:
    """An engine that cannot write; None for a SQLite file that does not exist (yet).

    SQLite files are opened by migrations.connect_sqlite_readonly (mode=ro, no -wal/-shm created)
    after the file was checked to be autogen's; PostgreSQL sessions are READ ONLY transactions.
    No pragma that writes (journal_mode) is ever sent.
    """
    path = _sqlite_file(_checked(url))
    if path is not None:
        if not path.exists():
            return None
        _check_file(path, url, adopt=False)
        engine = create_engine(
            "sqlite://", creator=lambda: migrations.connect_sqlite_readonly(path),
            poolclass=NullPool,
        )
    elif make_url(url).get_backend_name() == "postgresql":
        return _plain_engine(url, execution_options={"postgresql_readonly": True})
    else:
        engine = _plain_engine(url)  # SQLite in memory or a URI filename: as the URL says
    if engine.dialect.name == "sqlite":

        @event.listens_for(engine, "connect")
        def configure(dbapi_connection, _record) -> None:
            dbapi_connection.isolation_level = None
            dbapi_connection.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")

        _begin_explicitly(engine)
    return engine


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


def _prepare(url: str, adopt: bool = False) -> None:
    """Create a SQLite file's folder and refuse a file that is not ours, before connecting."""
    path = _sqlite_file(_checked(url))
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DatabaseError(f"cannot create the folder of {path}: {exc.strerror}", url) from exc
    _check_file(path, url, adopt)


def _check_file(path: Path, url: str, adopt: bool) -> None:
    try:
        with _errors_named(url):
            migrations.check_sqlite_file(path, adopt)
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


def _migrate(engine: Engine, url: str, adopt: bool = False) -> str:
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
                return migrations.upgrade_database(session.connection(), adopt)
        except migrations.ForeignDatabaseError as exc:
            raise _not_ours(display_url(url), exc, url) from exc
        except migrations.NewerSchemaError as exc:
            raise DatabaseError(f"{display_url(url)}: {exc}", url) from exc
        finally:
            if driver is not None:
                driver.execute("PRAGMA foreign_keys=ON")


def _require_head(engine: Engine, url: str, create: bool) -> None:
    with transaction(engine, url) as session:
        revision = migrations.stamped_revision(session.connection())
    if revision is None and create:
        _migrate(engine, url)  # refuses anything that is not a new or an autogen database
        return
    head = migrations.head_revision()
    if revision != head:
        raise DatabaseError(
            f"{display_url(url)} is at schema revision {revision or '(none)'}, not {head}: "
            f"{UPGRADE_HINT} (or open it with upgrade=True)",
            url,
        )


def _require_head_readonly(url: str, create: bool) -> None:
    revision = current_revision(url)
    head = migrations.head_revision()
    if revision != head and not (revision is None and create):
        raise DatabaseError(
            f"{display_url(url)} is at schema revision {revision or '(none)'}, not {head}: "
            f"{UPGRADE_HINT} (or open it with upgrade=True)",
            url,
        )


def upgrade(url: str | os.PathLike | None = None) -> str:
    """Migrate the database at ``url`` (default: default_url()) to head; returns the head.

    This explicit step (`autogen db upgrade`) is the one that also adds autogen's tables to a
    database holding other applications' tables; every implicit open refuses such a database.
    """
    url = as_url(url)
    _prepare(url, adopt=True)
    engine = _create_engine(url)
    try:
        return _migrate(engine, url, adopt=True)
    finally:
        engine.dispose()


def current_revision(url: str | os.PathLike | None) -> str | None:
    """The schema revision stored at ``url``; None for a database autogen never migrated.
    Only reads: a missing file is not created, nothing is written."""
    url = as_url(url)
    engine = _readonly_engine(url)
    if engine is None:
        return None  # reading must not create the file
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


# -- what the schema at hand holds ----------------------------------------------------------------

# Columns that older schemas lack and readers can do without: (table, column) -> stand-in.
# autogen_winners.cache_mode (revision 0003) is its trial's, which _winner_columns supplies.
_STAND_INS: dict[tuple[str, str], Callable[[], Any]] = {
    (TrialRow.__tablename__, "cache_mode"): lambda: literal("cold"),  # revision 0002
    (TrialRow.__tablename__, "spread_us"): null,  # revision 0002
    (WinnerRow.__tablename__, "cache_mode"): lambda: None,  # revision 0003
}
_OPTIONAL_TABLES = frozenset({ValidationRow.__tablename__,  # revision 0002
                              ClaimRow.__tablename__})  # revision 0004_trial_claims


@dataclass(frozen=True)
class _Schema:
    """The autogen tables and columns a database holds; ``tables`` None means the head schema."""

    tables: frozenset[str] | None
    columns: Mapping[str, frozenset[str]] = field(default_factory=dict)
    revision: str | None = None

    def has_table(self, model: type[Base]) -> bool:
        return self.tables is None or model.__tablename__ in self.tables

    def has_column(self, model: type[Base], name: str) -> bool:
        return self.tables is None or name in self.columns.get(model.__tablename__, ())

    def column(self, model: type[Base], name: str):
        """The column, or what stands in for it where this (older) schema lacks it."""
        if self.has_column(model, name):
            return getattr(model, name)
        return _STAND_INS[(model.__tablename__, name)]()


_HEAD = _Schema(None)
_EMPTY = _Schema(frozenset())


def _read_schema(connection: Connection, url: str) -> _Schema:
    """What a database opened read-only holds. A new (empty) database reads as empty; another
    application's, or one autogen cannot read, is refused with what to do."""
    try:
        migrations.check_ownership(connection)
    except migrations.ForeignDatabaseError as exc:
        raise _not_ours(display_url(url), exc, url) from exc
    inspector = inspect(connection)
    ours = frozenset(name for name in inspector.get_table_names() if name.startswith("autogen_"))
    if not ours:
        return _EMPTY
    revision = migrations.stamped_revision(connection)
    where = display_url(url)
    if revision not in migrations.known_revisions():
        raise DatabaseError(
            f"{where}: its schema revision {revision} is unknown to this autogen (whose newest "
            f"is {migrations.head_revision()}): a newer autogen wrote it",
            url,
        )
    columns = {name: frozenset(c["name"] for c in inspector.get_columns(name)) for name in ours}
    lacking = []
    for table in Base.metadata.sorted_tables:
        if table.name not in ours:
            if table.name not in _OPTIONAL_TABLES:
                lacking.append(f"table {table.name}")
            continue
        lacking += [
            f"column {table.name}.{c.name}" for c in table.columns
            if c.name not in columns[table.name] and (table.name, c.name) not in _STAND_INS
        ]
    if lacking:
        raise DatabaseError(
            f"{where} is at schema revision {revision} and lacks {', '.join(lacking)}, so this "
            f"autogen cannot read it as it is: {UPGRADE_HINT} --db {where}",
            url,
        )
    return _Schema(ours, columns, revision)


# -- rows to records, checking every value --------------------------------------------------------


class _Malformed(Exception):
    """A stored value that cannot go into a record; the message says which and why."""


def _labeled(schema: _Schema, model: type[Base], prefix: str, **stand_ins) -> list:
    columns = []
    for column in model.__table__.columns:
        if column.name in stand_ins and not schema.has_column(model, column.name):
            expression = stand_ins[column.name]
        else:
            expression = schema.column(model, column.name)
        columns.append(expression.label(prefix + column.name))
    return columns


def _winner_mode(schema: _Schema):
    """A winner's cache mode: its own column, or (before revision 0003) its trial's."""
    if schema.has_column(WinnerRow, "cache_mode"):
        return WinnerRow.cache_mode
    return schema.column(TrialRow, "cache_mode")


def _trial_columns(schema: _Schema) -> list:
    return _labeled(schema, TrialRow, "t_")


def _winner_columns(schema: _Schema) -> list:
    return (
        _labeled(schema, WinnerRow, "w_", cache_mode=_winner_mode(schema))
        + _labeled(schema, GpuRow, "g_")
        + _trial_columns(schema)
    )


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_JSON_TYPES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean",
               type(None): "null"}


def _text(mapping: Mapping, key: str, what: str) -> str:
    value = mapping[key]
    if not isinstance(value, str):
        raise _Malformed(f"{what}={_short(value)} is not text")
    return value


def _integer(mapping: Mapping, key: str, what: str) -> int:
    value = mapping[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Malformed(f"{what}={_short(value)} is not an integer")
    return value


def _number(value: object, what: str, *, positive: bool = False, optional: bool = True) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _Malformed(f"{what}={_short(value)} is not " + ("a positive time" if positive else "a number"))
    if positive and value <= 0:
        raise _Malformed(f"{what}={_short(value)} is not a positive time")
    return float(value)


def _json(mapping: Mapping, key: str, what: str) -> Any:
    text = mapping[key]
    if not isinstance(text, str):
        raise _Malformed(f"{what} are not JSON text but {_short(text)}")
    try:
        return json.loads(text)
    except ValueError:
        raise _Malformed(f"{what} are not JSON: {_short(text)}") from None


def _shape_key(mapping: Mapping, key: str) -> str:
    value = mapping[key]
    if not isinstance(value, str) or not SHAPE_KEY_PATTERN.fullmatch(value):
        raise _Malformed(f"bad shape key {_short(value)}: expected name=size pairs separated by commas")
    return value


def _choice(mapping: Mapping, key: str, what: str, allowed: tuple[str, ...]) -> str:
    value = mapping[key]
    if value not in allowed:
        raise _Malformed(f"{what}={_short(value)} is not one of {', '.join(allowed)}")
    return value


def _trial_record(m: Mapping, p: str = "t_") -> TrialRecord:
    """The trial in the ``p``-prefixed columns of ``m``; _Malformed naming the first bad value."""
    params = _json(m, p + "params", "params")
    if not isinstance(params, dict):
        raise _Malformed(f"params are not a mapping but a JSON {_JSON_TYPES.get(type(params), 'value')}")
    status = _choice(m, p + "status", "status", TRIAL_STATUSES)
    ok = status == "ok"
    samples = _json(m, p + "samples_us", "samples_us")
    if not isinstance(samples, list):
        raise _Malformed(f"samples_us are not a JSON array but {_short(samples)}")
    return TrialRecord(
        family=_text(m, p + "family", "family"),
        dtype=_text(m, p + "dtype", "dtype"),
        shape_key=_shape_key(m, p + "shape_key"),
        kernel_name=_text(m, p + "kernel_name", "kernel_name"),
        params=params,
        status=status,
        reason=_text(m, p + "reason", "reason"),
        time_us=_number(m[p + "time_us"], "time_us", positive=ok, optional=not ok),
        samples_us=tuple(_number(s, "a sample in samples_us", optional=False) for s in samples),
        spread_us=_number(m[p + "spread_us"], "spread_us"),
        error=_number(m[p + "error"], "error"),
        source_hash=_text(m, p + "source_hash", "source_hash"),
        compile_options=_text(m, p + "compile_options", "compile_options"),
        cache_mode=_choice(m, p + "cache_mode", "cache_mode", CACHE_MODES),
        created_at=_text(m, p + "created_at", "created_at"),
    )


def _device_record(m: Mapping) -> DeviceIdentity:
    """The GPU row (g_) with the software stack of the trial (t_) it is read with."""
    return DeviceIdentity(
        name=_text(m, "g_name", "GPU name"),
        compute_capability=_text(m, "g_compute_capability", "compute_capability"),
        sm_count=_integer(m, "g_sm_count", "sm_count"),
        l2_bytes=_integer(m, "g_l2_bytes", "l2_bytes"),
        driver_version=_integer(m, "t_driver_version", "driver_version"),
        runtime_version=_integer(m, "t_runtime_version", "runtime_version"),
        nvrtc_version=_text(m, "t_nvrtc_version", "nvrtc_version"),
    )


def _winner_record(m: Mapping) -> WinnerRecord:
    if m["g_id"] is None:
        raise _Malformed(f"its GPU (autogen_gpus row {m['w_gpu_id']!r}) is missing")
    if m["t_id"] is None:
        raise _Malformed(f"its trial (autogen_trials row {m['w_trial_id']!r}) is missing")
    try:
        trial = _trial_record(m)
        device = _device_record(m)
    except _Malformed as exc:
        raise _Malformed(f"its trial (autogen_trials row {m['t_id']!r}): {exc}") from None
    if trial.status != "ok":
        raise _Malformed(f"its trial (autogen_trials row {m['t_id']!r}) has status "
                         f"{trial.status!r}; only an ok trial can win")
    stored_as = (m["w_gpu_id"], m["w_family"], m["w_dtype"], m["w_shape_key"], m["w_cache_mode"])
    trial_is = (m["t_gpu_id"], trial.family, trial.dtype, trial.shape_key, trial.cache_mode)
    if stored_as != trial_is:
        raise _Malformed(f"it is stored as the winner of {_short(stored_as[1:])} but its trial "
                         f"(autogen_trials row {m['t_id']!r}) is of {_short(trial_is[1:])}")
    return WinnerRecord(
        device=device,
        trial=trial,
        peer_name=_text(m, "w_peer_name", "peer_name"),
        peer_time_us=_number(m["w_peer_time_us"], "peer_time_us", positive=True),
        margin=_number(m["w_margin"], "margin"),
        autogen_version=_text(m, "w_autogen_version", "autogen_version"),
        updated_at=_text(m, "w_updated_at", "updated_at"),
    )


def _invalid_winner(m: Mapping, reason: str) -> InvalidRow:
    return InvalidRow(WinnerRow.__tablename__, m["w_id"], reason, gpu=m["g_name"],
                      family=m["w_family"], dtype=m["w_dtype"], shape_key=m["w_shape_key"],
                      cache_mode=m["w_cache_mode"])


def _invalid_trial(m: Mapping, reason: str) -> InvalidRow:
    return InvalidRow(TrialRow.__tablename__, m["t_id"], reason, gpu=m.get("g_name"),
                      family=m["t_family"], dtype=m["t_dtype"], shape_key=m["t_shape_key"],
                      cache_mode=m["t_cache_mode"])


def _sorted_checked(rows, build, invalid) -> tuple[list, list[InvalidRow]]:
    records, bad = [], []
    for row in rows:
        mapping = row._mapping
        try:
            records.append(build(mapping))
        except _Malformed as exc:
            bad.append(invalid(mapping, str(exc)))
    return records, bad


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
            gpu = _lock_gpu(session, device)
            if gpu is None:
                return 0
            deleted = 0
            for model in (ClaimRow, WinnerRow, TrialRow):  # the winner first: it references a trial
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
            gpu = _lock_gpu(session, device)  # a failed re-measurement now waits for us
            schema = _HEAD
            query = (
                select(*_trial_columns(schema), GpuRow.name.label("g_name"))
                .join(GpuRow, TrialRow.gpu_id == GpuRow.id)
                .where(*_same_problem(TrialRow, device, trial.family, trial.dtype, trial.shape_key))
                .where(TrialRow.kernel_name == trial.kernel_name,
                       TrialRow.cache_mode == trial.cache_mode)
            )
            found = session.execute(query).one_or_none()
            if found is None or gpu is None:
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
                    WinnerRow.gpu_id == gpu.id,
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
                "gpu_id": gpu.id,
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
            return _sorted_checked(session.execute(query), _winner_record, _invalid_winner)

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
    ) -> Claim:
        """Claim the variant of ``trial`` (its problem, kernel name, params and cache mode) for
        ``owner`` for ``lease_s`` seconds, unless it is measured already, another worker holds a
        live lease on it, or ``budget`` trials of the problem (stored ones plus running claims)
        are reached. A lapsed lease is taken over (pass no budget: it holds its place already). Decided under the write lock (SQLite: BEGIN
        IMMEDIATE; PostgreSQL: the GPU row FOR UPDATE), so concurrent workers never both win,
        and the budget is exact across them."""
        problem = (trial.family, trial.dtype, trial.shape_key, trial.cache_mode)
        with self._write() as session:
            gpu_id = self._locked_gpu_id(session, device)
            now = _db_epoch(session)
            row = session.scalars(_claims_of(gpu_id, *problem).where(ClaimRow.variant == variant)).one_or_none()
            if row is not None and row.state == "done":
                return Claim("done", row.kernel_name)
            if row is not None and row.expires_at > now and row.owner != owner:
                return Claim("taken", row.kernel_name)
            stored = session.scalars(
                select(TrialRow.kernel_name).where(*_problem_of(TrialRow, gpu_id, *problem),
                                                   TrialRow.kernel_name == trial.kernel_name,
                                                   TrialRow.status != "rejected")).first()
            if stored is not None:  # measured before claims existed, or without one
                return Claim("done", stored)
            if budget is not None and self._launched(session, gpu_id, problem) >= budget:
                return Claim("budget")
            values = dict(kernel_name=trial.kernel_name, params=json.dumps(trial.params, sort_keys=True),
                          owner=owner, state="running", expires_at=now + lease_s, updated_at=_now())
            if row is None:
                session.add(ClaimRow(gpu_id=gpu_id, family=trial.family, dtype=trial.dtype,
                                     shape_key=trial.shape_key, cache_mode=trial.cache_mode,
                                     variant=variant, attempts=1, created_at=values["updated_at"],
                                     **values))
                return Claim("claimed", trial.kernel_name)
            previous = row.owner
            for name, value in values.items():
                setattr(row, name, value)
            row.attempts += 1
            return Claim("claimed", trial.kernel_name, taken_over=previous != owner, previous=previous)

    @staticmethod
    def _launched(session: Session, gpu_id: int, problem: tuple) -> int:
        """Trials of the problem that count against its budget: stored ones (not rejected) and
        running claims, lapsed ones included: a dead worker's variant keeps its place in the
        budget until a live worker takes it over and measures it."""
        stored = session.scalar(select(func.count()).select_from(TrialRow).where(
            *_problem_of(TrialRow, gpu_id, *problem), TrialRow.status != "rejected"))
        running = session.scalar(select(func.count()).select_from(ClaimRow).where(
            *_problem_of(ClaimRow, gpu_id, *problem), ClaimRow.state == "running"))
        return stored + running

    def complete_claim(self, device: DeviceIdentity, trial: TrialRecord, variant: str, owner: str) -> TrialRecord:
        """Store the measured ``trial`` and mark its claim done, in one transaction: a variant is
        never left measured but claimed, nor done but unstored. The claim is marked done even if
        its lease had lapsed and another worker took it over (the measurement is as good)."""
        _check_choice("status", trial.status, TRIAL_STATUSES)
        values = TrialRow.values_of(device, trial)
        with self._write() as session:
            gpu_id = self._locked_gpu_id(session, device)
            values.update(gpu_id=gpu_id, created_at=_now())
            trial_id = self._upsert(session, TrialRow, values, TRIAL_KEY)
            if trial.status != "ok":
                session.execute(delete(WinnerRow).where(WinnerRow.trial_id == trial_id))
            row = session.scalars(_claims_of(gpu_id, trial.family, trial.dtype, trial.shape_key,
                                             trial.cache_mode).where(ClaimRow.variant == variant)).one_or_none()
            if row is not None:
                row.state, row.kernel_name, row.updated_at = "done", trial.kernel_name, _now()
            return session.get_one(TrialRow, trial_id).to_record()

    def release_claims(self, owner: str) -> int:
        """Give back every running claim of ``owner`` (an interrupted worker), so others need
        not wait for the leases to lapse; returns how many."""
        with self._write() as session:
            statement = delete(ClaimRow).where(ClaimRow.owner == owner, ClaimRow.state == "running")
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
                                row.kernel_name, json.loads(row.params), row.owner, row.state,
                                row.expires_at - now, row.attempts)
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
        if self._readonly:
            raise DatabaseError(f"{display_url(self._url)} was opened read-only", self._url)
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

    def _locked_gpu_id(self, session: Session, device: DeviceIdentity) -> int:
        """The GPU row's id, locked (see _lock_gpu); inserted first where missing. Claims are
        frequent: the row is looked up before an upsert is built."""
        gpu = _lock_gpu(session, device)
        if gpu is None:
            self._upsert_gpu(session, device)
            gpu = _lock_gpu(session, device)
        return gpu.id

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


def _problem_of(model, gpu_id: int, family: str, dtype: str, shape_key: str, cache_mode: str):
    return (model.gpu_id == gpu_id, model.family == family, model.dtype == dtype,
            model.shape_key == shape_key, model.cache_mode == cache_mode)


def _claims_of(gpu_id: int, family: str, dtype: str, shape_key: str, cache_mode: str):
    return select(ClaimRow).where(*_problem_of(ClaimRow, gpu_id, family, dtype, shape_key, cache_mode))


def _db_epoch(session: Session) -> float:
    """Seconds since the epoch on the database's clock: leases written by workers on several
    machines are compared on one clock."""
    if session.get_bind().dialect.name == "postgresql":
        return float(session.execute(text("SELECT extract(epoch from clock_timestamp())")).scalar_one())
    return float(session.execute(text("SELECT (julianday('now') - 2440587.5) * 86400.0")).scalar_one())


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
