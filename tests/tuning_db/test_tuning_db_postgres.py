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
    from sqlalchemy import create_engine, text

    name = "autogen_test_" + uuid.uuid4().hex[:12]
    admin = create_engine(SERVER, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    yield SERVER.rsplit("/", 1)[0] + "/" + name
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
