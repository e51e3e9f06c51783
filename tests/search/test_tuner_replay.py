"""The search loop and its storage without a GPU, on timings recorded on an H100.

The recording (tests/assets/replay_sgemv_8192x16.json) was written by scripts/search_quality.py
from an exhaustive search on the lent H100; ReplayBackend (a test aid) serves it back.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tuning_db import TuningDB
from tuning_db.records import TrialRecord, WinnerRecord

from autogen.core.registry import get_family
from autogen.testing.replay import ReplayBackend, load
from autogen.search.tuner import TuneOptions, Tuner

ASSET = Path(__file__).parent.parent / "assets" / "replay_sgemv_8192x16.json"
if not ASSET.exists():  # written on the GPU by scripts/search_quality.py, then committed
    pytest.skip(f"recording {ASSET.name} not present", allow_module_level=True)
RECORDING = load(ASSET)
SGEMV = get_family("sgemv")
PROBLEM = SGEMV.problem(m=8192, n=16)


@pytest.fixture(autouse=True)
def no_shipped_catalog(monkeypatch):
    # These tests follow the search from the default config: the shipped catalog's winners for
    # the recording's GPU would be tried first (test_shipped_winners_seed_a_new_users_search).
    from autogen.catalog import pretuned
    monkeypatch.setenv("AUTOGEN_NO_PRETUNED", "1")
    pretuned.pretuned_db.cache_clear()
    yield
    monkeypatch.undo()  # a test may have replaced pretuned_db itself
    pretuned.pretuned_db.cache_clear()


def run(db_url, backend=None, quiet=True, **options):
    backend = backend or ReplayBackend(RECORDING)
    tuner = Tuner(PROBLEM, TuneOptions(db_url=db_url, workers=1, **options),
                  progress=(lambda _line: None) if quiet else print,
                  backend_factory=lambda *_args: backend)
    return tuner.run(), backend


def stored(db_url):
    device = ReplayBackend(RECORDING).device
    return TuningDB(db_url).trials(device, "sgemv", "float32", PROBLEM.shape_key)


def test_tpe_stores_every_trial_once_and_the_best_as_winner(db_url):
    result, backend = run(db_url, trials=30)
    trials = stored(db_url)
    assert result.measured + result.failed == 30 == len(trials)
    assert len({t.kernel_name for t in trials}) == 30
    assert backend.evaluator.evaluated[0] == SGEMV.kernel_name("float32", SGEMV.default_config())
    assert len(backend.evaluator.evaluated) == len(set(backend.evaluator.evaluated))
    best = min(t.time_us for t in trials if t.status == "ok")
    winner = TuningDB(db_url).winner(result.device, "sgemv", "float32", PROBLEM.shape_key)
    assert winner.trial.time_us <= best * 1.01 + 1e-9 and winner.peer_name == RECORDING["peer"]["name"]


def test_running_again_resumes_instead_of_starting_over(db_url):
    run(db_url, trials=20)
    first = {t.kernel_name for t in stored(db_url)}
    _, again = run(db_url, trials=20)
    assert again.evaluator.evaluated == []  # nothing measured twice
    _, more = run(db_url, trials=32)
    assert len(more.evaluator.evaluated) == 12 and not first & set(more.evaluator.evaluated)
    assert len(stored(db_url)) == 32


def test_exhaustive_measures_every_point_the_shape_does_not_prune(db_url):
    result, backend = run(db_url, trials=10_000, sampler="exhaustive")
    wanted = [c for c in SGEMV.space.enumerate() if SGEMV.reject_reason(PROBLEM, c) is None]
    wanted.append(SGEMV.default_config())  # the baseline is measured even where the shape prunes it
    assert sorted(backend.evaluator.evaluated) == sorted({SGEMV.kernel_name("float32", c) for c in wanted})
    recorded_ok = {k: min(v["samples_us"]) for k, v in RECORDING["trials"].items() if v["status"] == "ok"}
    assert result.winner.trial.kernel_name in recorded_ok


def test_a_worker_crash_is_a_failed_trial_not_the_end_of_the_run(db_url):
    victim = SGEMV.kernel_name("float32", SGEMV.default_config())  # evaluated first
    backend = ReplayBackend(RECORDING, crash_on=frozenset({victim}))
    result, _ = run(db_url, backend=backend, trials=10)
    failed = [t for t in stored(db_url) if t.status == "failed"]
    assert [t.kernel_name for t in failed] == [victim] and "died" in failed[0].reason
    assert result.worker_restarts == 1 and result.winner.trial.kernel_name != victim


def test_an_interrupt_keeps_completed_trials_and_the_database_consistent(db_url):
    backend = ReplayBackend(RECORDING)
    evaluate = backend.evaluator.evaluate
    calls = []

    def interrupted(name, cubin, params, **kwargs):
        calls.append(name)
        if len(calls) == 6:
            raise KeyboardInterrupt
        return evaluate(name, cubin, params, **kwargs)

    backend.evaluator.evaluate = interrupted
    with pytest.raises(KeyboardInterrupt):
        run(db_url, backend=backend, trials=25)
    assert len(stored(db_url)) == 5  # the trial in flight is the only one lost
    result, resumed = run(db_url, trials=25)
    assert len(stored(db_url)) == 25
    assert not set(calls[:5]) & set(resumed.evaluator.evaluated)  # completed ones are not redone


def test_warm_start_tries_the_nearest_tuned_winner_first(db_url):
    from dbfixtures import store_winner

    device = ReplayBackend(RECORDING).device
    neighbour = {**SGEMV.default_params, "threads_per_row": 8, "vector_width": 2, "unroll": 1}
    store_winner(TuningDB(db_url), device, 16384, 16, params=neighbour)
    store_winner(TuningDB(db_url), device, 16, 4096, params={**SGEMV.default_params, "threads_per_row": 256,
                                                              "warps_per_block": 8})
    _, backend = run(db_url, trials=5)
    assert backend.evaluator.evaluated[0] == SGEMV.kernel_name("float32", SGEMV.space.check(neighbour))
    _, cold = run(db_url.replace("tuning.db", "cold.db"), trials=5, warm_start=False)
    assert cold.evaluator.evaluated[0] == SGEMV.kernel_name("float32", SGEMV.default_config())


def test_same_seed_same_search(db_url):
    _, first = run(db_url, trials=15, seed=7)
    _, second = run(db_url.replace("tuning.db", "again.db"), trials=15, seed=7)
    assert first.evaluator.evaluated == second.evaluator.evaluated


def test_no_winner_says_whether_variants_failed_or_none_was_measured(db_url, tmp_path):
    from autogen.report import tune_summary, tune_table
    lines = []
    # Every variant the recording lacks fails ("not in the recording").
    failing = ReplayBackend({**RECORDING, "trials": {}})
    tuner = Tuner(PROBLEM, TuneOptions(db_url=db_url, workers=1, trials=5), progress=lines.append,
                  backend_factory=lambda *_args: failing)
    result = tuner.run()
    assert result.winner is None and result.failed == 5
    assert result.no_winner == "no variant passed validation (5 failed)"
    assert "none: no variant passed validation (5 failed)" in tune_table(tune_summary(result))
    # A time limit that runs out before the first variant is checked measures nothing: not a
    # validation failure.
    slow = ReplayBackend(RECORDING, delay_s=0.5)
    other = f"sqlite:///{tmp_path / 'other.db'}"
    result = Tuner(PROBLEM, TuneOptions(db_url=other, workers=1, trials=5, timeout_s=0.01),
                   progress=lines.append, backend_factory=lambda *_args: slow).run()
    assert result.winner is None and result.measured == result.failed == 0
    assert tune_summary(result)["no_winner"].startswith("no variant was measured: the time limit ran out")


def test_shipped_winners_seed_a_new_users_search(db_url, monkeypatch):
    # A new user's empty database: the catalog's winner for this very shape (and then its
    # nearest shapes) is measured first; a shape the user has tuned hides the catalog's entry.
    from autogen.catalog import pretuned
    from autogen.search import warmstart
    from autogen.search.warmstart import seeds
    device = ReplayBackend(RECORDING).device
    shipped_params = {**SGEMV.default_params, "threads_per_row": 4, "vector_width": 1, "unroll": 4}
    near_params = {**SGEMV.default_params, "threads_per_row": 8, "vector_width": 2}

    def shipped(shape_key, params):
        trial = TrialRecord(family="sgemv", dtype="float32", shape_key=shape_key, kernel_name="k",
                            params=params, status="ok", time_us=1.0, samples_us=(1.0,), cache_mode="cold")
        return WinnerRecord(device=device, trial=trial, peer_name="", peer_time_us=None, margin=None,
                            autogen_version="0", updated_at="")

    catalog = pretuned.ShippedCatalog([shipped(PROBLEM.shape_key, shipped_params), shipped("m=8192,n=32", near_params)])
    monkeypatch.setattr(warmstart, "pretuned_db", lambda: catalog)
    first = seeds(TuningDB(db_url), device, SGEMV, PROBLEM, warm_start=True)
    assert first[:2] == [shipped_params, near_params]
    assert seeds(TuningDB(db_url), device, SGEMV, PROBLEM, warm_start=False) == [SGEMV.default_params]
    result, backend = run(db_url, trials=3)
    assert backend.evaluator.evaluated[0] == SGEMV.kernel_name("float32", SGEMV.space.check(shipped_params))
    # Now tuned in the user's database: that shape's catalog entry is hidden (its own trials are
    # resumed instead), and the nearest shipped shape comes first.
    assert result.winner is not None
    assert seeds(TuningDB(db_url), device, SGEMV, PROBLEM, warm_start=True)[0] == near_params


def test_a_parameter_added_later_keeps_the_stored_trials_and_winner(db_url, monkeypatch):
    # A new autogen adds a parameter to sgemv (its old behaviour as the default): the trials and
    # the winner stored before keep their kernel names, are resumed rather than measured again,
    # and the new choice is searched under names that say it.
    from autogen.core.space import Param, Space
    first, _ = run(db_url, trials=20)
    grown = Space(SGEMV.space.params + (Param("probe", ("off", "on"), "pb", added_with_default="off"),),
                  SGEMV.space.constraints)
    monkeypatch.setattr(SGEMV, "space", grown)
    winner = TuningDB(db_url).winner(first.device, "sgemv", "float32", PROBLEM.shape_key)
    assert "probe" not in winner.trial.params
    assert SGEMV.kernel_name("float32", grown.check(winner.trial.params)) == winner.trial.kernel_name
    _, again = run(db_url, trials=20)
    assert again.evaluator.evaluated == []  # every stored point is known under its old name
    _, more = run(db_url, trials=40)
    assert len(more.evaluator.evaluated) == 20
    assert any(name.endswith("_pbon") for name in more.evaluator.evaluated)


def test_a_choice_dropped_later_opens_a_new_study_that_learns_what_still_fits(db_url, monkeypatch):
    # A new autogen drops a choice (as gelu dropped cache=stream). Optuna refuses trials whose
    # distributions differ from a study's earlier ones ("does not support dynamic value space"),
    # so each space has its own study, told the stored trials that still fit.
    import dataclasses

    import optuna

    from autogen.search import studies
    from autogen.core.space import Space

    first, _ = run(db_url, trials=12)
    narrowed = Space(tuple(dataclasses.replace(p, choices=("ldg",)) if p.name == "x_path" else p
                           for p in SGEMV.space.params), SGEMV.space.constraints)
    name = studies.study_name(PROBLEM, "cold", first.device, narrowed)
    assert name != studies.study_name(PROBLEM, "cold", first.device, SGEMV.space)
    monkeypatch.setattr(SGEMV, "space", narrowed)
    earlier = {t.kernel_name for t in stored(db_url) if t.params["x_path"] == "ldg"}
    lines = []
    tuner = Tuner(PROBLEM, TuneOptions(db_url=db_url, workers=1, trials=24), progress=lines.append,
                  backend_factory=lambda *_args: ReplayBackend(RECORDING))
    assert tuner.run().measured > 0
    assert not [line for line in lines if "could not be added" in line]
    told = {t.user_attrs.get("kernel") for t in optuna.load_study(study_name=name, storage=db_url).get_trials()}
    fitting = {t.kernel_name for t in stored(db_url) if t.params["x_path"] == "ldg"}
    assert told == fitting and earlier < fitting  # the earlier run's ldg variants and this run's


@pytest.mark.parametrize("tamper", ["params_outside_the_space", "name_from_a_newer_space"])
def test_a_stored_trial_outside_todays_space_never_blocks_tuning(db_url, tamper):
    # Issue 34.1: the fastest stored trial (the winner) holds a choice today's space lacks, as a
    # tampered row or a newer autogen's would. It is skipped and counted once; the search and
    # its finish go on and store a winner of today's space in its place.
    import sqlite3

    run(db_url, trials=8)
    with sqlite3.connect(db_url.removeprefix("sqlite:///")) as connection:
        (trial_id, params, name), = connection.execute(
            "SELECT t.id, t.params, t.kernel_name FROM autogen_winners w JOIN autogen_trials t ON t.id = w.trial_id")
        spoiled = {**json.loads(params), "x_path": "ldg2"}
        new_name = name.replace("_xldg_", "_xldg2_").replace("_xsmem_", "_xldg2_")
        connection.execute("UPDATE autogen_trials SET params = ?, kernel_name = ? WHERE id = ?",
                           (json.dumps(spoiled), new_name if tamper == "name_from_a_newer_space" else name,
                            trial_id))
    lines = []
    backend = ReplayBackend(RECORDING)
    tuner = Tuner(PROBLEM, TuneOptions(db_url=db_url, workers=1, trials=12), progress=lines.append,
                  backend_factory=lambda *_args: backend)
    result = tuner.run()
    assert result.winner is not None and result.winner.trial.params["x_path"] in ("ldg", "smem")
    stored_winner = TuningDB(db_url).winner(result.device, "sgemv", "float32", PROBLEM.shape_key)
    assert stored_winner.trial.kernel_name == result.winner.trial.kernel_name
    assert [line for line in lines if "outside today's space" in line] == [
        "skipped 1 stored trial outside today's space (params not in the family's space, or naming another "
        "kernel than the stored name)"]
    assert len(backend.evaluator.evaluated) >= 4  # the new trials were measured, then a winner stored
