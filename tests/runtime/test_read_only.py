"""Issue 16, points 3 and 4: commands that only read never write, and the dispatcher works where
it cannot cache.

`list`, `show`, `export` and the dispatcher's reads open the database read-only: a missing file
or folder is not created, a WAL file gets no -wal/-shm beside it, a rollback-journal file is not
switched to WAL, older schemas are read as they are (else the message says `autogen db upgrade`),
and another application's database is refused and left byte-identical.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import types
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from dbfixtures import H100, store_winner
from tuning_db import CorruptDatabaseError, DatabaseError, TuningDB, current_revision, migrations, upgrade

from autogen.gpu import compile as compile_module
from autogen import notes
from autogen.catalog import pretuned
from autogen.cli.main import main
from autogen.runtime.dispatch import Dispatcher
from autogen.core.registry import get_family

SGEMV = get_family("sgemv")
ASSET_0001 = Path(__file__).parent.parent / "assets" / "tuning_db_rev0001.sql"
SERVER = os.environ.get("AUTOGEN_TEST_POSTGRES_URL")


@pytest.fixture(autouse=True)
def _fresh_notes_and_catalog(monkeypatch):
    monkeypatch.setenv("AUTOGEN_NO_PRETUNED", "1")
    notes.forget()
    pretuned.pretuned_db.cache_clear()
    yield
    pretuned.pretuned_db.cache_clear()
    notes.forget()


def snapshot(folder: Path) -> dict:
    """Every file under ``folder`` with its bytes and modification time."""
    return {p.relative_to(folder): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def tuned_db(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with TuningDB(path) as db:
        store_winner(db, H100, 16384, 16, time_us=1.9)
        store_winner(db, H100, 1024, 1024, time_us=4.0)
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name], "closed: no -wal left"
    return path


def read_everything(db: Path, out: Path, capsys) -> dict:
    """Run every read-only entry point on ``db``; their exit codes and outputs."""
    results = {"list": main(["list", "--db", str(db), "--json"])}
    results["list_out"] = capsys.readouterr().out
    results["show"] = main(["show", "sgemv", "--m", "16384", "--n", "16", "--db", str(db), "--gpu", H100.name])
    results["export"] = main(["export", "sgemv", "--out", str(out), "--gpu", H100.name, "--db", str(db)])
    results["err"] = capsys.readouterr().err
    results["revision"] = current_revision(db)
    dispatcher = Dispatcher(f"sqlite:///{db}")
    results["chain"] = [step for step, _ in dispatcher._candidates(SGEMV, SGEMV.problem(m=4096, n=16), H100, False)]
    return results


def test_reading_a_missing_database_creates_no_file_or_folder(tmp_path, capsys):
    db = tmp_path / "nowhere" / "deeper" / "tuning.db"
    assert main(["list", "--db", str(db)]) == 0
    assert "nothing tuned yet" in capsys.readouterr().err
    assert main(["show", "sgemv", "--m", "4", "--n", "4", "--db", str(db), "--gpu", H100.name]) == 1
    assert main(["export", "sgemv", "--out", str(tmp_path / "out"), "--gpu", H100.name, "--db", str(db)]) == 1
    assert "Traceback" not in capsys.readouterr().err
    assert current_revision(db) is None
    assert TuningDB(db, readonly=True).winners() == []
    chain = [s for s, _ in Dispatcher(f"sqlite:///{db}")._candidates(SGEMV, SGEMV.problem(m=4, n=4), H100, False)]
    assert chain == ["default"]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_reads_leave_a_wal_database_byte_identical(tmp_path, capsys):
    db = tuned_db(tmp_path / "data" / "tuning.db")
    assert migrations.is_wal_file(db)
    before = snapshot(db.parent)
    results = read_everything(db, tmp_path / "out", capsys)
    assert (results["list"], results["show"], results["export"]) == (0, 0, 0), results["err"]
    assert len(json.loads(results["list_out"])) == 2
    assert results["revision"] == migrations.head_revision()
    assert results["chain"][0] == "nearest"
    assert snapshot(db.parent) == before  # no -wal, no -shm, not a byte changed


def test_a_rollback_journal_database_is_not_switched_to_wal(tmp_path, capsys):
    db = tuned_db(tmp_path / "data" / "tuning.db")
    with sqlite3.connect(db) as connection:
        assert connection.execute("PRAGMA journal_mode=DELETE").fetchone() == ("delete",)
    before = snapshot(db.parent)
    results = read_everything(db, tmp_path / "out", capsys)
    assert (results["list"], results["show"], results["export"]) == (0, 0, 0), results["err"]
    assert not migrations.is_wal_file(db) and snapshot(db.parent) == before


def _rev0001(path: Path) -> None:
    with sqlite3.connect(path) as connection:
        connection.executescript(ASSET_0001.read_text())


def _rev0002(path: Path) -> None:
    with TuningDB(path) as db:
        store_winner(db, H100, 16384, 16, time_us=1.9)
    engine = sa.create_engine(f"sqlite:///{path}")
    try:
        with engine.begin() as connection:
            migrations.downgrade_to(connection, "0002")
    finally:
        engine.dispose()


@pytest.mark.parametrize("make, revision, gpus", [(_rev0001, "0001", 2), (_rev0002, "0002", 1)],
                         ids=["rev0001", "rev0002"])
def test_an_older_schema_is_read_without_migrating(tmp_path, capsys, make, revision, gpus):
    db = tmp_path / "data" / "old.db"
    db.parent.mkdir()
    make(db)
    before = snapshot(db.parent)
    assert main(["list", "--db", str(db), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len({row["gpu"] for row in rows}) == gpus and all(row["cache"] == "cold" for row in rows)
    with TuningDB(db, readonly=True) as read:
        assert read.validation(H100, "sgemv", "float32", "m=1,n=1", "x") is None
        assert len(read.winners()) == len(rows)
    assert current_revision(db) == revision
    assert snapshot(db.parent) == before


def test_an_unreadable_older_schema_names_autogen_db_upgrade(tmp_path, capsys):
    db = tmp_path / "old.db"
    _rev0001(db)
    with sqlite3.connect(db) as connection:
        connection.execute("ALTER TABLE autogen_winners DROP COLUMN peer_name")
    before = db.read_bytes()
    assert main(["list", "--db", str(db)]) == 1
    err = capsys.readouterr().err
    assert "autogen db upgrade" in err and "autogen_winners.peer_name" in err and "Traceback" not in err
    assert db.read_bytes() == before


def test_a_read_only_instance_refuses_to_write(tmp_path):
    db = tuned_db(tmp_path / "tuning.db")
    with TuningDB(db, readonly=True) as read:
        winner = read.winner(H100, "sgemv", "float32", "m=16384,n=16")
        with pytest.raises(DatabaseError, match="read-only"):
            read.set_winner(H100, winner.trial)


# -- folders that cannot be written ---------------------------------------------------------------


def make_read_only(folder: Path):
    """Make ``folder`` unwritable, even for root (chattr +i where chmod is not enough); returns
    how to undo it, or None when neither works here."""
    folder.chmod(0o555)
    undo = [lambda: folder.chmod(0o755)]
    if _writable(folder) and subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0:
        undo.insert(0, lambda: subprocess.run(["chattr", "-i", str(folder)], check=True))
    if _writable(folder):
        for step in undo:
            step()
        return None
    return lambda: [step() for step in undo]


def _writable(folder: Path) -> bool:
    probe = folder / f".probe-{uuid.uuid4().hex}"
    try:
        probe.touch()
    except OSError:
        return False
    probe.unlink()
    return True


def test_a_database_in_a_read_only_folder_is_readable(tmp_path, capsys):
    db = tuned_db(tmp_path / "locked" / "tuning.db")
    before = snapshot(db.parent)
    undo = make_read_only(db.parent)
    if undo is None:
        pytest.skip("cannot make a folder unwritable here (root without chattr +i); the same reads "
                    "are checked for writes by test_reads_leave_a_wal_database_byte_identical")
    try:
        results = read_everything(db, tmp_path / "out", capsys)
    finally:
        undo()
    assert (results["list"], results["show"], results["export"]) == (0, 0, 0), results["err"]
    assert len(json.loads(results["list_out"])) == 2 and results["chain"][0] == "nearest"
    assert snapshot(db.parent) == before


def test_rows_still_in_the_wal_are_read_where_no_shm_can_be_made(tmp_path, capsys):
    # Issue 34.9: a WAL database whose newest rows are still in its -wal, with no -shm, in a
    # folder that cannot be written (copied off a machine whose writer had not checkpointed).
    # Opened immutable, it read as of its last checkpoint with no word; now the -wal is read.
    source = tuned_db(tmp_path / "source" / "tuning.db")
    keep_open = sqlite3.connect(source)  # the -wal stays while a connection is open
    try:
        keep_open.execute("SELECT count(*) FROM autogen_winners").fetchone()
        with TuningDB(source) as db:
            store_winner(db, H100, 4096, 16, time_us=3.0)
        assert (source.parent / "tuning.db-wal").stat().st_size > 0
        copied = tmp_path / "copied" / "tuning.db"
        copied.parent.mkdir()
        for suffix in ("", "-wal"):  # as they are: the new winner is in the -wal only
            copied.with_name(copied.name + suffix).write_bytes(source.with_name(source.name + suffix).read_bytes())
    finally:
        keep_open.close()
    before = snapshot(copied.parent)
    undo = make_read_only(copied.parent)
    if undo is None:
        pytest.skip("cannot make a folder unwritable here (root without chattr +i)")
    try:
        assert main(["list", "--db", str(copied), "--json"]) == 0
        captured = capsys.readouterr()
        with TuningDB(copied, readonly=True) as db:
            shapes = sorted(w.trial.shape_key for w in db.winners())
    finally:
        undo()
    assert sorted(row["shape"] for row in json.loads(captured.out)) == shapes == [
        "m=1024,n=1024", "m=16384,n=16", "m=4096,n=16"], captured.err
    assert snapshot(copied.parent) == before  # still no -shm, not a byte changed


# -- another application's database ---------------------------------------------------------------


def _other_application(path: Path) -> None:
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        connection.execute("INSERT INTO customers VALUES (1, 'ACME')")


@pytest.mark.parametrize("open_it", [
    lambda db: TuningDB(db),
    lambda db: TuningDB(db, readonly=True),
    lambda db: TuningDB(db, upgrade=False, create=True),
    lambda db: Dispatcher(f"sqlite:///{db}").databases(),
], ids=["TuningDB", "readonly", "create", "dispatcher"])
def test_another_applications_sqlite_file_is_refused_by_the_api(tmp_path, open_it):
    db = tmp_path / "app.db"
    _other_application(db)
    before = snapshot(tmp_path)
    with pytest.raises(CorruptDatabaseError, match="another application's table.*customers.*autogen db upgrade"):
        open_it(db)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("command", [
    ["list"], ["show", "sgemv", "--m", "4", "--n", "4", "--gpu", H100.name],
    ["export", "sgemv", "--out", "OUT", "--gpu", H100.name],
], ids=["list", "show", "export"])
def test_another_applications_sqlite_file_is_refused_by_the_commands(tmp_path, capsys, command):
    db = tmp_path / "app.db"
    _other_application(db)
    before = snapshot(tmp_path)
    args = [str(tmp_path / "out") if part == "OUT" else part for part in command]
    code = main([*args, "--db", str(db)])
    err = capsys.readouterr().err
    assert code == 1 and "not an autogen tuning database" in err and "Traceback" not in err
    assert snapshot(tmp_path) == before


def test_autogen_db_upgrade_shares_another_applications_database_on_purpose(tmp_path):
    db = tmp_path / "app.db"
    _other_application(db)
    assert upgrade(db) == migrations.head_revision()
    with TuningDB(db) as shared:
        store_winner(shared, H100, 64, 64)
    with sqlite3.connect(db) as connection:
        assert connection.execute("SELECT * FROM customers").fetchall() == [(1, "ACME")]


@pytest.mark.skipif(not SERVER, reason="AUTOGEN_TEST_POSTGRES_URL is not set")
def test_another_applications_postgresql_database_is_refused(capsys):
    name = "autogen_test_" + uuid.uuid4().hex[:12]
    admin = sa.create_engine(SERVER, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = SERVER.rsplit("/", 1)[0] + "/" + name
    engine = sa.create_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(sa.text("CREATE TABLE customers (id integer primary key, name text)"))

        def tables():
            with engine.connect() as connection:
                return sorted(sa.inspect(connection).get_table_names())

        with pytest.raises(CorruptDatabaseError, match="another application's table"):
            TuningDB(url)
        assert main(["list", "--db", url]) == 1
        assert "another application's table" in capsys.readouterr().err
        assert tables() == ["customers"]
        with engine.begin() as connection:  # an empty database is read as empty, not created
            connection.execute(sa.text("DROP TABLE customers"))
        assert main(["list", "--db", url]) == 0 and tables() == []
    finally:
        engine.dispose()
        with admin.connect() as connection:
            connection.execute(sa.text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()


# -- point 4: the dispatcher without a writable cache folder --------------------------------------


@pytest.fixture
def unwritable_cache(tmp_path, monkeypatch):
    """Every cache location under a regular file: no one, root included, can create it."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should go\n")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker / "cache"))
    monkeypatch.setenv("AUTOGEN_CACHE_DIR", str(blocker / "kernels"))
    monkeypatch.setenv("AUTOGEN_DB", str(blocker / "cache" / "autogen" / "tuning.db"))
    monkeypatch.delenv("AUTOGEN_NO_PRETUNED", raising=False)
    return blocker


def test_dispatcher_serves_the_shipped_catalog_without_a_cache_folder(unwritable_cache, capsys):
    dispatcher = Dispatcher()
    chain = [(step, w.trial.shape_key if w else None)
             for step, w in dispatcher._candidates(SGEMV, SGEMV.problem(m=16384, n=16), H100, False)]
    assert chain[0] == ("exact", "m=16384,n=16")
    untuned = [step for step, _ in dispatcher._candidates(SGEMV, SGEMV.problem(m=5000, n=20), H100, False)]
    assert untuned[0] == "nearest" and untuned[-1] == "default"
    assert pretuned.pretuned_db() is dispatcher.databases()[1]  # loaded once
    # The catalog is read from its JSON: it needs no cache folder at all, so nothing to say.
    assert "pre-tuned catalog" not in capsys.readouterr().err
    assert unwritable_cache.is_file()


def test_dispatcher_serves_the_catalog_from_a_read_only_cache_folder(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    (cache / "autogen").mkdir(parents=True)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.delenv("AUTOGEN_NO_PRETUNED", raising=False)
    undo = make_read_only(cache / "autogen")
    if undo is None:
        pytest.skip("cannot make a folder unwritable here (root without chattr +i)")
    try:
        shipped = pretuned.pretuned_db()
        assert len(shipped.winners(gpu_name=H100.name)) >= 1
    finally:
        undo()
    assert "pre-tuned catalog" not in capsys.readouterr().err  # read from its JSON: no cache needed
    assert list((cache / "autogen").iterdir()) == []
    assert list((cache / "autogen").iterdir()) == []


def test_compiled_kernels_are_kept_in_memory_when_the_cache_cannot_be_written(unwritable_cache, monkeypatch,
                                                                              capsys):
    compiled = []
    monkeypatch.setattr(compile_module, "_nvrtc", lambda: types.SimpleNamespace())
    monkeypatch.setattr(compile_module, "nvrtc_version", lambda: "13.0")
    monkeypatch.setattr(compile_module, "_nvrtc_compile",
                        lambda nvrtc, source, options: compiled.append(source) or b"CUBIN " + source.encode())
    monkeypatch.setattr(compile_module, "_IN_MEMORY", {})
    assert compile_module.compile_cubin("kernel a", "sm_90") == b"CUBIN kernel a"
    assert compile_module.compile_cubin("kernel a", "sm_90") == b"CUBIN kernel a"
    assert compile_module.compile_cubin("kernel b", "sm_90") == b"CUBIN kernel b"
    assert compiled == ["kernel a", "kernel b"]  # the second call came from memory
    err = capsys.readouterr().err
    assert err.count("autogen: note:") == 1 and "kernel cache" in err and "in memory" in err


def test_validations_the_database_cannot_take_are_kept_in_memory(tmp_path, monkeypatch, capsys):
    import autogen.runtime.dispatch as dispatch
    import autogen.gpu.measure

    db = tmp_path / "old.db"
    _rev0001(db)  # an older schema: the dispatcher does not migrate it to store a validation
    before = db.read_bytes()
    fake_cupy = types.SimpleNamespace(
        cuda=types.SimpleNamespace(get_current_stream=lambda: types.SimpleNamespace(synchronize=lambda: None)),
        random=types.SimpleNamespace(default_rng=lambda seed: None))
    monkeypatch.setattr(dispatch, "_CUPY", fake_cupy)
    checks = []
    monkeypatch.setattr(dispatch, "validate", lambda *args: checks.append(1) or types.SimpleNamespace(
        ok=True, error=1e-7, reason=""))
    dispatcher = Dispatcher(f"sqlite:///{db}")
    kernel = types.SimpleNamespace(name="k", provenance={"source_hash": "h"}, launch=lambda inputs: None)
    problem = SGEMV.problem(m=64, n=64)
    for _ in range(3):
        assert dispatcher._validated(SGEMV, problem, SGEMV.default_config(), kernel, H100)
    assert checks == [1]
    err = capsys.readouterr().err
    assert err.count("autogen: note:") == 1 and "autogen db upgrade" in err and "kept in memory" in err
    assert db.read_bytes() == before and current_revision(db) == "0001"
