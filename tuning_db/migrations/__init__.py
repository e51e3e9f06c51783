"""Alembic migrations of the tuning database, configured in code (there is no alembic.ini).

Everything here works on a live SQLAlchemy connection that the caller owns, inside the caller's
transaction; tuning_db.repository opens that connection, commits, and words the errors.
"""

from __future__ import annotations

import sqlite3
import sys
from functools import lru_cache
from pathlib import Path
from urllib.parse import quote

from sqlalchemy import Column, MetaData, PrimaryKeyConstraint, String, Table, create_engine, inspect, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection
from sqlalchemy.pool import NullPool

from tuning_db.migrations.functions import create_functions
from tuning_db.models import Base

SCRIPT_LOCATION = Path(__file__).resolve().parent
# Not alembic's default name: another tool using Alembic may share the database.
VERSION_TABLE = "autogen_alembic_version"
SQLITE_HEADER = b"SQLite format 3\x00"
SQLITE_CORRUPTION = ("SQLITE_NOTADB", "SQLITE_CORRUPT")  # prefixes of sqlite3's error names
MIGRATION_LOCK_KEY = 0x6175746F67656E  # PostgreSQL advisory lock id: "autogen" in ASCII
# The newest revision in versions/ (tests check it against Alembic's script directory). Opening a
# database already at this revision needs no Alembic at all: importing Alembic and reading the
# scripts cost a quarter of a second, on every `autogen tune` answered from the database.
HEAD_REVISION = "0006_trial_counts"


class ForeignDatabaseError(Exception):
    """The database is not one autogen wrote; the message says why. Nothing was written."""


class NewerSchemaError(Exception):
    """The database is at a schema revision these migrations do not know."""


def alembic_config(connection: Connection | None = None):
    """An Alembic Config pointing at this package; env.py runs on ``connection``."""
    from alembic.config import Config

    config = Config()
    # Config values are %-interpolated, so a '%' in the install path must be doubled.
    config.set_main_option("script_location", str(SCRIPT_LOCATION).replace("%", "%%"))
    config.attributes["connection"] = connection
    return config


@lru_cache(maxsize=1)
def _script_directory():
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    return HEAD_REVISION


def script_head_revision() -> str | None:
    """The head according to Alembic's reading of versions/ (what HEAD_REVISION must equal)."""
    return _script_directory().get_current_head()


def known_revisions() -> frozenset[str]:
    return frozenset(script.revision for script in _script_directory().walk_revisions())


def is_known_revision(revision: str | None) -> bool:
    return revision == HEAD_REVISION or revision in known_revisions()


def stamped_revision(connection: Connection) -> str | None:
    """The revision recorded in the database, or None when it was never migrated (what
    Alembic's MigrationContext.get_current_revision reads, without importing Alembic)."""
    if not inspect(connection).has_table(VERSION_TABLE):
        return None
    stamped = connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    if len(stamped) > 1:
        raise NewerSchemaError(f"it is stamped with several revisions ({', '.join(sorted(stamped))})")
    return stamped[0] if stamped else None


def upgrade_to(connection: Connection, revision: str = "head") -> None:
    from alembic import command

    command.upgrade(alembic_config(connection), revision)


def downgrade_to(connection: Connection, revision: str) -> None:
    from alembic import command

    command.downgrade(alembic_config(connection), revision)


def upgrade_database(connection: Connection, adopt: bool = False) -> str:
    """Check that the database is ours and bring it to head; returns the head revision.

    The caller's transaction must hold the write lock (SQLite: BEGIN IMMEDIATE) so that processes
    opening a new database at the same moment migrate it once; PostgreSQL takes a lock here.
    ``adopt``: add autogen's tables to a database that holds only other applications' tables
    (an explicit `autogen db upgrade`); otherwise such a database is refused.
    """
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
    check_ownership(connection, adopt)
    revision = stamped_revision(connection)
    if revision == HEAD_REVISION:
        return revision  # nothing to migrate
    if revision is None:  # no autogen table yet (check_ownership): a new database
        return create_head(connection)
    if revision not in known_revisions():
        raise NewerSchemaError(
            f"its schema revision {revision} is unknown to this autogen (whose newest is "
            f"{head_revision()}): a newer autogen wrote it"
        )
    upgrade_to(connection)
    if connection.dialect.name == "sqlite":
        # SQLite migrations run with foreign keys off (batch mode rebuilds referenced tables).
        broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
        if broken:
            raise ForeignDatabaseError(f"its rows break foreign keys: {broken[:5]}")
    return head_revision()


# Alembic's version table as Alembic creates it (MigrationContext._version: one VARCHAR(32) column,
# primary key "<table>_pkc"), for create_head's stamp; tests compare the two.
_VERSION = Table(VERSION_TABLE, MetaData(), Column("version_num", String(32), nullable=False),
                 PrimaryKeyConstraint("version_num", name=f"{VERSION_TABLE}_pkc"))


def create_head(connection: Connection) -> str:
    """Create the head schema in a database without autogen tables, from the models, and stamp
    it at head: what Alembic's recipe for a new database does (create_all, then `stamp head`),
    without importing Alembic and running every migration script in turn (a large share of a
    cold `autogen tune`: docs/history/sessions.md, eleventh session). The models name every
    constraint as the migrations do (tests compare the two schemas), so later migrations find
    them; on PostgreSQL, the functions too (functions.py)."""
    Base.metadata.create_all(connection)
    create_functions(connection)
    _VERSION.create(connection)
    connection.execute(_VERSION.insert().values(version_num=HEAD_REVISION))
    return HEAD_REVISION


def check_ownership(connection: Connection, adopt: bool = False) -> None:
    """Raise ForeignDatabaseError when the ``autogen_*`` tables here cannot be autogen's own, or
    when the database holds other applications' tables and no autogen table (unless ``adopt``).
    Only reads, so a foreign database is refused before anything is written."""
    inspector = inspect(connection)
    names = inspector.get_table_names()
    tables = sorted(name for name in names if name.startswith("autogen_"))
    if not tables:
        others = sorted(names)
        if others and not adopt:
            shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
            raise ForeignDatabaseError(
                f"it holds another application's table(s) ({shown}) and no autogen table; "
                "autogen adds its tables to such a database only when asked to: run "
                "`autogen db upgrade --db URL` to share it on purpose"
            )
        return  # a new database, or one shared with other tools on purpose
    revision = stamped_revision(connection) if VERSION_TABLE in tables else None
    if revision is None:
        raise ForeignDatabaseError(
            f"it holds table(s) {', '.join(tables)} but no schema revision in {VERSION_TABLE}, "
            "so another program wrote them"
        )
    if revision != head_revision():
        return  # older schemas are the migrations' business, newer ones upgrade_database's
    missing = _missing_from_head(inspector)
    if missing:
        raise ForeignDatabaseError(
            f"it is at schema revision {revision} but lacks {', '.join(missing)}"
        )


def _missing_from_head(inspector) -> list[str]:
    """Tables and columns that the head schema (the ORM models) has and the database lacks."""
    present_tables = set(inspector.get_table_names())
    missing = []
    for table in Base.metadata.sorted_tables:
        if table.name not in present_tables:
            missing.append(f"table {table.name}")
            continue
        present = {column["name"] for column in inspector.get_columns(table.name)}
        missing += [f"column {table.name}.{c.name}" for c in table.columns if c.name not in present]
    return missing


def connect_sqlite_readonly(path: Path) -> sqlite3.Connection:
    """A connection that cannot change ``path`` nor create anything beside it.

    Opened with ``mode=ro``. SQLite would still create ``-wal`` and ``-shm`` files beside a WAL
    database whose ``-wal`` is absent (and fail to open it in a folder it cannot write), so such a
    file, whose content is then entirely in the main file, is opened ``immutable``; readers
    re-read when the file changed meanwhile (see TuningDB). A ``-wal`` without its ``-shm`` in a
    folder that cannot be written holds rows the main file lacks yet: see _connect_without_shm.
    """
    base = f"file:{quote(str(path.resolve()))}?mode=ro"
    wal = path.with_name(path.name + "-wal")
    # The -wal first: while a connection of this process has the file open in WAL mode, the
    # header is not read with open() and close(), which would drop that connection's locks
    # (tuning_db.engine._writers_here).
    if not wal.exists() and is_wal_file(path):
        return sqlite3.connect(base + "&immutable=1", uri=True, check_same_thread=False)
    connection = sqlite3.connect(base, uri=True, check_same_thread=False)
    try:
        connection.execute("SELECT count(*) FROM sqlite_master").fetchone()  # opening is lazy
    except sqlite3.OperationalError as exc:
        connection.close()
        if getattr(exc, "sqlite_errorname", "") != "SQLITE_CANTOPEN":
            raise
        if wal.exists():
            return _connect_without_shm(base, path)
        return sqlite3.connect(base + "&immutable=1", uri=True, check_same_thread=False)
    return connection


# A read-only WAL database whose -shm is missing and cannot be created (wal.html, "Read-Only
# Databases": SQLite opens it only where the -shm exists or can be made, or as immutable, which
# ignores the -wal). In EXCLUSIVE locking mode SQLite keeps the WAL index in heap memory and needs
# no -shm; a read-only connection takes that mode only without file locks (the "-none" VFS). No
# writer is connected (a writer would have made the -shm), and TuningDB re-reads where the files
# changed during a read.
_NO_LOCK_VFS = "win32-none" if sys.platform == "win32" else "unix-none"
_said_stale: set[Path] = set()


def _connect_without_shm(base: str, path: Path) -> sqlite3.Connection:
    """The database with the rows of its -wal, read through a WAL index in memory; where even that
    fails (the -wal cannot be read), the main file as it is, said once to be possibly stale."""
    connection = sqlite3.connect(f"{base}&vfs={_NO_LOCK_VFS}", uri=True, check_same_thread=False)
    try:
        connection.execute("PRAGMA locking_mode=EXCLUSIVE")
        connection.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return connection
    except sqlite3.Error as exc:
        connection.close()
        if path not in _said_stale:
            _said_stale.add(path)
            print(f"autogen: warning: {path} is read as of its last checkpoint: its -wal, which may hold "
                  f"newer rows, cannot be read here ({exc}) and its folder cannot be written", file=sys.stderr)
    return sqlite3.connect(base + "&immutable=1", uri=True, check_same_thread=False)


def is_wal_file(path: Path) -> bool:
    """Whether the SQLite header of ``path`` says WAL (file format versions, bytes 18 and 19)."""
    try:
        with path.open("rb") as handle:
            header = handle.read(20)
    except OSError:
        return False
    return len(header) == 20 and header[:16] == SQLITE_HEADER and header[18] == 2


def check_sqlite_file(path: Path, adopt: bool = False) -> None:
    """Raise ForeignDatabaseError unless ``path`` is missing, empty, or a readable SQLite file
    whose autogen tables are autogen's (and, unless ``adopt``, that holds some autogen table or
    no table at all). Opens the file read-only: a normal connection would already write to it
    (switching it to WAL)."""
    try:
        with path.open("rb") as handle:
            header = handle.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ForeignDatabaseError(f"it cannot be read: {exc.strerror}") from exc
    if not header:
        return  # SQLite treats an empty file as an empty database
    if header != SQLITE_HEADER:
        raise ForeignDatabaseError(f"it is not a SQLite file (it starts with {header!r})")
    reader = create_engine(
        "sqlite://", creator=lambda: connect_sqlite_readonly(path), poolclass=NullPool
    )
    try:
        with reader.connect() as connection:
            check_ownership(connection, adopt)
    except sa_exc.DBAPIError as exc:
        if not getattr(exc.orig, "sqlite_errorname", "").startswith(SQLITE_CORRUPTION):
            raise  # e.g. locked: a problem of the moment, not of the file
        raise ForeignDatabaseError(f"SQLite cannot read it: {exc.orig}") from exc
    finally:
        reader.dispose()
