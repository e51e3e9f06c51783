"""A problem's budget counts its launched variants exactly (stored trials that are not rejected,
plus running claims, lapsed ones included), however the trials were written: on SQLite, which
counts the rows as it claims, and on PostgreSQL, where triggers keep the count in
autogen_trial_counts as trials are written (revision 0006_trial_counts), also across a
migration of a database that holds trials and claims already.

PostgreSQL runs where AUTOGEN_TEST_POSTGRES_URL names a server; each test gets a database.
"""

from __future__ import annotations

import pytest
import test_winner_policy
from test_tuning_db import H100, SHAPE, make_trial
from test_tuning_db_postgres import _set_expiry
from tuning_db import TuningDB

url = test_winner_policy.url  # the fixture: a SQLite file, or a new PostgreSQL database
PROBE = make_trial("k_probe", None, status="rejected")


def assert_launched(db: TuningDB, url: str, count: int) -> None:
    """The problem's budget sees exactly ``count`` launched variants: a new variant is over a
    budget of ``count`` and within one of ``count + 1`` (the probe's claim is then released). On
    PostgreSQL, the kept counts also equal the trials counted row by row, for every problem."""
    assert db.claim(H100, PROBE, "v_probe", "probe", 60.0, budget=count).status == "budget"
    assert db.claim(H100, PROBE, "v_probe", "probe", 60.0, budget=count + 1).status == "claimed"
    assert db.release_claims("probe") == 1
    assert_counts_agree(url)


def assert_counts_agree(url: str) -> None:
    if not url.startswith("postgresql"):
        return
    from sqlalchemy import create_engine, text

    problem = "gpu_id, family, dtype, shape_key, cache_mode"
    engine = create_engine(url)
    with engine.connect() as connection:
        counted = connection.execute(text(
            f"SELECT {problem}, count(*) FROM autogen_trials WHERE status <> 'rejected' GROUP BY {problem}")).all()
        kept = connection.execute(text(
            f"SELECT {problem}, sum(counted) FROM autogen_trial_counts GROUP BY {problem} HAVING sum(counted) <> 0"
        )).all()
    engine.dispose()
    assert sorted(kept) == sorted(counted)


def claim(db: TuningDB, kernel: str, owner: str, budget: int | None = None, lease_s: float = 60.0) -> str:
    return db.claim(H100, make_trial(kernel, None, status="rejected"), "v" + kernel, owner, lease_s, budget).status


def test_trials_stored_without_a_claim_count_unless_rejected(url):
    with TuningDB(url) as db:
        db.record_trial(H100, make_trial("k_ok"))
        db.record_trial(H100, make_trial("k_failed", status="failed", reason="x"))
        db.record_trial(H100, make_trial("k_rejected", status="rejected"))
        db.record_trial(H100, make_trial("k_hot", cache_mode="hot"))  # another problem's
        db.record_trial(H100, make_trial("k_other", shape_key="m=1,n=16"))  # another problem's
        assert_launched(db, url, 2)
        db.record_trial(H100, make_trial("k_ok", 9.0))  # a re-timing replaces the row: counted once
        assert_launched(db, url, 2)
        db.record_trial(H100, make_trial("k_ok", status="rejected"))  # re-stored rejected: no longer counted
        assert_launched(db, url, 1)
        db.record_trial(H100, make_trial("k_rejected"))  # and the other way
        assert_launched(db, url, 2)
        assert claim(db, "k_a", "alice", budget=3) == "claimed"
        assert claim(db, "k_b", "alice", budget=3) == "budget"
        db.complete_claim(H100, make_trial("k_a"), "vk_a", "alice")  # running to stored: counted once
        assert_launched(db, url, 3)


def test_released_claims_give_their_places_back(url):
    with TuningDB(url) as db:
        assert [claim(db, k, "alice", budget=3) for k in ("k_a", "k_b", "k_c", "k_d")] == ["claimed"] * 3 + ["budget"]
        assert db.release_claims("alice") == 3
        assert_launched(db, url, 0)
        assert [claim(db, k, "bob", budget=3) for k in ("k_d", "k_e")] == ["claimed", "claimed"]
        held = db.claims(H100, "gemv", "float32", SHAPE, running=True)[0]
        assert db.release_claim(H100, held) == 1
        assert_launched(db, url, 1)
        # Completed after its claim was released: stored, counted once.
        db.complete_claim(H100, make_trial("k_d"), "vk_d", "bob")
        assert_launched(db, url, 2)


def test_a_lapsed_claim_taken_over_holds_one_place(url):
    with TuningDB(url) as db:
        assert claim(db, "k_a", "alice", budget=2) == "claimed"
        assert claim(db, "k_b", "alice", budget=2, lease_s=0.0) == "claimed"  # lapses at once
        assert claim(db, "k_c", "bob", budget=2) == "budget"  # the lapsed claim counts
        assert claim(db, "k_b", "bob") == "claimed"  # taken over (with no budget: it holds its place)
        assert_launched(db, url, 2)
        _set_expiry(url, "vk_a", 0.0)
        assert claim(db, "k_a", "bob") == "claimed"
        # Both the worker whose lease lapsed and the one that took over complete: one trial.
        for owner in ("alice", "bob"):
            db.complete_claim(H100, make_trial("k_a"), "vk_a", owner)
        assert_launched(db, url, 2)
        db.complete_claim(H100, make_trial("k_b", status="rejected"), "vk_b", "bob")  # a rejected variant
        assert_launched(db, url, 1)  # its place freed
        assert claim(db, "k_c", "bob", budget=2) == "claimed"
        db.delete_trials(H100, "gemv", "float32", SHAPE)  # a forced re-tune forgets the problem
        assert_launched(db, url, 0)


# -- PostgreSQL: the kept counts ---------------------------------------------------------------------


def _execute(url: str, *statements: str) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    with engine.begin() as connection:
        for statement in statements:
            connection.execute(text(statement))
    engine.dispose()


def test_counts_follow_writes_that_bypass_tuning_db(url):
    if not url.startswith("postgresql"):
        pytest.skip("the counts are PostgreSQL's")
    with TuningDB(url) as db:
        db.record_trial(H100, make_trial("k_seed"))
    from tuning_db.models import TrialRow

    kept = [c.name for c in TrialRow.__table__.columns if c.name not in ("id", "kernel_name", "status")]
    copy = (f"SELECT {', '.join(kept)}, 'k_' || n || '_' || s, s FROM autogen_trials, generate_series(1, 5) AS n, "
            "unnest(ARRAY['ok', 'rejected', 'failed']) AS s WHERE kernel_name = 'k_seed'")
    columns = ", ".join(kept + ["kernel_name", "status"])
    _execute(url, f"INSERT INTO autogen_trials ({columns}) {copy}")  # many rows of one statement
    assert_counts_agree(url)
    _execute(url, "UPDATE autogen_trials SET status = 'rejected' WHERE kernel_name LIKE 'k_1_%'",
             "UPDATE autogen_trials SET shape_key = 'm=2,n=16' WHERE kernel_name LIKE 'k_2_%'")  # moved
    assert_counts_agree(url)
    _execute(url, "DELETE FROM autogen_trials WHERE kernel_name LIKE 'k_3_%'")
    assert_counts_agree(url)
    with TuningDB(url) as db:
        assert_launched(db, url, 1 + 2 * 2)  # k_seed; k_4_* and k_5_* ok and failed
    _execute(url, "TRUNCATE autogen_trials CASCADE")
    assert_counts_agree(url)


def test_a_database_with_trials_and_claims_upgrades_with_its_counts(url):
    # Written at head, taken down to 0005 (the counts gone, the claim function counting rows
    # again), written to there, then upgraded at open: the counts start from the rows.
    if not url.startswith("postgresql"):
        pytest.skip("the counts are PostgreSQL's")
    from sqlalchemy import create_engine

    from tuning_db import current_revision, migrations

    with TuningDB(url) as db:
        for kernel in ("k_a", "k_b", "k_c"):
            assert claim(db, kernel, "alice", budget=10) == "claimed"
        db.complete_claim(H100, make_trial("k_a"), "vk_a", "alice")
        db.complete_claim(H100, make_trial("k_b", status="rejected"), "vk_b", "alice")
        db.record_trial(H100, make_trial("k_s"))
        db.record_trial(H100, make_trial("k_h", cache_mode="hot"))
    engine = create_engine(url)
    with engine.begin() as connection:
        migrations.downgrade_to(connection, "0005_claim_function")
    engine.dispose()
    _execute(url, "UPDATE autogen_trials SET status = 'failed' WHERE kernel_name = 'k_b'")  # not counted by any trigger
    with TuningDB(url) as db:  # upgraded at open
        assert current_revision(url) == migrations.head_revision()
        assert_launched(db, url, 4)  # k_a, k_b, k_s stored; k_c running
