"""The tuning engine on a real GPU: faulting and hanging variants, kill -9 and resume."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.gpu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_faulting_and_hanging_variants_do_not_end_the_run(db_url, capsys):
    import fault_family  # noqa: F401  (registers faulty_double here; the worker imports it too)
    from autogen.core.registry import get_family
    from autogen.search.tuner import TuneOptions, tune

    problem = get_family("fault_family.faulty_double").problem(n=100000)
    result = tune(problem, TuneOptions(trials=3, sampler="exhaustive", db_url=db_url, workers=2,
                                       eval_timeout_s=15))
    from tuning_db import TuningDB
    trials = {t.params["behaviour"]: t for t in TuningDB(db_url).trials(
        result.device, "fault_family.faulty_double", "float32", problem.shape_key)}
    for behaviour, trial in sorted(trials.items()):
        print(f"{behaviour:>6}: {trial.status:<6} {trial.reason[:150]}")
    print(f"worker restarts: {result.worker_restarts}; winner: {result.winner.trial.kernel_name}")
    assert trials["ok"].status == "ok"
    assert trials["fault"].status == "failed" and "illegal" in trials["fault"].reason.lower()
    assert trials["hang"].status == "failed" and "timed out" in trials["hang"].reason
    assert result.winner.trial.params == {"behaviour": "ok"}
    assert result.worker_restarts >= 2


def count_trials(path) -> int:
    with sqlite3.connect(path) as connection:
        try:
            return connection.execute("SELECT COUNT(*) FROM autogen_trials WHERE status != 'rejected'").fetchone()[0]
        except sqlite3.OperationalError:  # tables not created yet
            return 0


def test_kill_9_loses_at_most_the_trial_in_flight_and_the_same_command_resumes(tmp_path):
    db = tmp_path / "resume.db"
    command = [sys.executable, "-m", "autogen", "tune", "sgemv", "--m", "4096", "--n", "64",
               "--trials", "40", "--db", str(db), "--workers", "4"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               start_new_session=True)
    deadline = time.monotonic() + 120
    while count_trials(db) < 8 and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)  # the tuner, its GPU worker and its compile pool
    process.wait()
    kept = count_trials(db)
    assert 8 <= kept < 40
    with sqlite3.connect(db) as connection:
        assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        duplicates = connection.execute(
            "SELECT COUNT(*) FROM (SELECT kernel_name FROM autogen_trials GROUP BY gpu_id, shape_key, "
            "kernel_name, cache_mode HAVING COUNT(*) > 1)").fetchone()[0]
        assert duplicates == 0
    again = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    print(again.stderr[-2000:])
    assert again.returncode == 0
    assert f"resuming: {kept}" in again.stderr or "resuming:" in again.stderr
    assert count_trials(db) == 40  # the budget is the study's, not each run's


def test_a_shape_too_large_for_gpu_memory_is_a_usage_error(db_url, capsys):
    from autogen.cli.main import main

    assert main(["tune", "sgemv", "--m", "2000000000", "--n", "100000", "--db", db_url, "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert "GiB of GPU memory" in err and "Traceback" not in err


def test_the_next_problem_of_a_run_is_served_by_the_same_gpu_worker(db_url):
    # One GPU worker for the problems of a process (autogen.gpu.backend._keep): the second
    # problem's worker takes it up (gpu_Serve) with no start of its own, and lets go of the first
    # problem's input sets (its memory) on the way; both problems validate and get a winner.
    from autogen.core.registry import get_family
    from autogen.distributed.multi_gpu import tune_problems
    from autogen.search.tuner import TuneOptions

    family = get_family("sgemv")
    problems = [family.problem(m=4096, n=16), family.problem(m=16384, n=128)]
    results = tune_problems(problems, TuneOptions(trials=3, db_url=db_url, workers=2, sampler="random", seed=0),
                            lambda _line: None)
    assert all(result.winner is not None for result in results)
    second = results[1].phases_s
    assert "gpu_Serve" in second and "gpu_worker_boot" not in second and results[1].worker_restarts == 0
