"""The search's phase timings and database counts (autogen.search.dbstats), and the wait of a
worker out of budget for the other workers' claims (TakeOver._drain): no timing is asserted."""

from __future__ import annotations

import os

from pathlib import Path
from types import SimpleNamespace

import pytest
from tuning_db import TuningDB

from autogen.core.registry import get_family
from autogen.search import claims, dbstats
from autogen.search.claims import Lease, TakeOver
from autogen.search.tuner import TuneOptions, Tuner
from autogen.testing.replay import ReplayBackend, load

ASSET = Path(__file__).parent.parent / "assets" / "replay_sgemv_8192x16.json"
if not ASSET.exists():
    pytest.skip(f"recording {ASSET.name} not present", allow_module_level=True)
RECORDING = load(ASSET)
PROBLEM = get_family("sgemv").problem(m=8192, n=16)


def test_a_tune_reports_its_phases_and_database_work(db_url, monkeypatch):
    monkeypatch.setenv("AUTOGEN_NO_PRETUNED", "1")
    backend = ReplayBackend(RECORDING)
    result = Tuner(PROBLEM, TuneOptions(db_url=db_url, workers=1, trials=6, sampler="random"),
                   progress=lambda _line: None, backend_factory=lambda *_args: backend).run()
    phases = result.phases_s
    for part in ("search_ask", "search_claim", "search_store", "search_refresh", "search_gpu_thread_evaluate",
                 "search_gpu_thread_compile_wait", "search_gpu_thread_idle", "search_db_statement", "search_db_lock_wait"):
        assert phases[part] >= 0, part
    # Each of the 6 trials was claimed and stored, each in a transaction of its own at least.
    assert phases["search_db_transactions_n"] >= 12
    assert phases["search_db_statements_n"] > phases["search_db_transactions_n"]
    assert phases["search_db_rows_written_n"] >= 18  # a claim, its trial, the claim marked done


def test_the_counters_count_statements_rows_and_transactions(db_url):
    db = TuningDB(db_url)
    before = dbstats.snapshot()
    db.renew_claims("nobody", 10.0)  # one write transaction, no row
    spent = dbstats.snapshot().minus(before)
    assert spent.transactions == 1 and spent.statements >= 2 and spent.rows_written == 0  # BEGIN IMMEDIATE, UPDATE
    assert spent.lock_wait_s <= spent.statement_s


class _Draining(TakeOver):
    """TakeOver._drain against a scripted sequence of other workers' claims in flight."""

    def __init__(self, rounds: list[list[str]]):
        self.rounds, self.reads = rounds, 0
        self.owner, self.lease = "me", Lease(60.0)
        self.options = SimpleNamespace(timeout_s=None, cache_mode="cold")
        self.stop = SimpleNamespace(is_set=lambda: False)
        self.device = self.family = None
        self.problem = SimpleNamespace(family="f", dtype="d", shape_key="s")
        self.db = SimpleNamespace(claims=self._claims)

    def _take_over_lapsed(self):
        return []

    def timed_out(self, _started):
        return False

    def _claims(self, *_key, running=False):
        held = self.rounds[min(self.reads, len(self.rounds) - 1)]
        self.reads += 1
        return [SimpleNamespace(owner="other", variant=v, expires_in_s=50.0) for v in held]


def test_a_worker_out_of_budget_polls_soon_then_less_often(monkeypatch):
    waits = []
    monkeypatch.setattr(claims.time, "sleep", waits.append)
    # One claim in flight for 3 reads, then another for 2, then none.
    drain = _Draining([["a"], ["a"], ["a"], ["b"], ["b"], []])
    assert drain._drain(started=0.0) == []
    assert waits[0] == claims.DRAIN_POLL_S  # not a poll of the lease (lease / 12 = 5 s)
    assert waits[1] > waits[0] and waits[2] > waits[1]  # the same claim still in flight: less often
    assert waits[3] == claims.DRAIN_POLL_S  # another claim: soon again
    assert max(waits) <= drain.lease.heartbeat_s / 2


def test_a_claims_problem_lock_counts_as_a_lock_wait():
    assert dbstats._takes_lock("SELECT extract(epoch from clock_timestamp()) FROM (SELECT set_config('x', "
                               "'off', true), pg_advisory_xact_lock(%(key)s)) AS locked")
    assert not dbstats._takes_lock("SELECT 1")


def test_the_replay_aid_logs_each_evaluation_with_its_problem(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOGEN_NO_PRETUNED", "1")
    log = tmp_path / "evaluations.log"
    factory = ReplayBackend.factory(RECORDING, log_to=log)
    Tuner(PROBLEM, TuneOptions(db_url=f"sqlite:///{tmp_path / 't.db'}", workers=1, trials=4, sampler="random"),
          progress=lambda _line: None, backend_factory=factory).run()
    lines = log.read_text().splitlines()
    assert len(lines) == 4 and all(line.startswith("sgemv-float32-m8192-n16 ") for line in lines)
    assert {line.split()[2] for line in lines} == {str(os.getpid())}


def test_the_loop_claims_its_variants_in_batches(db_url, monkeypatch):
    monkeypatch.setenv("AUTOGEN_NO_PRETUNED", "1")
    batches = []
    claim_many = TuningDB.claim_many

    def counted(self, device, wanted, *args, **kwargs):
        answers = claim_many(self, device, wanted, *args, **kwargs)
        batches.append(sum(a.status == "claimed" for a in answers))
        return answers

    monkeypatch.setattr(TuningDB, "claim_many", counted)
    backend = ReplayBackend(RECORDING)
    result = Tuner(PROBLEM, TuneOptions(db_url=db_url, workers=1, trials=12, sampler="random"),
                   progress=lambda _line: None, backend_factory=lambda *_args: backend).run()
    assert sum(batches) == result.measured + result.failed == 12  # the budget exact
    assert max(batches) <= 2 + claims.CLAIM_BATCH - 1  # the pipeline's depth
    assert len(batches) < 12 and max(batches) >= claims.CLAIM_BATCH  # fewer claims than variants
    assert len(set(backend.evaluator.evaluated)) == len(backend.evaluator.evaluated)  # none twice


def test_study_writes_are_spaced_by_what_the_last_one_took():
    from autogen.search import studies

    assert studies.flush_interval(0.001) == studies.FLUSH_S  # alone and quick: every FLUSH_S
    assert studies.flush_interval(0.05) == pytest.approx(studies.FLUSH_SPACING * 0.05)  # a contended lock
    assert studies.flush_interval(5.0) == studies.MAX_FLUSH_S  # never longer than that


def test_a_slow_study_write_delays_the_next_and_close_still_writes_everything(db_url, monkeypatch):
    """The writer waits flush_interval(last write) before the next batch; close() cuts the wait
    short and writes what is queued: nothing measured is left out of the shared study."""
    import time

    import optuna

    from autogen.search import studies

    monkeypatch.setenv("AUTOGEN_NO_PRETUNED", "1")
    written, slow = [], 0.2
    add_trials = studies.SharedStudy._add_trials

    def slowly(self, templates):
        time.sleep(slow)
        written.append((time.monotonic(), len(templates)))
        return add_trials(self, templates)

    monkeypatch.setattr(studies.SharedStudy, "_add_trials", slowly)
    dists = {"x": optuna.distributions.CategoricalDistribution([1, 2, 3, 4, 5, 6])}
    study = studies.SharedStudy(TuningDB(db_url), "spacing", optuna.samplers.RandomSampler(seed=0), {}, dists,
                                "w1", ("gpu", "f", "float32", "n=1", "cold"))
    study.record({"x": 1}, dists, 1.0, {"kernel": "k1"})
    deadline = time.monotonic() + 30
    while study._flush_s == studies.FLUSH_S and time.monotonic() < deadline:
        time.sleep(0.01)
    assert written, "the first write never happened"
    assert study._flush_s == pytest.approx(studies.flush_interval(slow), rel=0.5)
    assert study._flush_s > studies.FLUSH_S
    for x in (2, 3, 4):  # queued while the writer waits its spaced interval
        study.record({"x": x}, dists, float(x), {"kernel": f"k{x}"})
    time.sleep(0.5)
    assert len(written) == 1  # still waiting: the slow write spaced the next one out
    assert study.close() == 0
    assert [n for _t, n in written] == [1, 3]  # close wrote the rest in one batch
    assert len(study.shared.get_trials(states=(optuna.trial.TrialState.COMPLETE,))) == 4
