"""Issue 16, point 2: one malformed row never gives a traceback.

Each kind of bad row is written into an otherwise good database with plain SQL; `list` and
`show` report it and go on, `export` names it and refuses, and the dispatcher skips it and falls
back to the next candidate, so an untuned shape whose nearest neighbour is the bad row is served.
"""

from __future__ import annotations

import json
import sqlite3

import pytest

from dbfixtures import H100, store_winner
from tuning_db import InvalidRowError, TuningDB

from autogen.catalog import pretuned
from autogen.cli.main import main
from autogen.runtime.dispatch import Dispatcher, TunedKernel
from autogen.core.registry import get_family

SGEMV = get_family("sgemv")
BAD_SHAPE = "m=8192,n=16"  # the nearest tuned shape to m=6000,n=16
GOOD_SHAPES = ("m=16384,n=16", "m=1024,n=1024")


def _trial_of_bad_winner(column: str, value, winners_too: bool = False):
    def spoil(connection: sqlite3.Connection) -> None:
        tables = ("autogen_trials", "autogen_winners") if winners_too else ("autogen_trials",)
        for table in tables:
            connection.execute(f"UPDATE {table} SET {column} = ? WHERE shape_key = ?", (value, BAD_SHAPE))
    return spoil


def _missing_trial(connection: sqlite3.Connection) -> None:
    connection.execute("PRAGMA foreign_keys=OFF")
    connection.execute("UPDATE autogen_winners SET trial_id = 9999 WHERE shape_key = ?", (BAD_SHAPE,))


# (what is wrong, how the row is spoiled, a fragment of the reason given)
MALFORMED = [
    ("params_not_json", _trial_of_bad_winner("params", "{threads_per_row: 4"), "params are not JSON"),
    ("params_not_a_mapping", _trial_of_bad_winner("params", "[4, 4, 4]"), "params are not a mapping"),
    ("params_json_null", _trial_of_bad_winner("params", "null"), "params are not a mapping"),
    ("time_as_text", _trial_of_bad_winner("time_us", "fast"), "time_us='fast' is not a positive time"),
    ("time_not_positive", _trial_of_bad_winner("time_us", 0.0), "time_us=0.0 is not a positive time"),
    ("samples_not_json", _trial_of_bad_winner("samples_us", "1.0, 2.0]"), "samples_us are not JSON"),
    ("shape_key_malformed", _trial_of_bad_winner("shape_key", "m=8192;n=16", winners_too=True), "bad shape key"),
    ("cache_mode_unknown", _trial_of_bad_winner("cache_mode", "warm", winners_too=True), "cache_mode='warm'"),
    ("winner_of_a_failed_trial", _trial_of_bad_winner("status", "failed"), "has status 'failed'"),
    ("winner_without_its_trial", _missing_trial, "is missing"),
    ("peer_time_as_text", lambda c: c.execute(
        "UPDATE autogen_winners SET peer_time_us = 'n/a' WHERE shape_key = ?", (BAD_SHAPE,)), "peer_time_us='n/a'"),
]
IDS = [kind for kind, _, _ in MALFORMED]


@pytest.fixture(autouse=True)
def _no_catalog(monkeypatch):
    monkeypatch.setenv("AUTOGEN_NO_PRETUNED", "1")
    pretuned.pretuned_db.cache_clear()
    yield
    pretuned.pretuned_db.cache_clear()


def spoiled_db(tmp_path, spoil) -> str:
    path = tmp_path / "tuning.db"
    with TuningDB(path) as db:
        for key in (*GOOD_SHAPES, BAD_SHAPE):
            m, n = (int(part.split("=")[1]) for part in key.split(","))
            store_winner(db, H100, m, n, time_us=2.0 + m / 1e4)
    with sqlite3.connect(path) as connection:
        spoil(connection)
    return str(path)


@pytest.mark.parametrize("kind, spoil, reason", MALFORMED, ids=IDS)
def test_repository_reports_the_row_and_keeps_the_others(tmp_path, kind, spoil, reason):
    with TuningDB(spoiled_db(tmp_path, spoil), readonly=True) as db:
        winners, invalid = db.winners_checked()
        assert sorted(w.trial.shape_key for w in winners) == sorted(GOOD_SHAPES)
        assert len(invalid) == 1 and invalid[0].table == "autogen_winners"
        assert reason in invalid[0].reason and isinstance(invalid[0].row_id, int)
        assert invalid[0].gpu == H100.name and invalid[0].family == "sgemv"
        assert db.winners() == winners
        with pytest.raises(InvalidRowError, match="autogen_winners row"):
            db.winner(H100, "sgemv", "float32", invalid[0].shape_key)


@pytest.mark.parametrize("kind, spoil, reason", MALFORMED, ids=IDS)
def test_list_and_show_report_the_row_and_go_on(tmp_path, capsys, kind, spoil, reason):
    db = spoiled_db(tmp_path, spoil)
    assert main(["list", "--db", db, "--json"]) == 0
    captured = capsys.readouterr()
    assert sorted(row["shape"] for row in json.loads(captured.out)) == sorted(GOOD_SHAPES)
    assert "invalid row autogen_winners row" in captured.err and reason in captured.err
    assert "Traceback" not in captured.err

    assert main(["list", "--db", db]) == 0
    captured = capsys.readouterr()
    assert all(shape in captured.out for shape in GOOD_SHAPES) and reason in captured.err

    assert main(["show", "sgemv", "--m", "16384", "--n", "16", "--db", db, "--gpu", H100.name, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["problem"] == "sgemv float32 m=16384,n=16"

    code = main(["show", "sgemv", "--m", "8192", "--n", "16", "--db", db, "--gpu", H100.name])
    err = capsys.readouterr().err
    assert code in (1, 2) and "Traceback" not in err and err.startswith("autogen: ")


@pytest.mark.parametrize("kind, spoil, reason", MALFORMED, ids=IDS)
def test_export_names_the_row_and_refuses(tmp_path, capsys, kind, spoil, reason):
    db = spoiled_db(tmp_path, spoil)
    out = tmp_path / "out"
    assert main(["export", "sgemv", "--out", str(out), "--gpu", H100.name, "--db", db]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "autogen_winners row" in err and reason in err and f"GPU {H100.name!r}" in err
    assert not out.exists()


# -- the dispatcher -------------------------------------------------------------------------------

# Rows that are well formed but that sgemv cannot serve: the family's own checks.
UNSERVABLE = [
    ("params_outside_the_space", _trial_of_bad_winner(
        "params", json.dumps({**SGEMV.default_params, "threads_per_row": 3}))),
    ("params_with_an_unknown_name", _trial_of_bad_winner(
        "params", json.dumps({**SGEMV.default_params, "evil": "1); system(\"x\")"}))),
    ("shape_of_another_family", _trial_of_bad_winner("shape_key", "n=8192", winners_too=True)),
    ("shape_out_of_range", _trial_of_bad_winner("shape_key", "m=0,n=16", winners_too=True)),
    # Issue 34.11: the name is derived from the params; a row naming another kernel carries
    # that kernel's time, and would be served (and re-measured by bench) under it.
    ("name_of_another_kernel", _trial_of_bad_winner(
        "kernel_name", SGEMV.kernel_name("float32", SGEMV.space.check({**SGEMV.default_params, "unroll": 4})))),
]


def fake_build(monkeypatch, dispatcher: Dispatcher) -> list:
    """_build without a GPU: compiling returns a stand-in kernel; every validation passes."""
    import autogen.gpu.device

    monkeypatch.setattr(autogen.runtime.dispatch, "device_identity", lambda: H100)
    compiled = []

    def compile_(family, problem, config, served_by, winner, device):
        compiled.append((served_by, winner.trial.shape_key if winner else None))
        return TunedKernel(problem, family.kernel_name(problem.dtype, config), config.as_dict(), served_by,
                           {"tuned_shape": winner.trial.shape_key if winner else None})

    monkeypatch.setattr(dispatcher, "_compile", compile_)
    monkeypatch.setattr(dispatcher, "_validated", lambda *args: True)
    return compiled


@pytest.mark.parametrize("kind, spoil", [(k, s) for k, s, _ in MALFORMED] + UNSERVABLE,
                         ids=IDS + [kind for kind, _ in UNSERVABLE])
def test_dispatcher_skips_the_row_and_serves_the_next_candidate(tmp_path, monkeypatch, kind, spoil):
    dispatcher = Dispatcher(f"sqlite:///{spoiled_db(tmp_path, spoil)}")
    steps = [(step, w.trial.shape_key if w else None)
             for step, w in dispatcher._candidates(SGEMV, SGEMV.problem(m=6000, n=16), H100, False)]
    assert steps[0] == ("nearest", "m=16384,n=16")  # m=8192,n=16 would be nearer
    assert all(shape in GOOD_SHAPES or shape is None for _, shape in steps)

    compiled = fake_build(monkeypatch, dispatcher)
    kernel = dispatcher.lookup(SGEMV.problem(m=6000, n=16), device=0)
    assert (kernel.served_by, kernel.provenance["tuned_shape"]) == ("nearest", "m=16384,n=16")
    assert compiled == [("nearest", "m=16384,n=16")]
    # The bad shape itself is not tuned as far as the dispatcher can tell: it is still served.
    assert dispatcher.lookup(SGEMV.problem(m=8192, n=16), device=0).served_by == "nearest"


def test_a_tampered_trial_does_not_break_reading_trials(tmp_path):
    path = tmp_path / "tuning.db"
    with TuningDB(path) as db:
        store_winner(db, H100, 1024, 16)
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE autogen_trials SET params = 'oops'")
    with TuningDB(path) as db:
        trials, invalid = db.trials_checked(H100, "sgemv", "float32", "m=1024,n=16")
        assert trials == [] and len(invalid) == 1 and invalid[0].table == "autogen_trials"
        assert "params are not JSON" in invalid[0].describe()
        assert db.trials(H100, "sgemv", "float32", "m=1024,n=16") == []
        (bad_winner,) = db.winners_checked()[1]  # the winner of that trial is reported, too
        assert bad_winner.reason.startswith("its trial (autogen_trials row")


# -- consistency of stored rows (issue 34.11) -----------------------------------------------------


def test_list_and_show_skip_a_winner_outside_the_space_naming_it(tmp_path, capsys):
    db = spoiled_db(tmp_path, _trial_of_bad_winner("params", json.dumps({**SGEMV.default_params, "x_path": "ldg2"})))
    assert main(["list", "--db", db, "--json"]) == 0
    captured = capsys.readouterr()
    assert sorted(row["shape"] for row in json.loads(captured.out)) == sorted(GOOD_SHAPES)
    assert captured.err.count("\n") == 1 and f"winner for m=8192,n=16 on {H100.name} (database)" in captured.err
    assert "x_path='ldg2' is not one of ['ldg', 'smem']" in captured.err
    assert main(["show", "sgemv", "--m", "8192", "--n", "16", "--db", db, "--gpu", H100.name]) == 1
    err = capsys.readouterr().err
    assert "x_path='ldg2'" in err and "nothing stored for sgemv float32 m=8192,n=16" in err


def _duplicate_winner(connection: sqlite3.Connection) -> None:
    """A second winner row of one problem, as a database whose unique keys were dropped holds."""
    (create,) = connection.execute("SELECT sql FROM sqlite_master WHERE name = 'autogen_winners'").fetchone()
    connection.execute("PRAGMA foreign_keys=OFF")
    connection.execute("ALTER TABLE autogen_winners RENAME TO old_winners")
    start = create.index("CONSTRAINT uq_autogen_winners_key")
    connection.execute(create[:start].rstrip().rstrip(",") + create[create.index(")", start) + 1:])
    connection.execute("INSERT INTO autogen_winners SELECT * FROM old_winners")
    connection.execute("DROP TABLE old_winners")
    columns = [row[1] for row in connection.execute("PRAGMA table_info(autogen_winners)") if row[1] != "id"]
    connection.execute(f"INSERT INTO autogen_winners ({', '.join(columns)}) SELECT {', '.join(columns)} "
                       "FROM autogen_winners WHERE shape_key = ?", (GOOD_SHAPES[0],))


def test_a_duplicate_winner_row_is_read_once(tmp_path, capsys):
    db = spoiled_db(tmp_path, _duplicate_winner)
    with sqlite3.connect(db) as connection:
        assert connection.execute("SELECT count(*) FROM autogen_winners WHERE shape_key = ?",
                                  (GOOD_SHAPES[0],)).fetchone() == (2,)
    m, n = (part.split("=")[1] for part in GOOD_SHAPES[0].split(","))
    assert main(["show", "sgemv", "--m", m, "--n", n, "--db", db, "--gpu", H100.name, "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["problem"] == f"sgemv float32 {GOOD_SHAPES[0]}"
    assert "a second winner of the same GPU model, problem and cache mode" in captured.err
    assert main(["list", "--db", db, "--json"]) == 0
    shapes = [row["shape"] for row in json.loads(capsys.readouterr().out)]
    assert sorted(shapes) == sorted((*GOOD_SHAPES, BAD_SHAPE))
