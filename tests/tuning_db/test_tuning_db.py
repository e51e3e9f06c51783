"""Tests of tuning_db: records round trips, upserts, migrations, corruption and concurrency.

CPU only; every database lives under pytest's tmp_path.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import random
import sqlite3
import subprocess
import sys
import traceback
from datetime import datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.dialects import postgresql

import tuning_db
from tuning_db import (
    CorruptDatabaseError,
    DatabaseError,
    DeviceIdentity,
    TrialRecord,
    TuningDB,
    ValidationRecord,
    current_revision,
    default_url,
    upgrade,
)
from tuning_db import migrations
from tuning_db.models import Base, TrialRow
from tuning_db.engine import transaction, upsert_template
from tuning_db.repository import TRIAL_KEY
from conftest import checkout_env

ASSET_0001 = Path(__file__).parent.parent / "assets" / "tuning_db_rev0001.sql"
H100 = DeviceIdentity("NVIDIA H100 80GB HBM3", "9.0", 132, 52428800, 13000, 13000, "13.0")
A100 = DeviceIdentity("NVIDIA A100-SXM4-40GB", "8.0", 108, 41943040, 12040, 12040, "12.4")
SHAPE = "m=16384,n=16"


def make_trial(kernel: str = "gemv_a", time_us: float | None = 10.0, **changes) -> TrialRecord:
    ok = changes.get("status", "ok") == "ok"
    fields = dict(
        family="gemv",
        dtype="float32",
        shape_key=SHAPE,
        kernel_name=kernel,
        params={"bm": 64, "tile": [4, 8]},
        status="ok",
        time_us=time_us if ok else None,
        samples_us=(time_us, time_us + 0.5) if ok and time_us is not None else (),
        spread_us=0.5 if ok else None,
        error=1e-7 if ok else None,
        source_hash="hash-" + kernel,
        compile_options="--gpu-architecture=sm_90 -O3",
    )
    fields.update(changes)
    return TrialRecord(**fields)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "nested" / "folder" / "tuning.db"


@pytest.fixture
def db(db_path: Path):
    database = TuningDB(db_path)
    yield database
    database.close()


def sqlite_count(path: Path, table: str) -> int:
    with sqlite3.connect(path) as connection:
        return connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def load_rev0001(path: Path) -> None:
    with sqlite3.connect(path) as connection:
        connection.executescript(ASSET_0001.read_text())


# -- round trips ----------------------------------------------------------------------------------


def test_trial_round_trip_keeps_every_field(db: TuningDB, db_path: Path):
    trial = make_trial(reason="", cache_mode="hot")
    stored = db.record_trial(H100, trial)

    assert db_path.exists(), "the missing parent folders were created"
    assert datetime.fromisoformat(stored.created_at).utcoffset().total_seconds() == 0
    assert stored == dataclasses.replace(trial, created_at=stored.created_at)
    assert stored.params == {"bm": 64, "tile": [4, 8]}
    assert db.find_trial(H100, "gemv", "float32", SHAPE, "gemv_a", cache_mode="hot") == stored
    assert db.find_trial(H100, "gemv", "float32", SHAPE, "gemv_a") is None  # cold: not stored
    assert db.find_trial(A100, "gemv", "float32", SHAPE, "gemv_a", cache_mode="hot") is None


def test_failed_trial_round_trip(db: TuningDB):
    failed = make_trial("gemv_big", status="failed", reason="too many resources requested")
    stored = db.record_trial(H100, failed)
    assert stored == dataclasses.replace(failed, created_at=stored.created_at)
    assert stored.time_us is None and stored.samples_us == ()


def test_validation_round_trip_and_upsert(db: TuningDB, db_path: Path):
    passed = ValidationRecord("gemv", "float32", "m=8192,n=16", "gemv_a", "hash-a", True, 2e-7)
    stored = db.record_validation(H100, passed)
    assert stored == dataclasses.replace(passed, created_at=stored.created_at)
    assert db.validation(H100, "gemv", "float32", "m=8192,n=16", "hash-a") == stored

    failed = dataclasses.replace(passed, passed=False, error=0.3, reason="error 0.3 > 1e-4")
    again = db.record_validation(H100, failed)
    assert again == dataclasses.replace(failed, created_at=again.created_at)
    assert db.validation(H100, "gemv", "float32", "m=8192,n=16", "hash-a") == again
    assert db.validation(H100, "gemv", "float32", "m=8192,n=16", "hash-b") is None
    assert sqlite_count(db_path, "autogen_validations") == 1


def test_winner_round_trip_rebuilds_the_device(db: TuningDB):
    stored = db.record_trial(H100, make_trial())
    winner = db.set_winner(
        H100, stored, peer_name="cuBLAS sgemv", peer_time_us=12.5, margin=0.08,
        autogen_version="0.3.0",
    )
    assert winner.device == H100
    assert winner.trial == stored
    assert (winner.peer_name, winner.peer_time_us, winner.margin) == ("cuBLAS sgemv", 12.5, 0.08)
    assert winner.autogen_version == "0.3.0" and winner.updated_at
    assert db.winner(H100, "gemv", "float32", SHAPE) == winner

    # Matched on (name, compute capability) only; the device comes back as stored.
    newer_driver = dataclasses.replace(H100, driver_version=13010, nvrtc_version="13.1")
    assert db.winner(newer_driver, "gemv", "float32", SHAPE) == winner
    other_cc = dataclasses.replace(H100, compute_capability="9.1")
    assert db.winner(other_cc, "gemv", "float32", SHAPE) is None


# -- upserts --------------------------------------------------------------------------------------


def test_re_measurement_replaces_instead_of_duplicating(db: TuningDB, db_path: Path):
    first = db.record_trial(H100, make_trial(time_us=10.0))
    second = db.record_trial(H100, make_trial(time_us=8.0))
    hot = db.record_trial(H100, make_trial(time_us=5.0, cache_mode="hot"))

    assert sqlite_count(db_path, "autogen_trials") == 2
    assert sqlite_count(db_path, "autogen_gpus") == 1
    assert second.time_us == 8.0 and second.created_at >= first.created_at
    assert db.trials(H100, "gemv", "float32", SHAPE) == [second, hot]
    assert db.trials(H100, "gemv", "float32", SHAPE, cache_mode="hot") == [hot]


def test_trials_are_ordered_by_creation(db: TuningDB):
    for kernel in ("gemv_c", "gemv_a", "gemv_b"):
        db.record_trial(H100, make_trial(kernel))
    db.record_trial(H100, make_trial("gemv_c", time_us=3.0))  # re-measured last
    names = [t.kernel_name for t in db.trials(H100, "gemv", "float32", SHAPE)]
    assert names == ["gemv_a", "gemv_b", "gemv_c"]


def test_set_winner_replaces_the_previous_winner(db: TuningDB, db_path: Path):
    slow = db.record_trial(H100, make_trial("gemv_a", 10.0))
    fast = db.record_trial(H100, make_trial("gemv_b", 7.0))
    db.set_winner(H100, slow)
    db.set_winner(H100, fast, margin=0.3)
    assert sqlite_count(db_path, "autogen_winners") == 1
    assert db.winner(H100, "gemv", "float32", SHAPE).trial.kernel_name == "gemv_b"


def test_set_winner_refuses_failed_and_unknown_trials(db: TuningDB):
    failed = db.record_trial(H100, make_trial("gemv_x", status="failed", reason="launch error"))
    with pytest.raises(ValueError, match="status 'failed'"):
        db.set_winner(H100, failed)
    with pytest.raises(ValueError, match="not stored"):
        db.set_winner(H100, make_trial("gemv_never_recorded"))
    # An ok record in hand does not help when the stored measurement failed.
    with pytest.raises(ValueError, match="status 'failed'"):
        db.set_winner(H100, dataclasses.replace(failed, status="ok", time_us=1.0))
    assert db.winner(H100, "gemv", "float32", SHAPE) is None


def test_failed_re_measurement_withdraws_the_winner(db: TuningDB):
    db.set_winner(H100, db.record_trial(H100, make_trial("gemv_a")))
    db.record_trial(H100, make_trial("gemv_a", status="failed", reason="driver update broke it"))
    assert db.winner(H100, "gemv", "float32", SHAPE) is None


def test_record_trial_rejects_unknown_status_and_cache_mode(db: TuningDB):
    with pytest.raises(ValueError, match="status"):
        db.record_trial(H100, make_trial(status="great"))
    with pytest.raises(ValueError, match="cache_mode"):
        db.record_trial(H100, make_trial(cache_mode="warm"))
    assert db.trials(H100, "gemv", "float32", SHAPE) == []


def test_winners_filters(db: TuningDB):
    for device in (H100, A100):
        for family in ("gemv", "reduce"):
            for dtype in ("float32", "float16"):
                stored = db.record_trial(device, make_trial(family=family, dtype=dtype))
                db.set_winner(device, stored)

    def keys(winners):
        return {(w.device.name, w.trial.family, w.trial.dtype) for w in winners}

    assert len(db.winners()) == 8
    assert keys(db.winners(family="reduce")) == {
        (d.name, "reduce", t) for d in (H100, A100) for t in ("float32", "float16")
    }
    assert {w.device for w in db.winners(gpu_name=A100.name)} == {A100}
    assert {w.device for w in db.winners(compute_capability="9.0")} == {H100}
    assert keys(db.winners(family="gemv", dtype="float16", gpu_name=H100.name)) == {
        (H100.name, "gemv", "float16")
    }
    assert db.winners(family="gemv", compute_capability="7.5") == []
    names = [w.device.name for w in db.winners()]
    assert names == sorted(names)


def test_delete_trials_forgets_one_problem(db: TuningDB):
    for kernel in ("gemv_a", "gemv_b"):
        db.record_trial(H100, make_trial(kernel))
    db.set_winner(H100, db.record_trial(H100, make_trial("gemv_c")))
    kept = db.record_trial(H100, make_trial(shape_key="m=1,n=1"))
    db.set_winner(H100, kept)
    db.record_trial(A100, make_trial())

    assert db.delete_trials(H100, "gemv", "float32", SHAPE) == 3
    assert db.trials(H100, "gemv", "float32", SHAPE) == []
    assert db.winner(H100, "gemv", "float32", SHAPE) is None
    assert db.winner(H100, "gemv", "float32", "m=1,n=1").trial == kept
    assert len(db.trials(A100, "gemv", "float32", SHAPE)) == 1
    assert db.delete_trials(H100, "gemv", "float32", SHAPE) == 0


# -- connections and errors -----------------------------------------------------------------------


def test_sqlite_connections_are_configured(db: TuningDB):
    # Per-connection settings can only be seen on the repository's own engine.
    with db._engine.connect() as connection:

        def pragma(name: str):
            return connection.exec_driver_sql(f"PRAGMA {name}").scalar()

        assert pragma("journal_mode") == "wal"
        assert pragma("synchronous") == 1  # NORMAL
        assert pragma("busy_timeout") == 30000
        assert pragma("foreign_keys") == 1


def test_transaction_rolls_back_and_names_the_url(db: TuningDB):
    engine = sa.create_engine(db.url)
    try:
        with pytest.raises(DatabaseError) as caught:
            with transaction(engine, db.url) as session:
                session.execute(sa.text("INSERT INTO autogen_gpus VALUES (7, 'x', '1.0', 1, 1)"))
                session.execute(sa.text("SELECT * FROM no_such_table"))
        assert db.url in str(caught.value) and "no_such_table" in str(caught.value)
        with engine.connect() as connection:
            assert connection.exec_driver_sql("SELECT count(*) FROM autogen_gpus").scalar() == 0
    finally:
        engine.dispose()


def test_database_error_names_the_url(db: TuningDB, db_path: Path):
    with sqlite3.connect(db_path) as connection:
        connection.execute("DROP TABLE autogen_validations")
    v = ValidationRecord("gemv", "float32", SHAPE, "gemv_a", "hash-a", True)
    with pytest.raises(DatabaseError) as caught:
        db.record_validation(H100, v)
    assert not isinstance(caught.value, CorruptDatabaseError)
    assert db.url in str(caught.value) and caught.value.url == db.url


def test_unreachable_server_error_names_the_url_without_password():
    url = "postgresql://autogen:s3cret@127.0.0.1:1/tuning"
    with pytest.raises(DatabaseError) as caught:
        TuningDB(url)
    message = str(caught.value)
    assert "127.0.0.1:1/tuning" in message and "s3cret" not in message


def test_postgresql_upsert_is_on_conflict_do_update():
    values = {name: 1 for name in TRIAL_KEY} | {"time_us": 2.0, "status": "ok"}
    sql = str(upsert_template("postgresql", TrialRow, tuple(values), TRIAL_KEY).compile(
        dialect=postgresql.dialect()))
    assert "ON CONFLICT (gpu_id, family, dtype, shape_key, kernel_name, cache_mode)" in sql
    assert "DO UPDATE SET status = excluded.status, time_us = excluded.time_us RETURNING" in sql
    assert "RETURNING autogen_trials.id" in sql
    with pytest.raises(NotImplementedError, match="mysql"):
        upsert_template("mysql", TrialRow, tuple(values), TRIAL_KEY)


def test_default_url_and_bare_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("AUTOGEN_DB", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_url() == f"sqlite:///{tmp_path}/cache/autogen/tuning.db"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_url() == f"sqlite:///{Path.home()}/.cache/autogen/tuning.db"
    monkeypatch.setenv("AUTOGEN_DB", "postgresql://host/tuning")
    assert default_url() == "postgresql://host/tuning"

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AUTOGEN_DB", "relative.db")
    with TuningDB() as database:
        assert database.url == f"sqlite:///{tmp_path}/relative.db"
    assert (tmp_path / "relative.db").exists()
    assert upgrade(tmp_path / "relative.db") == migrations.head_revision()


def test_opening_without_upgrade_requires_head(tmp_path: Path):
    old = tmp_path / "old.db"
    load_rev0001(old)
    with pytest.raises(DatabaseError, match=f"revision 0001, not {migrations.head_revision()}: run `autogen db upgrade`"):
        TuningDB(old, upgrade=False)
    TuningDB(old).close()
    with TuningDB(old, upgrade=False) as database:
        assert len(database.winners()) == 2


# -- migrations -----------------------------------------------------------------------------------


def test_head_revision_constant_is_the_newest_script():
    # HEAD_REVISION spares an open of an up-to-date database Alembic's import; a new migration
    # script must move it.
    assert migrations.HEAD_REVISION == migrations.script_head_revision()
    assert migrations.HEAD_REVISION in migrations.known_revisions()


def test_opening_a_database_at_head_does_not_import_alembic(tmp_path: Path):
    path = tmp_path / "head.db"
    upgrade(path)
    code = ("import sys; from tuning_db import TuningDB; db = TuningDB(sys.argv[1]); db.winners(); "
            "assert not any(m == 'alembic' or m.startswith('alembic.') for m in sys.modules), "
            "sorted(m for m in sys.modules if m.startswith('alembic'))")
    done = subprocess.run([sys.executable, "-c", code, f"sqlite:///{path}"], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent.parent.parent)
    assert done.returncode == 0, done.stderr


def test_migrations_from_empty_to_head(tmp_path: Path):
    path = tmp_path / "fresh.db"
    assert current_revision(path) is None
    assert not path.exists(), "asking for the revision must not create the database"
    assert upgrade(path) == migrations.head_revision() == "0006_trial_counts"
    assert current_revision(path) == "0006_trial_counts"
    assert upgrade(path) == "0006_trial_counts"  # idempotent
    with sqlite3.connect(path) as connection:
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master")}
    assert {table.name for table in Base.metadata.sorted_tables} <= tables
    assert migrations.VERSION_TABLE in tables and "alembic_version" not in tables


def _migrated_by_the_scripts(path: Path) -> None:
    """Head reached by running every migration script (a new database is created from the models)."""
    engine = sa.create_engine(f"sqlite:///{path}")
    try:
        with engine.begin() as connection:
            migrations.upgrade_to(connection)
    finally:
        engine.dispose()


def test_models_match_the_head_migration(tmp_path: Path):
    path = tmp_path / "head.db"
    _migrated_by_the_scripts(path)
    engine = sa.create_engine(f"sqlite:///{path}")
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection,
                opts={"version_table": migrations.VERSION_TABLE, "compare_server_default": True},
            )
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()


def _sqlite_schema(path: Path) -> dict[str, str]:
    with sqlite3.connect(path) as connection:
        rows = connection.execute("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL")
        return {name: " ".join(sql.split()) for name, sql in rows}


def _table_parts(sql: str) -> tuple[str, list[str], frozenset[str]]:
    """A CREATE TABLE's name, its column definitions in order, and its constraints (any order)."""
    head, _, body = sql.partition("(")
    parts, depth, current = [], 0, ""
    for char in body.rsplit(")", 1)[0]:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    parts.append(current.strip())
    constraints = frozenset(part for part in parts if part.startswith("CONSTRAINT"))
    return head.replace('"', "").strip(), [part for part in parts if part not in constraints], constraints


def test_a_new_database_is_created_as_the_scripts_migrate_one(tmp_path: Path):
    # A new database is created from the models and stamped at head (no Alembic import, no run of
    # every script); it must be the same database the scripts make: same columns in the same
    # order, same named constraints (later batch migrations find them by name), same stamp.
    created, migrated = tmp_path / "created.db", tmp_path / "migrated.db"
    code = ("import sys; from tuning_db import TuningDB; TuningDB(sys.argv[1]).close(); "
            "assert not any(m == 'alembic' or m.startswith('alembic.') for m in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, f"sqlite:///{created}"], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent.parent.parent)
    assert done.returncode == 0, done.stderr
    _migrated_by_the_scripts(migrated)
    made, expected = _sqlite_schema(created), _sqlite_schema(migrated)
    assert made.keys() == expected.keys()
    for name in expected:
        assert _table_parts(made[name]) == _table_parts(expected[name]), name
    engine = sa.create_engine(f"sqlite:///{created}")
    try:
        with engine.connect() as connection:
            assert MigrationContext.configure(
                connection, opts={"version_table": migrations.VERSION_TABLE}).get_current_revision() \
                == migrations.head_revision()
    finally:
        engine.dispose()


def test_rev0001_asset_is_what_migration_0001_creates(tmp_path: Path):
    migrated = tmp_path / "migrated.db"
    engine = sa.create_engine(f"sqlite:///{migrated}")
    try:
        with engine.begin() as connection:
            migrations.upgrade_to(connection, "0001")
    finally:
        engine.dispose()
    loaded = tmp_path / "loaded.db"
    load_rev0001(loaded)
    assert _sqlite_schema(loaded) == _sqlite_schema(migrated)
    assert "cache_mode" not in _sqlite_schema(loaded)["autogen_trials"]


def test_upgrading_a_rev0001_database_keeps_its_rows(tmp_path: Path):
    path = tmp_path / "old.db"
    load_rev0001(path)
    assert current_revision(path) == "0001"

    with TuningDB(path) as database:
        assert current_revision(path) == migrations.head_revision()
        h100 = dataclasses.replace(H100, driver_version=12040, runtime_version=12040)
        trials = database.trials(h100, "gemv", "float32", SHAPE)
        names = [t.kernel_name for t in trials]
        assert names == ["gemv_bm64_tn4", "gemv_bm128_tn8", "gemv_bm256_tn16"]
        assert all(t.cache_mode == "cold" and t.spread_us is None for t in trials)
        assert trials[1].params == {"bm": 128, "tn": 8}
        assert trials[1].samples_us == (18.2, 18.25, 18.4)
        assert trials[2].status == "failed" and trials[2].reason.startswith("too many resources")

        winner = database.winner(h100, "gemv", "float32", SHAPE)
        assert winner.trial == trials[1]
        assert winner.device == dataclasses.replace(h100, nvrtc_version="12.4")
        assert (winner.peer_name, winner.margin) == ("cuBLAS sgemv", 0.151)
        assert [w.device.name for w in database.winners()] == [A100.name, H100.name]

        # What revision 0002 adds works on the migrated database.
        hot = database.record_trial(H100, make_trial("gemv_bm128_tn8", 15.0, cache_mode="hot"))
        assert len(database.trials(H100, "gemv", "float32", SHAPE)) == 4
        database.set_winner(H100, hot)
        v = ValidationRecord("gemv", "float32", "m=8192,n=16", "gemv_bm128_tn8", "b2b2", True)
        assert database.validation(H100, "gemv", "float32", "m=8192,n=16", "b2b2") is None
        assert database.record_validation(H100, v).passed
    with sqlite3.connect(path) as connection:
        assert connection.execute("PRAGMA foreign_key_check").fetchall() == []
    assert sqlite_count(path, "autogen_gpus") == 2


def test_downgrade_to_0001_and_upgrade_again(tmp_path: Path):
    path = tmp_path / "round.db"
    with TuningDB(path) as database:
        database.record_trial(H100, make_trial("gemv_a", cache_mode="cold"))
        hot = database.record_trial(H100, make_trial("gemv_a", cache_mode="hot"))
        database.set_winner(H100, hot)
    engine = sa.create_engine(f"sqlite:///{path}")
    try:
        with engine.begin() as connection:
            migrations.downgrade_to(connection, "0001")
    finally:
        engine.dispose()
    assert current_revision(path) == "0001"
    assert sqlite_count(path, "autogen_trials") == 1  # the hot trial had no place in 0001
    assert sqlite_count(path, "autogen_winners") == 0
    with TuningDB(path) as database:
        assert [t.cache_mode for t in database.trials(H100, "gemv", "float32", SHAPE)] == ["cold"]


def test_database_from_a_newer_autogen_is_refused(tmp_path: Path):
    path = tmp_path / "newer.db"
    upgrade(path)
    with sqlite3.connect(path) as connection:
        connection.execute(f"UPDATE {migrations.VERSION_TABLE} SET version_num = '0099'")
    with pytest.raises(DatabaseError, match="0099.*newer autogen"):
        TuningDB(path)
    assert current_revision(path) == "0099"


def test_shared_database_keeps_other_tools_tables(tmp_path: Path):
    path = tmp_path / "shared.db"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE studies (study_id INTEGER PRIMARY KEY, name TEXT)")
        connection.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)")
        connection.execute("INSERT INTO studies VALUES (1, 'optuna study')")
        connection.execute("INSERT INTO alembic_version VALUES ('v3.0.0.d')")
    # Sharing another tool's database is done on purpose (`autogen db upgrade`), never implicitly.
    with pytest.raises(CorruptDatabaseError, match="another application's table"):
        TuningDB(path)
    upgrade(path)
    with TuningDB(path) as database:
        database.record_trial(H100, make_trial())
    with sqlite3.connect(path) as connection:
        assert connection.execute("SELECT * FROM studies").fetchall() == [(1, "optuna study")]
        assert connection.execute("SELECT * FROM alembic_version").fetchall() == [("v3.0.0.d",)]


# -- corrupted and foreign files ------------------------------------------------------------------


def _random_bytes(path: Path) -> None:
    path.write_bytes(os.urandom(8192))


def _text_file(path: Path) -> None:
    path.write_text("m=16384,n=16 gemv_bm64_tn4 21.5us\nthis is my notes file, not a database\n")


def _sqlite_header_then_garbage(path: Path) -> None:
    # A plausible page size (4096) and rollback-journal format bytes, then garbage: random
    # format bytes could announce WAL, and SQLite would create -wal/-shm files beside it.
    garbage = random.Random(1).randbytes(8192 - 20)
    path.write_bytes(b"SQLite format 3\x00" + b"\x10\x00\x01\x01" + garbage)


def _other_programs_autogen_table(path: Path) -> None:
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE autogen_trials (id INTEGER PRIMARY KEY, note TEXT)")
        connection.execute("INSERT INTO autogen_trials VALUES (1, 'not autogen''s')")


def _autogen_version_but_wrong_tables(path: Path) -> None:
    with sqlite3.connect(path) as connection:
        connection.execute(f"CREATE TABLE {migrations.VERSION_TABLE} (version_num VARCHAR(32))")
        connection.execute(
            f"INSERT INTO {migrations.VERSION_TABLE} VALUES ('{migrations.head_revision()}')")
        connection.execute("CREATE TABLE autogen_trials (id INTEGER PRIMARY KEY, note TEXT)")


@pytest.mark.parametrize(
    "spoil, complaint",
    [
        (_random_bytes, "not a SQLite file"),
        (_text_file, "not a SQLite file"),
        (_sqlite_header_then_garbage, "SQLite cannot read it"),
        (_other_programs_autogen_table, "autogen_trials but no schema revision"),
        (_autogen_version_but_wrong_tables, "lacks table autogen_gpus"),
    ],
)
@pytest.mark.parametrize("open_it", [TuningDB, upgrade, current_revision], ids=lambda f: f.__name__)
def test_unusable_file_is_refused_and_left_untouched(tmp_path: Path, spoil, complaint, open_it):
    path = tmp_path / "tuning.db"
    spoil(path)
    before = path.read_bytes()
    with pytest.raises(CorruptDatabaseError) as caught:
        open_it(path)
    message = str(caught.value)
    assert str(path) in message and complaint in message
    assert "not an autogen tuning database" in message
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tuning.db"]  # no -wal or -shm either


# -- several processes at once --------------------------------------------------------------------

WORKERS = 6
ROUNDS = 30
SHAPES = ("m=1024,n=16", "m=4096,n=16", "m=16384,n=16")
KERNELS = ("gemv_a", "gemv_b", "gemv_c", "gemv_d", "gemv_broken")


def _hammer(url: str, worker: int, barrier, results) -> None:
    """One process: record trials and set winners for keys the other processes also write."""
    try:
        barrier.wait()
        written = []
        with TuningDB(url) as database:  # all open the brand-new database at the same moment
            for step in range(ROUNDS):
                kernel = KERNELS[(step + worker) % len(KERNELS)]
                trial = make_trial(
                    kernel,
                    time_us=worker * 1000.0 + step + 1.0,  # a stored time is positive
                    shape_key=SHAPES[step % len(SHAPES)],
                    cache_mode=("cold", "hot")[(step // len(SHAPES)) % 2],
                    **({"status": "failed", "reason": "broken"} if kernel == "gemv_broken" else {}),
                )
                stored = database.record_trial(H100, trial)
                written.append((trial.shape_key, kernel, trial.cache_mode, trial.time_us))
                if stored.status == "ok":
                    database.set_winner(H100, stored, autogen_version=f"worker{worker}")
                else:
                    try:
                        database.set_winner(H100, stored)
                        raise AssertionError("a failed trial was accepted as winner")
                    except ValueError:
                        pass
        results.put((worker, written, None))
    except BaseException:  # reported to the parent, which fails the test
        results.put((worker, [], traceback.format_exc()))


def run_hammers(url: str) -> list:
    """Start WORKERS writer processes on `url` at once; their reports once all have finished."""
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(WORKERS), context.Queue()
    processes = [
        context.Process(target=_hammer, args=(url, worker, barrier, results))
        for worker in range(WORKERS)
    ]
    for process in processes:
        process.start()
    reports = [results.get(timeout=240) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    assert [error for _, _, error in reports if error] == []
    assert all(process.exitcode == 0 for process in processes)
    return reports


def test_concurrent_processes_lose_and_duplicate_nothing(tmp_path: Path):
    path = tmp_path / "shared" / "tuning.db"
    url = f"sqlite:///{path}"
    reports = run_hammers(url)

    times_by_key: dict[tuple, set[float]] = {}
    for _, written, _ in reports:
        assert len(written) == ROUNDS
        for shape, kernel, cache_mode, time_us in written:
            times_by_key.setdefault((shape, kernel, cache_mode), set()).add(time_us)

    with sqlite3.connect(path) as connection:
        rows = connection.execute(
            "SELECT shape_key, kernel_name, cache_mode, time_us, status FROM autogen_trials"
        ).fetchall()
        assert connection.execute("SELECT count(*) FROM autogen_gpus").fetchone()[0] == 1
        assert connection.execute("PRAGMA foreign_key_check").fetchall() == []
    stored_keys = [(shape, kernel, mode) for shape, kernel, mode, _, _ in rows]
    assert sorted(stored_keys) == sorted(times_by_key)  # every key once: none lost or doubled
    for shape, kernel, mode, time_us, status in rows:
        if status == "ok":
            assert time_us in times_by_key[(shape, kernel, mode)]

    with TuningDB(url) as database:
        winners = database.winners()  # one per shape and cache mode
        assert sorted((w.trial.shape_key, w.trial.cache_mode) for w in winners) == sorted(
            (shape, mode) for shape in SHAPES for mode in ("cold", "hot"))
        for winner in winners:
            stored = database.find_trial(
                H100, "gemv", "float32", winner.trial.shape_key, winner.trial.kernel_name,
                winner.trial.cache_mode,
            )
            assert stored == winner.trial and stored.status == "ok"
            assert winner.autogen_version.startswith("worker")


def _locked_by(pid: int, path: Path) -> bool:
    """Whether process ``pid`` holds a POSIX lock on ``path`` (Linux's /proc/locks)."""
    inode = path.stat().st_ino
    return any(f":{inode} " in line and line.split()[4] == str(pid) for line in open("/proc/locks"))


@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="reads the kernel's lock table (Linux)")
def test_a_second_tuningdb_on_an_open_file_keeps_the_first_one_s_locks(tmp_path):
    # SQLite's locks are POSIX locks, which the kernel drops for the whole process when any file
    # descriptor of the file is closed. A second TuningDB on the same file (one per problem of a
    # multi-GPU run) checked it with a plain open() and close(): this process then held no lock,
    # and another process closing its last connection deleted the WAL under this one's
    # connections (their next read: SQLITE_IOERR_SHORT_READ).
    path = tmp_path / "shared.db"
    url = f"sqlite:///{path}"
    first = TuningDB(url)
    first.winners()
    assert _locked_by(os.getpid(), path)
    second = TuningDB(url)
    second.winners()
    assert _locked_by(os.getpid(), path)
    code = f"from tuning_db import TuningDB; TuningDB({url!r}).winners()"
    subprocess.run([sys.executable, "-c", code], check=True, env=checkout_env())
    assert path.with_name("shared.db-wal").exists()  # the other process was not the last one
    assert first.winners() == [] and second.winners() == []


def test_writers_of_one_process_queue_for_a_sqlite_file_on_one_lock(tmp_path):
    # Two TuningDBs of one file (a multi-GPU run has one per problem) queue on this process's
    # lock of the file, which wakes the next writer when released (SQLite's busy handler
    # sleeps up to 100 ms between tries); other databases queue on nothing of autogen's.
    import threading

    from tuning_db import engine

    path = tmp_path / "t.db"
    first, second = TuningDB(path), TuningDB(f"sqlite:///{path}")
    entered = threading.Event()
    order: list[str] = []

    def write_second() -> None:
        entered.set()
        second.record_trial(H100, make_trial("gemv_b"))
        order.append("second")

    with engine.write_queue(first.url):
        thread = threading.Thread(target=write_second)
        thread.start()
        entered.wait(10)
        order.append("first")  # the second writer waits for the queue, not SQLite's lock
    thread.join(30)
    assert order == ["first", "second"]
    first.record_trial(H100, make_trial("gemv_a"))
    assert sorted(t.kernel_name for t in first.trials(H100, "gemv", "float32", SHAPE)) == ["gemv_a", "gemv_b"]
    with engine.write_queue("postgresql+psycopg://u@h/db"):
        pass  # not a file: nothing to queue on
    first.close(), second.close()
