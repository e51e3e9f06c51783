"""Engines, the transaction helper and the opening and migrating of tuning databases, under
TuningDB (tuning_db.repository): which URL, which SQLite pragmas, read-only opening that writes
nothing, and how SQLAlchemy's errors become DatabaseError naming the database."""

from __future__ import annotations

import functools
import importlib
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool, StaticPool
from sqlalchemy.sql import Insert

from tuning_db import migrations
from tuning_db.models import Base
from tuning_db.records import (
    InvalidRow,
)




SQLITE_BUSY_TIMEOUT_MS = 30000
SQLITE_PRAGMAS = (
    f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}",
    "PRAGMA synchronous=NORMAL",
    "PRAGMA foreign_keys=ON",
)
BEGIN_OPTION = "autogen_sqlite_begin"  # execution option: "DEFERRED" (default) or "IMMEDIATE"
# Dialects whose INSERT ... ON CONFLICT the upserts use; each imported on first use (PostgreSQL's
# brings asyncio and asyncpg's dialect: a cost on every start-up that SQLite users need not pay).
_UPSERT_DIALECTS = ("sqlite", "postgresql")
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


@contextmanager
def autocommitted(engine: Engine, url: str) -> Iterator[Session]:
    """A session whose every statement is a transaction of its own, committed by the server as
    the statement ends (the driver's autocommit): a statement that takes a transaction's lock and
    writes, as autogen_claim_many does, then frees the lock without waiting for a COMMIT from the
    client. SQLAlchemy errors re-raised as DatabaseError naming ``url``."""
    with (_errors_named(url), engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection,
          Session(connection) as session):
        yield session


# SQLite's busy handler sleeps between tries (1 ms growing to 100 ms), so a writer queued behind
# another wakes up to 100 ms after the lock is free. Writers of one process (the owners of
# several GPUs, each with its own TuningDB) queue here first, on a lock that wakes the next
# one as soon as it is released; SQLite's lock still decides between processes.
_file_write_locks: dict[str, threading.Lock] = {}


@contextmanager
def write_queue(url: str) -> Iterator[None]:
    """Hold this process's write lock of a SQLite file for a write transaction (nothing for
    other databases). After SQLITE_BUSY_TIMEOUT_MS the transaction goes ahead without it, so
    nothing waits forever behind a stuck writer (SQLite's busy timeout then decides)."""
    path = _sqlite_file(url)
    if path is None:
        yield
        return
    with _writers_lock:
        lock = _file_write_locks.setdefault(str(path.resolve()), threading.Lock())
    held = lock.acquire(timeout=SQLITE_BUSY_TIMEOUT_MS / 1000)
    try:
        yield
    finally:
        if held:
            lock.release()


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


# The writing engines of this process, by the SQLite file they have open: (device, inode).
#
# SQLite's locks are POSIX advisory locks, which the kernel drops for the whole process as soon
# as any file descriptor of the file is closed, one SQLite does not know of included (SQLite's
# "How To Corrupt An SQLite Database File", 2.2). Checking a file again with a plain open() and
# close() (migrations.check_sqlite_file) while this process has connections to it would leave
# them unlocked, unbeknown to SQLite: another process closing its last connection would take
# itself for the last one and delete the WAL and shared-memory files under them. A file open
# here was checked when it was opened, and stays the same file while open: it is not checked
# again. (A second TuningDB of one file in one process: a multi-GPU run has one per problem.)
_writers_here: dict[tuple[int, int], weakref.WeakSet] = {}
_writers_lock = threading.Lock()


def _file_key(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


def note_writer(url: str, engine: Engine) -> None:
    """``engine`` (a writing TuningDB's) has ``url``'s SQLite file open in this process."""
    path = _sqlite_file(url)
    key = _file_key(path) if path is not None else None
    if key is not None:
        with _writers_lock:
            _writers_here.setdefault(key, weakref.WeakSet()).add(engine)


def forget_writer(engine: Engine) -> None:
    """``engine`` closed its connections (TuningDB.close)."""
    with _writers_lock:
        for engines in _writers_here.values():
            engines.discard(engine)


def _open_here(path: Path) -> bool:
    key = _file_key(path)
    with _writers_lock:
        return key is not None and bool(_writers_here.get(key))


def _check_file(path: Path, url: str, adopt: bool) -> None:
    if _open_here(path):
        return  # see _writers_here
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


@functools.lru_cache(maxsize=32)
def upsert_template(
    dialect_name: str, model: type[Base], columns: tuple[str, ...], key: tuple[str, ...],
    returning: tuple[str, ...] = ("id",),
) -> Insert:
    """INSERT ... ON CONFLICT (key) DO UPDATE of every other of ``columns``, returning the
    ``returning`` columns; executed with the values (``execute(template, values)``). Built once
    per column set: building the conflict clause made a column object per updated column, a
    third of a trial's storing time."""
    if dialect_name not in _UPSERT_DIALECTS:
        raise NotImplementedError(
            f"tuning_db writes through ON CONFLICT upserts, which it implements for sqlite and "
            f"postgresql, not {dialect_name}"
        )
    dialect_insert = importlib.import_module(f"sqlalchemy.dialects.{dialect_name}").insert
    statement = dialect_insert(model)
    changed = {name: statement.excluded[name] for name in columns if name not in key}
    upsert = statement.on_conflict_do_update(index_elements=list(key), set_=changed)
    table = model.__table__
    return upsert.returning(*(table.c[name] for name in returning))
