"""Issue 16, point 1: a stored winner is never silently replaced by a worse one.

The winner is kept per cache mode, and set_winner is a compare-and-set under the write lock:
it replaces the stored winner only when the new one is faster beyond the stored one's spread, or
on a side-by-side re-time, and returns the winner actually stored. SQLite always; PostgreSQL where
AUTOGEN_TEST_POSTGRES_URL names a server.
"""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
import traceback
import uuid

import pytest

from test_tuning_db import H100, SHAPE, make_trial
from tuning_db import TuningDB, migrations

SERVER = os.environ.get("AUTOGEN_TEST_POSTGRES_URL")


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'tuning.db'}"
        return
    if not SERVER:
        pytest.skip("AUTOGEN_TEST_POSTGRES_URL is not set")
    from sqlalchemy import create_engine, text

    name = "autogen_test_" + uuid.uuid4().hex[:12]
    admin = create_engine(SERVER, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    yield SERVER.rsplit("/", 1)[0] + "/" + name
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
    admin.dispose()


def trial(kernel: str, time_us: float, spread_us: float = 0.1, cache_mode: str = "cold", **changes):
    return make_trial(kernel, time_us, spread_us=spread_us, cache_mode=cache_mode,
                      samples_us=(time_us, time_us + spread_us), **changes)


def stored_winner(db: TuningDB, cache_mode: str = "cold"):
    return db.winner(H100, "gemv", "float32", SHAPE, cache_mode=cache_mode)


def test_a_slower_winner_stored_last_does_not_replace_the_faster(url):
    # The figures of the report: the later writer's winner was 8.8% slower.
    with TuningDB(url) as db:
        fast = db.record_trial(H100, trial("gemv_fast", 10.0))
        slow = db.record_trial(H100, trial("gemv_slow", 10.88))
        assert db.set_winner(H100, fast).trial.kernel_name == "gemv_fast"
        returned = db.set_winner(H100, slow, autogen_version="late")
        assert returned.trial.kernel_name == "gemv_fast", "the report must name the stored winner"
        assert returned == stored_winner(db) and returned.autogen_version == ""


def test_a_faster_winner_replaces_only_beyond_the_stored_spread(url):
    with TuningDB(url) as db:
        db.set_winner(H100, db.record_trial(H100, trial("gemv_a", 10.0, spread_us=0.5)))
        within = db.record_trial(H100, trial("gemv_b", 9.6))  # 0.4 faster, spread 0.5: noise
        assert db.set_winner(H100, within).trial.kernel_name == "gemv_a"
        beyond = db.record_trial(H100, trial("gemv_c", 9.4))
        assert db.set_winner(H100, beyond, margin=0.06).trial.kernel_name == "gemv_c"
        assert stored_winner(db).margin == 0.06


def test_side_by_side_retime_and_force_decide(url):
    with TuningDB(url) as db:
        db.set_winner(H100, db.record_trial(H100, trial("gemv_a", 10.0)))
        b = db.record_trial(H100, trial("gemv_b", 10.05))
        # Re-timed against another kernel than the one stored: the stored figures decide.
        assert db.set_winner(H100, b, retimed_against="gemv_z").trial.kernel_name == "gemv_a"
        assert db.set_winner(H100, b, retimed_against="gemv_a").trial.kernel_name == "gemv_b"
        a = db.find_trial(H100, "gemv", "float32", SHAPE, "gemv_a")
        assert db.set_winner(H100, a, force=True).trial.kernel_name == "gemv_a"


def test_the_same_winner_is_refreshed(url):
    with TuningDB(url) as db:
        a = db.record_trial(H100, trial("gemv_a", 10.0))
        db.set_winner(H100, a, peer_name="cuBLAS", peer_time_us=12.0)
        again = db.set_winner(H100, a, peer_name="cuBLAS", peer_time_us=11.0, autogen_version="2")
        assert again.peer_time_us == 11.0 and again.autogen_version == "2"


def test_hot_and_cold_winners_are_independent(url):
    with TuningDB(url) as db:
        for step in range(40):  # a long cold search
            db.record_trial(H100, trial(f"gemv_{step:02d}", 20.0 - step * 0.25))
        cold = db.set_winner(H100, db.find_trial(H100, "gemv", "float32", SHAPE, "gemv_39"))
        hot = db.set_winner(H100, db.record_trial(H100, trial("gemv_00", 3.0, cache_mode="hot")))
        assert hot.trial.cache_mode == "hot" and hot.trial.kernel_name == "gemv_00"
        assert stored_winner(db, "cold") == cold and stored_winner(db, "hot") == hot
        assert stored_winner(db, None) == cold  # where both are stored, the cold one first
        assert [w.trial.cache_mode for w in db.winners()] == ["cold", "hot"]
        # A slower hot result later replaces neither.
        db.set_winner(H100, db.record_trial(H100, trial("gemv_01", 4.0, cache_mode="hot")))
        assert stored_winner(db, "hot") == hot and stored_winner(db, "cold") == cold


def test_an_unusable_stored_winner_is_replaced(tmp_path):
    path = tmp_path / "tuning.db"
    with TuningDB(path) as db:
        db.set_winner(H100, db.record_trial(H100, trial("gemv_a", 5.0)))
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE autogen_trials SET time_us = 'fast' WHERE kernel_name = 'gemv_a'")
    with TuningDB(path) as db:
        replaced = db.set_winner(H100, db.record_trial(H100, trial("gemv_b", 9.0)))
        assert replaced.trial.kernel_name == "gemv_b"


# -- separate processes finishing in the wrong order ----------------------------------------------


def _finish_tuning(url: str, kernel: str, time_us: float, wait_for, then_set, results) -> None:
    """One tuner's end: record its best trial and propose it as the winner."""
    try:
        with TuningDB(url) as db:
            stored = db.record_trial(H100, trial(kernel, time_us))
            if wait_for is not None:
                assert wait_for.wait(60)
            winner = db.set_winner(H100, stored, autogen_version=kernel)
            if then_set is not None:
                then_set.set()
        results.put((kernel, winner.trial.kernel_name, None))
    except BaseException:
        results.put((kernel, None, traceback.format_exc()))


def _run(processes, results) -> dict:
    for process in processes:
        process.start()
    reports = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    assert [error for _, _, error in reports if error] == []
    return {kernel: reported for kernel, reported, _ in reports}


def test_two_tuners_finishing_in_the_wrong_order_keep_the_faster(url):
    TuningDB(url).close()  # the schema exists before both start
    context = multiprocessing.get_context("spawn")
    fast_done, results = context.Event(), context.Queue()
    processes = [
        context.Process(target=_finish_tuning, args=(url, "gemv_fast", 10.0, None, fast_done, results)),
        context.Process(target=_finish_tuning, args=(url, "gemv_slow", 10.88, fast_done, None, results)),
    ]
    reported = _run(processes, results)
    assert reported == {"gemv_fast": "gemv_fast", "gemv_slow": "gemv_fast"}  # both report what is stored
    with TuningDB(url) as db:
        assert stored_winner(db).trial.kernel_name == "gemv_fast"
        assert stored_winner(db).trial.time_us == min(t.time_us for t in db.trials(H100, "gemv", "float32", SHAPE))


def _race(url: str, kernel: str, time_us: float, barrier, results) -> None:
    barrier.wait()
    _finish_tuning(url, kernel, time_us, None, None, results)


def test_racing_tuners_leave_the_fastest_winner(url):
    TuningDB(url).close()
    context = multiprocessing.get_context("spawn")
    times = [11.0, 10.0, 13.0, 10.5, 12.0, 14.0]  # spread 0.1: every pair differs beyond it
    barrier, results = context.Barrier(len(times)), context.Queue()
    processes = [context.Process(target=_race, args=(url, f"gemv_{i}", t, barrier, results))
                 for i, t in enumerate(times)]
    _run(processes, results)
    with TuningDB(url) as db:
        assert stored_winner(db).trial.kernel_name == "gemv_1"


# -- migration 0003 -------------------------------------------------------------------------------


def test_migration_0003_keeps_each_winners_cache_mode_and_downgrades(tmp_path):
    import sqlalchemy as sa

    path = tmp_path / "tuning.db"
    with TuningDB(path) as db:
        db.set_winner(H100, db.record_trial(H100, trial("gemv_a", 5.0, cache_mode="hot")))
        db.set_winner(H100, db.record_trial(H100, trial("gemv_b", 6.0, shape_key="m=1,n=1")))
    engine = sa.create_engine(f"sqlite:///{path}")
    try:
        with engine.begin() as connection:
            migrations.downgrade_to(connection, "0002")
        with sqlite3.connect(path) as connection:
            assert "cache_mode" not in connection.execute(
                "SELECT sql FROM sqlite_master WHERE name = 'autogen_winners'").fetchone()[0]
        with engine.begin() as connection:
            migrations.upgrade_to(connection, "0003")
    finally:
        engine.dispose()
    with sqlite3.connect(path) as connection:
        modes = dict(connection.execute("SELECT shape_key, cache_mode FROM autogen_winners"))
    assert modes == {SHAPE: "hot", "m=1,n=1": "cold"}
    with TuningDB(path) as db:
        # Both modes of one problem, then down to 0002: the cold one stays.
        db.set_winner(H100, db.record_trial(H100, trial("gemv_c", 7.0)))
        assert len(db.winners()) == 3
    engine = sa.create_engine(f"sqlite:///{path}")
    try:
        with engine.begin() as connection:
            migrations.downgrade_to(connection, "0002")
    finally:
        engine.dispose()
    with sqlite3.connect(path) as connection:
        rows = connection.execute("SELECT w.shape_key, t.kernel_name FROM autogen_winners w "
                                  "JOIN autogen_trials t ON t.id = w.trial_id ORDER BY 1").fetchall()
    assert rows == [("m=1,n=1", "gemv_b"), (SHAPE, "gemv_c")]


# -- the tuner reports the stored winner ----------------------------------------------------------


def test_the_tuner_reports_the_winner_actually_stored(db_url, monkeypatch):
    from test_tuner_replay import PROBLEM, run

    from autogen.report import tune_summary

    original = TuningDB.set_winner
    rivals = []

    def another_tuner_finishes_first(self, device, candidate, **options):
        rival = TuningDB(db_url)
        faster = make_trial("rival_kernel", candidate.time_us / 2, family="sgemv",
                            shape_key=PROBLEM.shape_key, spread_us=0.01,
                            samples_us=(candidate.time_us / 2,) * 3)
        rivals.append(original(rival, device, rival.record_trial(device, faster)))
        rival.close()
        return original(self, device, candidate, **options)

    monkeypatch.setattr(TuningDB, "set_winner", another_tuner_finishes_first)
    result, _ = run(db_url, trials=8)
    assert result.winner.trial.kernel_name == "rival_kernel"
    assert tune_summary(result)["winner"]["kernel"] == "rival_kernel"
    monkeypatch.setattr(TuningDB, "set_winner", original)
    stored = TuningDB(db_url).winner(result.device, "sgemv", "float32", PROBLEM.shape_key)
    assert stored.trial.kernel_name == "rival_kernel"


def test_the_retimed_finalists_tie_only_within_the_timing_noise():
    from autogen.search.winner import pick_winner

    # gelu bf16 2^28 (docs/history/sessions.md, "The tie rule"): the evict_last variant ahead by
    # more than the tie fraction is no tie; it used to lose to the ldg variant's smaller name.
    last = trial("gelu_bf16_vw8_ept16_bs256_lone_pass_mfloat_eerff_clast", 354.17, spread_us=1.2)
    ldg = trial("gelu_bf16_vw8_ept16_bs128_lone_pass_mhalf2_eerff_cldg", 356.71, spread_us=1.06)
    chosen, margin = pick_winner([ldg, last])
    assert chosen is last and margin == pytest.approx((356.71 - 354.17) / 354.17)
    # Within 0.2%, or within half the best one's spread: a tie, the smaller name wins.
    near = trial("gelu_bf16_vw8_ept16_bs128_lone_pass_mhalf2_eerff_cldg", 354.80, spread_us=1.06)
    assert pick_winner([last, near])[0] is near
    noisy = trial("a_noisy_one", 350.0, spread_us=12.0)
    assert pick_winner([noisy, last])[0] is noisy  # 354.17 is within 6 us of it, "a" < "g"
    assert pick_winner([trial("b", 350.0, spread_us=0.2), trial("a", 352.0, spread_us=0.2)])[0].kernel_name == "b"
