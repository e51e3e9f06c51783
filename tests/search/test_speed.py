"""Tuning speed and stale winners on the CPU: a completed search answered from the database
without starting a backend, early stop of clear losers, the timing graph's plan, stale winners
re-timed (--refresh), and `autogen list` marking them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from tuning_db import TuningDB

from autogen.gpu import measure
from autogen.catalog.environment import stale_reasons, winner_source_hash
from autogen.core.registry import get_family
from autogen.testing.replay import ReplayBackend, load
from autogen.search.tuner import TuneOptions, Tuner
from dbfixtures import H100, store_winner

ASSET = Path(__file__).parent.parent / "assets" / "replay_sgemv_8192x16.json"
SGEMV = get_family("sgemv")
PROBLEM = SGEMV.problem(m=8192, n=16)


@pytest.fixture(scope="module")
def recording():
    if not ASSET.exists():
        pytest.skip(f"recording {ASSET.name} not present")
    return load(ASSET)


class Counting:
    """ReplayBackend.factory that counts the backends started."""

    def __init__(self, recording):
        self.recording, self.started = recording, 0
        self.identity = ReplayBackend.factory(recording).identity

    def __call__(self, *args):
        self.started += 1
        self.backend = ReplayBackend(self.recording)
        return self.backend


def tune(db_url, factory, **options):
    return Tuner(PROBLEM, TuneOptions(db_url=db_url, workers=1, **options), progress=lambda _l: None,
                 backend_factory=factory).run()


def test_a_completed_search_is_answered_from_the_database(db_url, recording):
    factory = Counting(recording)
    first = tune(db_url, factory, trials=15)
    assert factory.started == 1 and first.measured + first.failed == 15
    again = tune(db_url, factory, trials=15)
    assert factory.started == 1  # no backend, no worker, no compile pool, no Optuna
    assert again.winner == first.winner and again.measured == 0 and again.reused >= 15
    assert set(again.phases_s) == {"database"}
    more = tune(db_url, factory, trials=18)  # a larger budget has something to measure
    assert factory.started == 2 and more.measured + more.failed == 3


def test_clear_losers_stop_after_two_replays():
    assert measure.sample_until(iter([10.0, 11.0, 9.0, 9.5]).__next__, 4, 6.0) == (10.0, 11.0)
    assert measure.sample_until(iter([5.0, 5.1, 5.2]).__next__, 3, 6.0) == (5.0, 5.1, 5.2)
    assert measure.sample_until(iter([5.0, 9.0, 9.0]).__next__, 3, None) == (5.0, 9.0, 9.0)


def test_the_search_passes_the_best_so_far(db_url, recording):
    result = tune(db_url, Counting(recording), trials=40, sampler="random")
    trials = TuningDB(db_url).trials(result.device, "sgemv", "float32", PROBLEM.shape_key)
    ok = [t for t in trials if t.status == "ok"]
    short = [t for t in ok if len(t.samples_us) == measure.EARLY_REPLAYS]
    assert short, "no variant stopped early"
    best = min(t.time_us for t in ok)
    assert all(t.time_us > best * measure.EARLY_FACTOR for t in short)
    assert len(result.winner.trial.samples_us) > measure.EARLY_REPLAYS


def test_one_graph_serves_probe_and_timing():
    assert measure.graph_plan(183) == (183, 1)
    assert measure.graph_plan(1) == (measure.MIN_GRAPH_LAUNCHES, 1)
    launches, repeats = measure.graph_plan(183, 2.5)  # TARGET_REPLAY_US / 2.5 launches wanted
    assert launches == 183 and repeats == round(measure.TARGET_REPLAY_US / 2.5 / 183) >= 2
    assert measure.graph_plan(1, 0.1)[1] * measure.MIN_GRAPH_LAUNCHES <= measure.MAX_LAUNCHES + 128


def test_stale_reasons_name_what_changed():
    db_winner = _winner()
    assert stale_reasons(db_winner, db_winner.trial.source_hash, H100, "0.1.0") == ()
    newer = dataclasses.replace(H100, driver_version=13010, nvrtc_version="13.1")
    assert stale_reasons(db_winner, "other", newer, "0.2.0") == (
        "template changed", "driver 13.0 -> 13.1", "nvrtc 13.0 -> 13.1", "autogen 0.1.0 -> 0.2.0")
    assert stale_reasons(db_winner, None, None, "0.1.0") == ()
    assert winner_source_hash(SGEMV, db_winner) == db_winner.trial.source_hash


def _winner(db_url=None):
    import tempfile
    path = db_url or f"sqlite:///{tempfile.mkdtemp()}/w.db"
    return store_winner(TuningDB(path), H100, 4096, 16)


def test_a_stale_winner_is_refreshed_then_answered(db_url, recording):
    factory = Counting(recording)
    first = tune(db_url, factory, trials=12)
    # the same GPU with a newer driver: every stored measurement is stale
    newer = dict(recording, device={**recording["device"], "driver_version": recording["device"]["driver_version"] + 10})
    factory_newer = Counting(newer)
    refreshed = tune(db_url, factory_newer, trials=12)
    assert factory_newer.started == 1 and refreshed.measured == 0
    evaluated = factory_newer.backend.evaluator.evaluated
    assert 1 <= len(evaluated) <= 6 and first.winner.trial.kernel_name in evaluated
    device = factory_newer.identity()
    winner = TuningDB(db_url).winner(device, "sgemv", "float32", PROBLEM.shape_key)
    assert winner.device.driver_version == device.driver_version  # measured here now
    assert stale_reasons(winner, winner_source_hash(SGEMV, winner), device) == ()
    tune(db_url, factory_newer, trials=12)
    assert factory_newer.started == 1  # fresh again: answered from the database


def test_list_marks_stale_winners(db_url, capsys, monkeypatch):
    from autogen.gpu import device as gpu
    from autogen.catalog import pretuned
    from autogen.cli.main import main

    monkeypatch.setenv("AUTOGEN_NO_PRETUNED", "1")
    pretuned.pretuned_db.cache_clear()
    # The local GPU is the winners' own, in the environment they were measured in (on a real H100
    # the running CUDA runtime would differ from the fixture's and mark them stale too).
    monkeypatch.setattr(gpu, "device_identity", lambda: H100)
    db = TuningDB(db_url)
    store_winner(db, H100, 4096, 16)
    old = store_winner(db, H100, 1024, 16)
    import sqlite3
    with sqlite3.connect(db_url.removeprefix("sqlite:///")) as connection:
        connection.execute("UPDATE autogen_winners SET autogen_version = '0.0.9' WHERE shape_key = 'm=1024,n=16'")
        connection.execute("UPDATE autogen_trials SET source_hash = 'old' WHERE shape_key = 'm=1024,n=16'")
    assert main(["list", "--json", "--db", db_url]) == 0
    rows = {r["shape"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["m=4096,n=16"]["stale"] == []
    assert rows["m=1024,n=16"]["stale"] == ["template changed", "autogen 0.0.9 -> 0.1.0"]
    assert main(["list", "--db", db_url]) == 0
    assert "template changed; autogen 0.0.9 -> 0.1.0" in capsys.readouterr().out
    assert old.trial.kernel_name
    pretuned.pretuned_db.cache_clear()


def test_a_long_kernel_is_timed_on_one_pass_over_its_sets(monkeypatch):
    """A GEMM of milliseconds in a graph of MIN_GRAPH_LAUNCHES launches makes every sample long:
    a kernel that long is timed on the first graph (one pass over the sets), short ones as before."""
    built = []

    class FakeTimer:
        def __init__(self, _cupy, _enqueue, _n_sets, launches):
            self.launches, self.repeats = launches, 1
            built.append(launches)

        def replay_us(self):
            return per_launch_us

    monkeypatch.setattr(measure, "GraphTimer", FakeTimer)
    per_launch_us = 3000.0
    timer = measure.build_timer(None, lambda i: None, 2)
    assert built == [2] and timer.launches == 2 and timer.repeats == 1
    built.clear()
    per_launch_us = 2.0
    timer = measure.build_timer(None, lambda i: None, 2)
    assert built == [2, measure.MIN_GRAPH_LAUNCHES] and timer.launches == measure.MIN_GRAPH_LAUNCHES
    assert timer.repeats == round(measure.TARGET_REPLAY_US / 2.0 / measure.MIN_GRAPH_LAUNCHES)  # ~TARGET_REPLAY_US per sample


def _thread_settings() -> dict:
    import os
    return {name: os.environ.get(name)
            for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUPY_NVRTC_USE_PCH")}


def test_children_start_with_one_blas_thread_and_cupy_s_precompiled_headers_and_the_parent_is_unchanged(
        monkeypatch):
    import multiprocessing
    import os

    from autogen.gpu.worker import child_environment

    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.delenv("CUPY_NVRTC_USE_PCH", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's own choice is kept
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:  # spawned outside: the parent's environment as it is
        assert pool.apply(_thread_settings)["OPENBLAS_NUM_THREADS"] is None
    with child_environment():
        pool = context.Pool(1)
    with pool:
        seen = pool.apply(_thread_settings)
    assert seen == {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "1",
                    "CUPY_NVRTC_USE_PCH": "1"}
    assert "OPENBLAS_NUM_THREADS" not in os.environ and os.environ["OMP_NUM_THREADS"] == "3"
    assert "CUPY_NVRTC_USE_PCH" not in os.environ


# Run in a fresh interpreter: `autogen tune` answered from the database, the GPU's identity
# given (as the driver and the stack record give it on a GPU machine), then the libraries that
# were imported.
WARM_ANSWER = r"""
import json, sys
from pathlib import Path
from tuning_db.records import DeviceIdentity
from autogen.cli.main import main
from autogen.gpu import device as gpu
device = DeviceIdentity(**json.loads(Path(sys.argv[1]).read_text())["device"])
gpu.require_gpu = lambda: None
gpu.identity_for_lookup = lambda: device
code = main(["tune", "sgemv", "--m", "8192", "--n", "16", "--trials", "12", "--db", sys.argv[2]])
print(json.dumps({"code": code, "modules": sorted({m.split(".")[0] for m in sys.modules})}))
"""
# What the answer from the database must not import: the GPU's, the search's and the
# progress bars' libraries, Alembic (a database at the head revision needs no migration).
NOT_ON_THE_WARM_PATH = {"cupy", "optuna", "alembic", "tqdm", "torch"}


def test_a_warm_answer_imports_no_gpu_search_or_migration_library(db_url, recording, tmp_path, monkeypatch):
    import subprocess
    import sys

    from conftest import checkout_env

    tune(db_url, Counting(recording), trials=12)
    env = {**checkout_env(), "AUTOGEN_NO_PRESTART": "1", "AUTOGEN_NO_PRETUNED": "1"}

    def answer() -> dict:
        done = subprocess.run([sys.executable, "-c", WARM_ANSWER, str(ASSET), db_url], env=env, text=True,
                              capture_output=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "answered from the database" in done.stderr
        return json.loads(done.stdout.splitlines()[-1])

    first = answer()  # renders the winner for the stale check, and remembers its source hash
    assert first["code"] == 0 and not NOT_ON_THE_WARM_PATH & set(first["modules"])
    again = answer()
    assert again["code"] == 0 and not (NOT_ON_THE_WARM_PATH | {"jinja2"}) & set(again["modules"])
