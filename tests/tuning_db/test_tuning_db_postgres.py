"""tuning_db on PostgreSQL: migrations, round trips, concurrent writers, the dispatcher's chain.

Runs where AUTOGEN_TEST_POSTGRES_URL names a server (CI starts one with
scripts/start_test_postgres.sh); each test gets a database of its own.
"""

from __future__ import annotations

import os
import uuid

import pytest

SERVER = os.environ.get("AUTOGEN_TEST_POSTGRES_URL")
pytestmark = pytest.mark.skipif(not SERVER, reason="AUTOGEN_TEST_POSTGRES_URL is not set")


@pytest.fixture
def pg_url():
    url, name = _fresh_database()
    yield url
    _drop_database(name)


def _fresh_database() -> tuple[str, str]:
    """A new database on the test server: its URL and name."""
    from sqlalchemy import create_engine, text

    name = "autogen_test_" + uuid.uuid4().hex[:12]
    admin = create_engine(SERVER, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return SERVER.rsplit("/", 1)[0] + "/" + name, name


def _drop_database(name: str) -> None:
    from sqlalchemy import create_engine, text

    admin = create_engine(SERVER, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
    admin.dispose()


def test_migrations_and_round_trips(pg_url):
    from test_tuning_db import H100, SHAPE, make_trial
    from tuning_db import TuningDB, current_revision, upgrade
    from tuning_db.records import ValidationRecord

    head = upgrade(pg_url)
    assert current_revision(pg_url) == head
    with TuningDB(pg_url) as db:
        first = db.record_trial(H100, make_trial("gemv_a", 10.0))
        db.record_trial(H100, make_trial("gemv_a", 8.0))  # a re-measurement replaces the row
        assert [t.time_us for t in db.trials(H100, "gemv", "float32", SHAPE)] == [8.0]
        assert first.params == {"bm": 64, "tile": [4, 8]}
        winner = db.set_winner(H100, db.find_trial(H100, "gemv", "float32", SHAPE, "gemv_a"), peer_name="peer",
                               peer_time_us=12.0)
        assert db.winner(H100, "gemv", "float32", SHAPE) == winner and winner.device == H100
        db.record_validation(H100, ValidationRecord("gemv", "float32", SHAPE, "gemv_a", "h", True, 1e-7))
        assert db.validation(H100, "gemv", "float32", SHAPE, "h").passed
        with pytest.raises(ValueError):
            db.set_winner(H100, db.record_trial(H100, make_trial("gemv_b", status="failed", reason="x")))


def test_concurrent_processes_lose_and_duplicate_nothing(pg_url):
    from test_tuning_db import H100, KERNELS, ROUNDS, SHAPES, run_hammers
    from tuning_db import TuningDB

    reports = run_hammers(pg_url)
    written = {(shape, kernel, mode) for _, rows, _ in reports for shape, kernel, mode, _ in rows}
    with TuningDB(pg_url) as db:
        stored = [(t.shape_key, t.kernel_name, t.cache_mode) for shape in SHAPES
                  for t in db.trials(H100, "gemv", "float32", shape)]
        assert sorted(stored) == sorted(written)  # every key once: none lost, none doubled
        winners = db.winners()  # one per shape and cache mode
        assert sorted((w.trial.shape_key, w.trial.cache_mode) for w in winners) == sorted(
            (shape, mode) for shape in SHAPES for mode in ("cold", "hot"))
        assert all(w.trial.status == "ok" and w.trial.kernel_name in KERNELS for w in winners)
    assert ROUNDS > 0


def test_dispatcher_chain_reads_postgres(pg_url, monkeypatch):
    from dbfixtures import H100, store_winner
    from tuning_db import TuningDB

    from autogen.catalog import pretuned
    from autogen.runtime.dispatch import Dispatcher
    from autogen.core.registry import get_family

    monkeypatch.setenv("AUTOGEN_NO_PRETUNED", "1")
    pretuned.pretuned_db.cache_clear()
    store_winner(TuningDB(pg_url), H100, 16384, 16)
    sgemv = get_family("sgemv")
    steps = [step for step, _ in Dispatcher(pg_url)._candidates(sgemv, sgemv.problem(m=8192, n=16), H100, False)]
    assert steps == ["nearest", "default"]
    pretuned.pretuned_db.cache_clear()


def test_claims_lock_their_problem_and_completing_locks_nothing(pg_url):
    # Another transaction holds the GPU model's row (as set_winner does) and one problem's
    # claim lock: a claim of another problem, and the completion of a claim, go ahead (before,
    # both waited for the GPU row). Waits are bounded by the joins, never asserted as times.
    import threading

    from sqlalchemy import create_engine, text
    from test_tuning_db import H100, make_trial
    from tuning_db import TuningDB
    from tuning_db.repository import _lock_problem

    db = TuningDB(pg_url)
    first = make_trial("gemv_a", shape_key="m=1,n=16", status="rejected")
    assert db.claim(H100, first, "v1", "w1", 60.0, budget=4).status == "claimed"
    other = make_trial("gemv_b", shape_key="m=2,n=16", status="rejected")
    holder = create_engine(pg_url)
    with holder.connect() as connection:
        gpu_id = connection.execute(text("SELECT id FROM autogen_gpus FOR NO KEY UPDATE")).scalar_one()
        from sqlalchemy.orm import Session
        with Session(bind=connection) as session:
            _lock_problem(session, gpu_id, "gemv", "float32", "m=1,n=16", "cold")
        done: dict = {}

        def work() -> None:
            done["claim"] = db.claim(H100, other, "v2", "w1", 60.0, budget=4).status
            done["stored"] = db.complete_claim(H100, make_trial("gemv_a", shape_key="m=1,n=16"), "v1", "w1").status
        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        thread.join(60)
        assert done == {"claim": "claimed", "stored": "ok"}
        connection.rollback()
    holder.dispose()
    assert [c.state for c in db.claims(H100, "gemv", "float32", "m=1,n=16")] == ["done"]
    db.close()


# -- claims decided on the server (autogen_claim_many, revision 0005) ------------------------------


def _set_expiry(url: str, variant: str, expires_at: float) -> None:
    """Write a claim's expires_at as it is: 0 (lapsed), far ahead, or not a finite number."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    with engine.begin() as connection:
        connection.execute(text("UPDATE autogen_claims SET expires_at = :at WHERE variant = :variant"),
                           {"at": expires_at, "variant": variant})
    engine.dispose()


# Batches and the events between them: ("claim", owner, [(kernel, variant), ...], budget, longest_lease_s),
# ("expire", variant, expires_at), ("store", kernel, status) a trial stored without a claim,
# ("complete", owner, kernel, variant).
SEQUENCE = [
    ("claim", "alice", [("k_a", "va"), ("k_b", "vb"), ("k_a", "va")], 7, None),  # va asked twice: taken
    ("store", "k_s", "ok"),  # measured without a claim
    ("store", "k_r", "rejected"),  # not counted by the budget
    ("complete", "alice", "k_b", "vb"),  # a done claim
    ("expire", "va", 0.0),  # alice's lease lapsed
    # va taken over (counted already), vb and vs done, vc and vd claimed, ve over the budget
    ("claim", "bob", [("k_a", "va"), ("k_b", "vb"), ("k_s", "vs"), ("k_c", "vc"), ("k_d", "vd"), ("k_e", "ve")],
     5, None),
    ("expire", "vc", 0.0),
    ("claim", "bob", [("k_c", "vc")], 5, None),  # a lapsed claim keeps its place: over the budget
    ("claim", "bob", [("k_c", "vc")], None, None),  # bob's own lapsed claim: claimed again, not taken over
    ("expire", "vd", 1e12),  # a lease longer than any worker writes
    ("claim", "carol", [("k_c", "vc"), ("k_d", "vd")], None, 120.0),  # vc live: taken; vd taken over
    ("expire", "vc", "inf"),  # not a finite number: lapsed
    ("claim", "dave", [("k_c2", "vc")], None, None),
    ("expire", "va", 0.0),
    ("claim", "erin", [("k_a", "va"), ("k_a", "va"), ("k_f", "vf"), ("k_f", "vf")], 9, 0.0),  # twice each
    ("claim", "erin", [("k_g", "vg"), ("k_h", "vh")], 7, None),  # the budget reached mid-batch
]
EXPECTED = [
    [("claimed", "k_a", False, ""), ("claimed", "k_b", False, ""), ("taken", "k_a", False, "")],
    [("claimed", "k_a", True, "alice"), ("done", "k_b", False, ""), ("done", "k_s", False, ""),
     ("claimed", "k_c", False, ""), ("claimed", "k_d", False, ""), ("budget", "", False, "")],
    [("budget", "", False, "")],
    [("claimed", "k_c", False, "bob")],
    [("taken", "k_c", False, ""), ("claimed", "k_d", True, "bob")],
    [("claimed", "k_c2", True, "bob")],
]


def _run_claims(url: str, sequence) -> tuple[list, list]:
    """The answers to each batch of ``sequence``, and the problem's claims at the end."""
    from test_tuning_db import H100, SHAPE, make_trial
    from tuning_db import TuningDB

    answers = []
    with TuningDB(url) as db:
        for step in sequence:
            if step[0] == "claim":
                _, owner, pairs, budget, longest = step
                wanted = [(make_trial(kernel, None, status="rejected", params={"k": kernel}), variant)
                          for kernel, variant in pairs]
                answers.append([(c.status, c.kernel_name, c.taken_over, c.previous)
                                for c in db.claim_many(H100, wanted, owner, 60.0, budget, longest)])
            elif step[0] == "expire":
                _set_expiry(url, step[1], float(step[2]))
            elif step[0] == "store":
                db.record_trial(H100, make_trial(step[1], status=step[2]))
            else:
                _, owner, kernel, variant = step
                db.complete_claim(H100, make_trial(kernel), variant, owner)
        claims = [(c.variant, c.kernel_name, c.params, c.owner, c.state, c.attempts, c.expires_in_s > 0)
                  for c in db.claims(H100, "gemv", "float32", SHAPE)]
    return answers, claims


def _run_claims_in_python(monkeypatch, sequence: list) -> tuple[list, list]:
    """_run_claims on a fresh PostgreSQL database with claim_many decided as on SQLite
    (_lock_problem, _CLAIMS_CHECK, _decide_claim)."""
    from tuning_db import repository

    url, name = _fresh_database()
    try:
        monkeypatch.setattr(repository, "_claim_on_server", repository._claim_here)
        return _run_claims(url, sequence)
    finally:
        _drop_database(name)


def test_claims_decided_on_the_server_answer_as_in_python(pg_url, tmp_path, monkeypatch):
    on_server = _run_claims(pg_url, SEQUENCE)
    assert on_server[0][:len(EXPECTED)] == EXPECTED
    assert on_server[0][-2][2:] == [("claimed", "k_f", False, ""), ("taken", "k_f", False, "")]
    assert on_server[0][-1] == [("claimed", "k_g", False, ""), ("budget", "", False, "")]
    assert on_server == _run_claims(f"sqlite:///{tmp_path / 'claims.db'}", SEQUENCE)
    assert on_server == _run_claims_in_python(monkeypatch, SEQUENCE)


def test_claims_decided_on_the_server_read_nan_as_lapsed(pg_url, monkeypatch):
    # SQLite stores NaN as NULL (refused by NOT NULL): compared with the Python path on PostgreSQL.
    sequence = [("claim", "alice", [("k_a", "va"), ("k_b", "vb")], None, None),
                ("expire", "va", "nan"), ("expire", "vb", "-inf"),
                ("claim", "bob", [("k_a", "va"), ("k_b", "vb")], None, None)]
    on_server = _run_claims(pg_url, sequence)
    assert on_server[0][1] == [("claimed", "k_a", True, "alice"), ("claimed", "k_b", True, "alice")]
    assert on_server == _run_claims_in_python(monkeypatch, sequence)


def _has_claim_function(url: str) -> bool:
    from sqlalchemy import create_engine, text

    from tuning_db.migrations.functions import CLAIM_MANY_SIGNATURE

    engine = create_engine(url)
    with engine.connect() as connection:
        found = connection.execute(text("SELECT to_regprocedure(:name) IS NOT NULL"),
                                   {"name": CLAIM_MANY_SIGNATURE}).scalar_one()
    engine.dispose()
    return found


def test_a_database_at_0004_upgrades_to_the_claim_function(pg_url):
    from sqlalchemy import create_engine
    from test_tuning_db import H100, make_trial
    from tuning_db import TuningDB, current_revision, migrations

    engine = create_engine(pg_url)
    with engine.begin() as connection:
        migrations.upgrade_to(connection, "0004_trial_claims")
    assert current_revision(pg_url) == "0004_trial_claims" and not _has_claim_function(pg_url)
    with TuningDB(pg_url) as db:  # upgraded at open
        assert current_revision(pg_url) == migrations.head_revision() and _has_claim_function(pg_url)
        assert db.claim(H100, make_trial("gemv_a"), "v1", "w1", 60.0, budget=1).status == "claimed"
        assert db.claim(H100, make_trial("gemv_b"), "v2", "w1", 60.0, budget=1).status == "budget"
    with engine.begin() as connection:
        migrations.downgrade_to(connection, "0004_trial_claims")
    assert not _has_claim_function(pg_url)
    engine.dispose()


def test_a_new_database_gets_the_claim_function(pg_url):
    from tuning_db import upgrade

    upgrade(pg_url)  # created from the models (create_head), not by the scripts
    assert _has_claim_function(pg_url)
