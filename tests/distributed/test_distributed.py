"""Several tuners on one database: claims, the global budget, take-over of a killed worker, the
shared Optuna study, and several GPUs of one machine (one problem's trials spread over helper
processes), on SQLite and on PostgreSQL.

Tuner processes run tests/support/distributed_worker.py with the replay test aid (timings recorded on an
H100) and an artificial delay per evaluation, so that they overlap as on GPUs. PostgreSQL runs
where AUTOGEN_TEST_POSTGRES_URL names a server (.ci/run starts one); each test gets a database.
"""

from __future__ import annotations

import collections
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path

import optuna
import pytest
from tuning_db import TuningDB, upgrade

from autogen.distributed import multi_gpu as distributed
from autogen.search import dbstats, studies
from autogen.distributed.gpu_option import parse_gpus, resolve_gpus
from autogen.distributed.multi_gpu import MultiGpu
from autogen.errors import UsageError
from autogen.core.registry import get_family
from autogen.testing.replay import ReplayBackend, load
from autogen.search.tuner import TuneOptions
from conftest import checkout_env

HERE = Path(__file__).parent
ASSET = HERE.parent / "assets" / "replay_sgemv_8192x16.json"
if not ASSET.exists():
    pytest.skip(f"recording {ASSET.name} not present", allow_module_level=True)
RECORDING = load(ASSET)
DEVICE = ReplayBackend(RECORDING).device
SGEMV = get_family("sgemv")
PROBLEM = SGEMV.problem(m=8192, n=16)
SERVER = os.environ.get("AUTOGEN_TEST_POSTGRES_URL")
# No claim lapses while its worker lives, however loaded the machine (a heartbeat thread starved
# for a short lease's length let another worker take a live claim over), except in the tests of
# a take-over, where a killed worker's claims lapse after TAKEOVER_LEASE_S.
LEASE_S = 60.0
TAKEOVER_LEASE_S = 5.0


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shared.db'}"
        return
    if not SERVER:
        pytest.skip("AUTOGEN_TEST_POSTGRES_URL is not set")
    from sqlalchemy import create_engine, text

    name = "autogen_dist_" + uuid.uuid4().hex[:12]
    admin = create_engine(SERVER, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    yield SERVER.rsplit("/", 1)[0] + "/" + name
    studies._storages.clear()  # Optuna's engines on the database about to be dropped
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
    admin.dispose()


def spawn(url: str, out: Path, trials: int, delay_s: float, seed: int, gpus: str = "", lease_s: float = LEASE_S,
          parties: int = 0, **popen) -> subprocess.Popen:
    """A tuner process (distributed_worker.py); with ``parties``, its evaluators start measuring
    together with the others of that many (worker or helper processes), meeting beside ``out``."""
    log = open(out.with_suffix(".log"), "w")
    meeting = [gpus, str(out.parent / "meeting"), str(parties)] if parties else [gpus]
    return subprocess.Popen([sys.executable, str(HERE.parent / "support" / "distributed_worker.py"), url, str(trials), str(delay_s),
                             str(lease_s), str(seed), str(out), *meeting], stdout=log, stderr=subprocess.STDOUT,
                            env=checkout_env(), **popen)


def wait_all(processes, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    for process in processes:
        process.wait(max(1, deadline - time.monotonic()))


def consistent(url: str, trials: int, problem=PROBLEM) -> TuningDB:
    """The database after the run: `trials` trials, every claim done and matching a stored trial,
    one winner pointing at an ok trial, and the shared study holding each measured variant."""
    db = TuningDB(url)
    stored = db.trials(DEVICE, "sgemv", "float32", problem.shape_key)
    assert len(stored) == trials == len({t.kernel_name for t in stored})
    claims = db.claims(DEVICE, "sgemv", "float32", problem.shape_key)
    assert all(c.state == "done" for c in claims), [c for c in claims if c.state != "done"]  # no orphan
    assert sorted(c.kernel_name for c in claims) == sorted(t.kernel_name for t in stored)
    winner = db.winner(DEVICE, "sgemv", "float32", problem.shape_key)
    assert winner.trial.status == "ok" and winner.trial.kernel_name in {t.kernel_name for t in stored}
    study = optuna.load_study(study_name=studies.study_name(problem, "cold", DEVICE, SGEMV.space), storage=url)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert sorted(t.user_attrs["kernel"] for t in done) == sorted(t.kernel_name for t in stored)
    return db


def test_processes_share_the_budget_and_measure_each_variant_once(url, tmp_path):
    trials, processes = 24, 3
    upgrade(url)  # as `autogen db upgrade` would; the workers also race to create Optuna's tables
    outs = [tmp_path / f"worker{i}.json" for i in range(processes)]
    running = [spawn(url, out, trials, 0.1, seed=i, parties=processes) for i, out in enumerate(outs)]
    wait_all(running)
    assert [p.returncode for p in running] == [0] * processes, [o.with_suffix(".log").read_text()[-2000:]
                                                                 for o in outs]
    reports = [json.loads(out.read_text()) for out in outs]
    evaluated = [name for r in reports for name in r["evaluated"]]
    duplicates = [name for name, n in collections.Counter(evaluated).items() if n > 1]
    assert duplicates == [] and len(evaluated) == trials  # budget honoured across the processes
    assert sum(1 for r in reports if r["evaluated"]) >= 2  # they did overlap
    consistent(url, trials)
    print(f"\n[distributed {url.split(':')[0]}] processes {processes}, trials {trials}, evaluated "
          f"{len(evaluated)} ({[len(r['evaluated']) for r in reports]}), duplicates {len(duplicates)}")


def test_a_killed_worker_s_trial_is_taken_over(url, tmp_path):
    # 24 trials of 0.3 s over 3 processes: the victim is still searching some 2 s after it
    # stored its first two, the margin this test has to see that and kill it.
    trials, processes = 24, 3
    upgrade(url)
    outs = [tmp_path / f"worker{i}.json" for i in range(processes)]
    running = [spawn(url, out, trials, 0.3, seed=i, lease_s=TAKEOVER_LEASE_S, parties=processes)
               for i, out in enumerate(outs)]
    victim = running[0]
    db = TuningDB(url)
    tag = f":{victim.pid}:"
    held = None
    deadline = time.monotonic() + 60
    while held is None and time.monotonic() < deadline:  # kill it mid-run, while it holds a claim
        mine = [c for c in db.claims(DEVICE, "sgemv", "float32", PROBLEM.shape_key) if tag in c.owner]
        if sum(c.state == "done" for c in mine) >= 2:
            held = next((c for c in mine if c.state == "running"), None)
        if held is None:
            time.sleep(0.02)
    assert held is not None, "the victim never claimed a variant"
    os.kill(victim.pid, signal.SIGKILL)
    killed_at = time.time()
    wait_all(running)
    assert victim.returncode == -signal.SIGKILL
    assert [p.returncode for p in running[1:]] == [0] * (processes - 1)
    db = consistent(url, trials)  # budget honoured, nothing left claimed
    claim = next(c for c in db.claims(DEVICE, "sgemv", "float32", PROBLEM.shape_key) if c.variant == held.variant)
    assert claim.attempts == 2 and tag not in claim.owner  # taken over by a survivor
    survivors = [json.loads(out.read_text()) for out in outs[1:]]
    # The victim may hold several claims when killed (it compiles ahead): each is taken over once.
    taken = [c for c in db.claims(DEVICE, "sgemv", "float32", PROBLEM.shape_key) if c.attempts == 2]
    assert sum(r["taken_over"] for r in survivors) == len(taken) >= 1
    evaluated = [name for r in survivors for name in r["evaluated"]]
    by_victim = {c.kernel_name for c in db.claims(DEVICE, "sgemv", "float32", PROBLEM.shape_key)
                 if tag in c.owner}  # done by the victim before it died
    assert len(evaluated) == len(set(evaluated)) and not by_victim & set(evaluated)
    assert held.kernel_name in evaluated  # the killed worker's trial was measured, not lost
    takeover_line = next(line for out in outs[1:] for line in out.with_suffix(".log").read_text().splitlines()
                         if f"taking over {held.kernel_name}" in line)
    takeover_s = float(takeover_line.split()[0]) - killed_at
    assert takeover_s <= TAKEOVER_LEASE_S + 10.0  # the lease, one poll, and a wide margin for a loaded machine
    print(f"\n[distributed {url.split(':')[0]}] processes {processes}, trials {trials}, duplicates 0, "
          f"killed holding {held.kernel_name}; taken over after {takeover_s:.2f} s (lease {TAKEOVER_LEASE_S} s); "
          f"lost 0; the victim stored {len(by_victim)} before dying")


def test_claims_decide_once_and_expire(url):
    db = TuningDB(url)
    config = SGEMV.default_config()
    name = SGEMV.kernel_name("float32", config)
    from tuning_db.records import TrialRecord

    trial = TrialRecord("sgemv", "float32", PROBLEM.shape_key, name, config.as_dict(), "rejected")
    assert db.claim(DEVICE, trial, "v1", "alice", 60, budget=2).status == "claimed"
    assert db.claim(DEVICE, trial, "v1", "bob", 60, budget=2).status == "taken"
    other = TrialRecord("sgemv", "float32", PROBLEM.shape_key, name + "_x", config.as_dict(), "rejected")
    assert db.claim(DEVICE, other, "v2", "bob", 0.0, budget=2).status == "claimed"  # lapses at once
    assert db.claim(DEVICE, other, "v3", "carol", 60, budget=2).status == "budget"  # lapsed claims count
    got = db.claim(DEVICE, other, "v2", "carol", 60)
    assert (got.status, got.taken_over, got.previous) == ("claimed", True, "bob")
    assert db.renew_claims("carol", 60) == 1 and db.renew_claims("bob", 60) == 0
    ok = TrialRecord("sgemv", "float32", PROBLEM.shape_key, name, config.as_dict(), "ok", time_us=2.0,
                     samples_us=(2.0,), spread_us=0.0)
    db.complete_claim(DEVICE, ok, "v1", "alice")
    assert db.claim(DEVICE, trial, "v1", "bob", 60).status == "done"
    assert db.release_claims("carol") == 1
    assert [(c.variant, c.state) for c in db.claims(DEVICE, "sgemv", "float32", PROBLEM.shape_key)] == [
        ("v1", "done")]


def test_claims_in_a_batch_decide_each_variant_under_one_lock(url):
    from tuning_db.records import TrialRecord

    db = TuningDB(url)
    config = SGEMV.default_config()

    def trial(name):
        return TrialRecord("sgemv", "float32", PROBLEM.shape_key, name, config.as_dict(), "rejected")

    assert db.claim(DEVICE, trial("k_b"), "vb", "bob", 60, budget=4).status == "claimed"
    before = dbstats.snapshot()
    got = db.claim_many(DEVICE, [(trial(f"k_{v}"), f"v{v}") for v in "abcde"], "alice", 60, budget=4)
    spent = dbstats.snapshot().minus(before)
    # b is bob's; a, c, d fill the budget of 4 with bob's claim; e is past it.
    assert [g.status for g in got] == ["claimed", "taken", "claimed", "claimed", "budget"]
    assert spent.transactions == 1  # one lock, one commit for the five
    running = db.claims(DEVICE, "sgemv", "float32", PROBLEM.shape_key, running=True)
    assert sorted((c.variant, c.owner) for c in running) == [("va", "alice"), ("vb", "bob"), ("vc", "alice"),
                                                             ("vd", "alice")]
    assert db.claim_many(DEVICE, [], "alice", 60) == []
    other_shape = TrialRecord("sgemv", "float32", "m=1,n=1", "k_x", config.as_dict(), "rejected")
    with pytest.raises(ValueError, match="one problem"):
        db.claim_many(DEVICE, [(trial("k_f"), "vf"), (other_shape, "vx")], "alice", 60)


# -- several GPUs of one machine (autogen.distributed.multi_gpu) ----------------------------------------------
#
# The first GPU's owners search in this process; every other GPU's owners and every helper search
# in that GPU's agent, a process of its own, whose backends (the replay aid, with its delay) are
# made there: `made` holds the backends of this process only, and the claims name the process
# that measured each variant.


def _multi(url, problems, trials, gpus=(0, 1), delay_s=0.02, helped=(), meet_in=None, **replay):
    """MultiGpu on the replay aid. Each problem of ``helped`` gets a helper process: its owner
    starts measuring together with the helper (a Meeting in the folder ``meet_in``), however
    slowly the helper process starts."""
    made: list = []
    lines: list[str] = []
    options = TuneOptions(db_url=url, trials=trials, workers=1, lease_s=LEASE_S, gpus=gpus)
    factory = ReplayBackend.factory(RECORDING, delay_s=delay_s, made=made, **_meeting(meet_in, helped), **replay)
    results = MultiGpu(problems, options, progress=lines.append, backend_factory=factory).run()
    assert multiprocessing.active_children() == []  # every agent over and reaped
    return results, made, lines


def test_every_gpu_process_compiles_with_a_pool_of_its_own_share(monkeypatch):
    """Each GPU's process (this one and every agent) gets the pool one GPU's tuning gets: by
    default half the cores shared among the GPUs, else --workers as given, per GPU (a total
    split over the GPUs left two GPUs compiling no faster than one)."""
    from autogen.gpu import worker

    monkeypatch.setattr(worker.os, "cpu_count", lambda: 32)
    factory = ReplayBackend.factory(RECORDING)
    default = MultiGpu([PROBLEM], TuneOptions(gpus=(0, 1)), backend_factory=factory)
    assert default.gpu_options.workers == 8 and default.jobs[0].tuner.options.compile_workers() == 8
    assert MultiGpu([PROBLEM], TuneOptions(gpus=(0, 1, 2, 3)), backend_factory=factory).gpu_options.workers == 4
    assert MultiGpu([PROBLEM], TuneOptions(gpus=(0, 1), workers=3), backend_factory=factory).gpu_options.workers == 3


def _meeting(folder, helped) -> dict:
    """ReplayBackend.factory's arguments for the owner and the helper process of each problem of
    ``helped`` to start measuring together, meeting in ``folder``."""
    return {"meet_in": folder, "meet": {problem: 2 for problem in helped}} if helped else {}


def _claims_by_worker(url, problem=PROBLEM) -> dict[tuple[int, str], list[str]]:
    """Kernel names of the problem's claims by the worker that holds or held them: (process id,
    GPU label), as claims.new_owner names it."""
    found = collections.defaultdict(list)
    for claim in TuningDB(url).claims(DEVICE, "sgemv", "float32", problem.shape_key):
        _host, pid, label, _tag = claim.owner.rsplit(":", 3)
        found[(int(pid), label)].append(claim.kernel_name)
    return found


def _helpers(workers: dict) -> list[tuple[int, str]]:
    return [worker for worker in workers if worker[0] != os.getpid()]


def test_one_problem_on_two_gpus_is_searched_by_two_processes_and_retimed_on_one(url, tmp_path):
    # 60 trials (HELP_MIN_TRIALS_LEFT) of 0.06 s: the owner alone would search for 3.6 s, and the
    # helper process starts in about 0.6 s on a quiet machine; the owner waits for it (helped).
    results, made, lines = _multi(url, [PROBLEM], trials=60, delay_s=0.06, helped=[PROBLEM], meet_in=tmp_path)
    (result,) = results
    assert sorted(result.gpus) == [0, 1] and result.measured + result.failed == 60  # the helper's counts added
    (owner,) = made  # the helper made its backend in its own process
    assert owner.device_index == 0 and len(owner.evaluator.retimed) == 1  # finalists re-timed once, by the owner
    workers = _claims_by_worker(url)
    (helper,) = _helpers(workers)
    assert helper[1] == "gpu1" and sorted(workers[(os.getpid(), "gpu0")]) == sorted(owner.evaluator.evaluated)
    assert len(owner.evaluator.evaluated) >= 5 and len(workers[helper]) >= 5  # both measured several
    consistent(url, 60)  # each variant measured once, the budget exact
    assert any(line.startswith("[gpu 1] [") for line in lines)  # the helper's progress, prefixed
    print(f"\n[multi-gpu {url.split(':')[0]}] 1 problem, 60 trials: owner (gpu 0) {len(owner.evaluator.evaluated)}, "
          f"helper process (gpu 1) {len(workers[helper])}")


def test_gpus_of_one_process_split_the_problems_then_the_trials(db_url, monkeypatch, tmp_path):
    # 3 problems on 2 GPUs: one each, then the first GPU done takes the third and the other helps
    # it from a helper process. A budget of 30 is under HELP_MIN_TRIALS_LEFT, lowered for the test
    # (at 0.1 s a trial the third problem alone would take 3 s, ample for a helper's start).
    monkeypatch.setattr(distributed, "HELP_MIN_TRIALS_LEFT", 20)
    problems = [SGEMV.problem(m=8192 + 64 * i, n=16) for i in range(3)]
    results, made, lines = _multi(db_url, problems, trials=30, delay_s=0.1, helped=problems[2:], meet_in=tmp_path)
    # This process made the first GPU's owners' backends only, and each re-timed its problem's
    # finalists once; the second GPU's owner searched in its agent.
    assert made and {b.device_index for b in made} == {0} and all(len(b.evaluator.retimed) == 1 for b in made)
    for problem, result in zip(problems, results):
        consistent(db_url, 30, problem)
        assert result.winner is not None and result.measured + result.failed == 30  # a helper's counts included
        workers = _claims_by_worker(db_url, problem)
        assert {int(label[3:]) for _pid, label in workers} <= set(result.gpus)
        assert all((pid == os.getpid()) == (label == "gpu0") for pid, label in workers)
    assert [p for p in problems if len(_claims_by_worker(db_url, p)) > 1] == [problems[2]]
    assert len(results[2].gpus) == 2
    workers = _claims_by_worker(db_url, problems[2])
    print(f"\n[multi-gpu] 3 problems, 30 trials: the third measured {[len(v) for v in workers.values()]} "
          f"by its owner and a helper process")


def test_no_problems_on_two_gpus_start_nothing(db_url):
    assert _multi(db_url, [], trials=12)[0] == []


def test_a_gpu_that_would_not_help_gets_no_agent(db_url, monkeypatch):
    # One problem of 12 trials on two GPUs: under HELP_MIN_TRIALS_LEFT, the second GPU rests.
    started = []
    monkeypatch.setattr(distributed, "GpuAgent", lambda *args: started.append(args))
    (result,), _made, lines = _multi(db_url, [PROBLEM], trials=12)
    assert started == [] and result.gpus == (0,) and result.measured + result.failed == 12
    assert any("not helping with" in line for line in lines)


def test_small_budgets_get_no_helper_process(db_url):
    # 12 trials: a helper would start when the owner is about done (HELP_MIN_TRIALS_LEFT).
    # 0.1 s a trial (1.2 s a problem): the GPU that finishes its first problem last finds the
    # third still searching on the other GPU, and says it does not help, unless start-up skews
    # the two GPUs by a whole problem. At 0.02 s a trial a loaded 2-core CI machine once did.
    problems = [SGEMV.problem(m=8192 + 64 * i, n=16) for i in range(3)]
    results, made, lines = _multi(db_url, problems, trials=12, delay_s=0.1)
    for problem, result in zip(problems, results):
        consistent(db_url, 12, problem)
        assert result.winner is not None and result.measured + result.failed == 12 and len(result.gpus) == 1
        assert len(_claims_by_worker(db_url, problem)) == 1  # its owner alone
    assert {r.gpus for r in results} == {(0,), (1,)}
    assert {b.device_index for b in made} == {0} and all(b.evaluator.retimed for b in made)
    assert any("not helping with" in line for line in lines)


def _wait_for_helper(url, pid: int, stored: int = 2, problem=PROBLEM):
    """The first claim of ``problem`` that a process other than ``pid`` holds, once it has stored ``stored``."""
    db = TuningDB(url)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        claims = [c for c in db.claims(DEVICE, "sgemv", "float32", problem.shape_key)
                  if f":{pid}:" not in c.owner]
        if sum(c.state == "done" for c in claims) >= stored:
            held = next((c for c in claims if c.state == "running"), None)
            if held is not None:
                return held
        time.sleep(0.02)
    raise AssertionError("no helper process claimed a variant")


def _owner_pid(claim) -> int:
    return int(claim.owner.rsplit(":", 3)[1])


def test_a_killed_helper_process_loses_nothing_and_its_trial_is_taken_over(url, tmp_path):
    # 60 trials of 0.15 s over two processes: seconds of search left once the helper stored two.
    made: list = []
    lines: list[str] = []
    options = TuneOptions(db_url=url, trials=60, workers=1, lease_s=TAKEOVER_LEASE_S, gpus=(0, 1))
    multi = MultiGpu([PROBLEM], options, progress=lines.append,
                     backend_factory=ReplayBackend.factory(RECORDING, delay_s=0.15, made=made,
                                                           **_meeting(tmp_path, [PROBLEM])))
    results: list = []
    runner = threading.Thread(target=lambda: results.extend(multi.run()))
    runner.start()
    held = _wait_for_helper(url, os.getpid())
    os.kill(_owner_pid(held), signal.SIGKILL)
    runner.join(120)
    assert not runner.is_alive() and multiprocessing.active_children() == []
    (result,) = results
    assert result.winner is not None and result.gpus == (0,)  # the helper died before its counts came back
    db = consistent(url, 60)  # the budget exact, nothing left claimed
    claims = db.claims(DEVICE, "sgemv", "float32", PROBLEM.shape_key)
    claim = next(c for c in claims if c.variant == held.variant)
    assert claim.attempts == 2 and _owner_pid(claim) == os.getpid()  # taken over by the owner
    by_helper = [c for c in claims if _owner_pid(c) == _owner_pid(held)]  # stored before it died
    assert result.taken_over >= 1 and result.measured + result.failed == 60 - len(by_helper)
    assert any(line == "[gpu 1] GPU agent died (exit code -9)" for line in lines)
    assert any(line.startswith(f"[gpu 0] taking over {held.kernel_name}") for line in lines)


def test_a_helper_process_that_fails_is_reported_and_its_measurements_kept(db_url, tmp_path):
    # The helper's replayed GPU raises on its 4th evaluation: its search stops, its claims in
    # flight are given back, and its three measurements count.
    results, made, lines = _multi(db_url, [PROBLEM], trials=60, delay_s=0.06, fault_after={1: 3},
                                  helped=[PROBLEM], meet_in=tmp_path)
    (result,) = results
    assert result.winner is not None and sorted(result.gpus) == [0, 1]
    assert result.measured + result.failed == 60
    (helper,) = _helpers(workers := _claims_by_worker(db_url))
    assert len(workers[helper]) == 3
    consistent(db_url, 60)
    assert "[gpu 1] helper failed: RuntimeError: replayed GPU fault after 3 evaluations" in lines


def test_a_problem_whose_owner_fails_in_its_agent_fails_alone(db_url):
    # GPU 1's agent owns the second problem; its replayed GPU raises on the 4th evaluation. That
    # problem fails with the agent's own exception; the first is tuned and stored.
    problems = [SGEMV.problem(m=8192 + 64 * i, n=16) for i in range(2)]
    with pytest.raises(RuntimeError, match="replayed GPU fault after 3 evaluations"):
        _multi(db_url, problems, trials=12, delay_s=0.05, fault_after={1: 3})
    db = TuningDB(db_url)
    assert db.winners(family="sgemv", shape_key=problems[0].shape_key)
    assert not db.winners(family="sgemv", shape_key=problems[1].shape_key)


def test_a_killed_owner_s_agent_fails_its_problem_and_the_gpu_goes_on(url, monkeypatch):
    # The second problem's owner, GPU 1's agent, is killed mid-search: that problem fails (its
    # claims lapse), and the third problem is still tuned, by GPU 0 or by GPU 1's new agent.
    monkeypatch.setattr(distributed, "HELP_MIN_TRIALS_LEFT", 1000)  # owners only
    problems = [SGEMV.problem(m=8192 + 64 * i, n=16) for i in range(3)]
    lines: list[str] = []
    options = TuneOptions(db_url=url, trials=30, workers=1, lease_s=TAKEOVER_LEASE_S, gpus=(0, 1))
    multi = MultiGpu(problems, options, progress=lines.append,
                     backend_factory=ReplayBackend.factory(RECORDING, delay_s=0.15))
    errors: list = []
    runner = threading.Thread(target=lambda: _catch(multi.run, errors))
    runner.start()
    held = _wait_for_helper(url, os.getpid(), problem=problems[1])
    os.kill(_owner_pid(held), signal.SIGKILL)
    runner.join(120)
    assert not runner.is_alive() and multiprocessing.active_children() == []
    (error,) = errors
    assert "the GPU agent of GPU 1 ended during the search" in str(error)
    assert any(line == "[gpu 1] GPU agent died (exit code -9)" for line in lines)
    db = TuningDB(url)
    assert db.winners(family="sgemv", shape_key=problems[0].shape_key)
    assert db.winners(family="sgemv", shape_key=problems[2].shape_key)
    assert not db.winners(family="sgemv", shape_key=problems[1].shape_key)


def _catch(call, errors: list) -> None:
    try:
        call()
    except Exception as exc:
        errors.append(exc)


# A trial's time where a test stops or kills a search mid-run: 60 trials of it leave the
# search running long after a helper has stored two, however slowly the test sees that.
SLOW_S = 0.3


def test_ctrl_c_ends_the_helper_processes(db_url, tmp_path):
    # Ctrl-C reaches the terminal's whole process group; the parent stops its helper (which
    # ignores it), the helper gives its claims back, and the parent reaps it before exiting.
    upgrade(db_url)
    out = tmp_path / "parent.json"
    parent = spawn(db_url, out, 60, SLOW_S, seed=0, gpus="0,1", parties=2, start_new_session=True)
    helper_pid = _owner_pid(_wait_for_helper(db_url, parent.pid))
    os.killpg(parent.pid, signal.SIGINT)
    parent.wait(60)
    assert parent.returncode != 0 and not out.exists()
    assert not Path(f"/proc/{helper_pid}").exists()  # over, and reaped by its parent: no zombie
    claims = TuningDB(db_url).claims(DEVICE, "sgemv", "float32", PROBLEM.shape_key, running=True)
    assert not [c for c in claims if _owner_pid(c) == helper_pid]  # given back, not left to lapse


def test_a_helper_process_whose_parent_is_killed_stops(db_url, tmp_path):
    # The parent killed with SIGKILL ends nothing itself: its helper notices, gives its claims
    # back and exits instead of searching on for nobody.
    upgrade(db_url)
    out = tmp_path / "parent.json"
    parent = spawn(db_url, out, 60, SLOW_S, seed=0, gpus="0,1", parties=2)
    helper_pid = _owner_pid(_wait_for_helper(db_url, parent.pid))
    parent.kill()
    parent.wait(10)
    deadline = time.monotonic() + 20
    while _running(helper_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(helper_pid)
    db = TuningDB(db_url)
    claims = db.claims(DEVICE, "sgemv", "float32", PROBLEM.shape_key, running=True)
    assert not [c for c in claims if _owner_pid(c) == helper_pid]  # given back, not left to lapse
    # It stopped within a poll (0.5 s); searching on, it would have spent the budget (many seconds more).
    assert len(db.trials(DEVICE, "sgemv", "float32", PROBLEM.shape_key)) < 60


def _running(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not: it waits to be reaped by whoever adopted it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_compile_workers_end_with_their_process():
    # A process killed with SIGKILL (a helper process, say) must not leave its compile pool's
    # workers waiting for tasks forever.
    script = ("import os, time\nfrom autogen.gpu.backend import _new_pool\npool = _new_pool(1)\n"
              "print(pool.submit(os.getpid).result(), flush=True)\ntime.sleep(60)\n")
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             env=checkout_env())
    worker = int(owner.stdout.readline())
    assert _running(worker)
    owner.kill()
    owner.wait(10)
    deadline = time.monotonic() + 10
    while _running(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    orphaned = _running(worker)
    if orphaned:
        os.kill(worker, signal.SIGKILL)  # not left behind by a failing test
    assert not orphaned


def test_optuna_reads_the_studies_autogen_writes(db_url):
    _multi(db_url, [PROBLEM], trials=8, gpus=(0, 1))
    summaries = optuna.get_all_study_summaries(storage=db_url)  # what optuna-dashboard lists
    (summary,) = [s for s in summaries if s.study_name == studies.study_name(PROBLEM, "cold", DEVICE, SGEMV.space)]
    assert summary.user_attrs["family"] == "sgemv" and summary.user_attrs["gpu"] == DEVICE.name
    assert summary.user_attrs["shape"] == PROBLEM.shape_key and summary.n_trials == 8
    study = optuna.load_study(study_name=summary.study_name, storage=db_url)
    assert study.best_trial.user_attrs["kernel"].startswith("sgemv_f32_")
    # autogen opens the database holding Optuna's tables, writing or only reading, and upgrades it
    assert TuningDB(db_url, readonly=True).trials(DEVICE, "sgemv", "float32", PROBLEM.shape_key)
    from tuning_db import migrations

    assert upgrade(db_url) == migrations.head_revision()
    assert TuningDB(db_url, upgrade=False).trials(DEVICE, "sgemv", "float32", PROBLEM.shape_key)


def test_gpus_option():
    assert parse_gpus("all") == "all" and parse_gpus("0,2") == (0, 2) and parse_gpus(None) is None
    assert resolve_gpus("all", 2) == (0, 1)
    for bad in ("", "0,,1", "1,1", "gpu0", "-1"):
        with pytest.raises(UsageError):
            parse_gpus(bad)
    with pytest.raises(UsageError, match="numbered 0 to 1"):
        resolve_gpus((0, 2), 2)


def test_cli_refuses_bad_gpus_and_lease(capsys):
    from autogen.cli.main import main

    assert main(["tune", "sgemv", "--m", "64", "--n", "16", "--gpus", "0,0"]) == 2
    assert main(["tune", "sgemv", "--m", "64", "--n", "16", "--lease", "1"]) == 2
    err = capsys.readouterr().err
    assert "--gpus names a GPU twice" in err and "--lease must be between 2 and 3600 seconds, got 1" in err


def _statements(engine):
    """A list that collects the SQL statements ``engine`` runs (until the listener is removed)."""
    from sqlalchemy import event

    seen: list[str] = []

    def count(_conn, _cursor, statement, *_args):
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    return seen, lambda: event.remove(engine, "before_cursor_execute", count)


def test_batched_study_writes_are_optunas_trials(url):
    """add_trials writes the rows Optuna's add_trial writes (numbers, params, values,
    user attributes, times), in a few statements per batch and one more per trial."""
    TuningDB(url)
    rdb = studies.storage(url)
    import random

    from autogen.search.loop import distributions
    from autogen.search.optuna_internals import add_trials

    dists = distributions(SGEMV.space)
    rng = random.Random(3)
    templates = [optuna.trial.create_trial(
        params={name: rng.choice(d.choices) for name, d in dists.items()}, distributions=dists,
        value=value, user_attrs={"kernel": f"k{i}", "status": "ok", "worker": "w"})
        for i, value in enumerate([3.5, 1e9, 2.25, 7.0, 1.0, 4.0])]
    one = studies.open_study(TuningDB(url), "one-by-one", optuna.samplers.RandomSampler(), {})
    batched = studies.open_study(TuningDB(url), "batched", optuna.samplers.RandomSampler(), {})
    for template in templates:
        one.add_trial(template)
    batched.add_trial(templates[0])  # written by Optuna: the batches number after it
    batched_id = rdb.get_study_id_from_name("batched")
    seen, stop = _statements(rdb.engine)
    add_trials(rdb, batched_id, templates[1:2])
    single = len(seen)
    add_trials(rdb, batched_id, templates[2:])
    stop()
    # Optuna's add_trial: ~35 statements for one trial of seven parameters; here one INSERT per
    # trial beside a fixed few (lock, checks, one executemany per child table).
    assert single <= 10 and len(seen) - single <= single + len(templates[2:]) - 1

    def rows(name):
        study = optuna.load_study(study_name=name, storage=url)
        return [(t.number, t.state, t.params, t.distributions, t.values, t.user_attrs, t.datetime_start,
                 t.datetime_complete) for t in study.get_trials()]

    assert rows("batched") == rows("one-by-one")
    other_choices = {**dists, "unroll": optuna.distributions.CategoricalDistribution((1, 3))}
    stranger = optuna.trial.create_trial(params={**templates[0].params, "unroll": 3}, distributions=other_choices,
                                         value=1.0)
    with pytest.raises(ValueError):  # as Optuna refuses a parameter whose choices changed
        add_trials(rdb, batched_id, [stranger])
    assert len(rows("batched")) == len(templates)


def test_a_worker_s_trials_reach_the_shared_study_in_batches(db_url, monkeypatch):
    """SharedStudy.record queues; the writer adds what is queued in one transaction, and close()
    waits for it and counts the trials it could not write."""
    from autogen.search.loop import distributions, make_sampler

    # Writes spaced further apart than the six records can take on a loaded machine: the first
    # record's write, then the rest in one, when close() cuts the wait short.
    monkeypatch.setattr(studies, "FLUSH_S", 60.0)
    monkeypatch.setattr(studies, "MAX_FLUSH_S", 60.0)

    dists = distributions(SGEMV.space)
    db = TuningDB(db_url)
    shared = studies.SharedStudy(db, "batches", make_sampler("tpe", 0, dists), {}, dists, "me",
                                 (DEVICE, "sgemv", "float32", PROBLEM.shape_key, "cold"))
    shared.wait_open()  # opened on the writer thread; its statements are not the writes'
    seen, stop = _statements(studies.storage(db_url).engine)
    configs = [c.as_dict() for c in list(SGEMV.space.enumerate())[:6]]
    for i, params in enumerate(configs):
        shared.record(params, dists, float(i + 1), {"kernel": f"k{i}", "status": "ok"})
    assert shared.close() == 0
    stop()
    assert sum(s.startswith("BEGIN") for s in seen) <= 2  # not one transaction per trial
    study = optuna.load_study(study_name="batches", storage=db_url)
    assert [(t.params, t.value, t.user_attrs["worker"]) for t in study.trials] == [
        (p, float(i + 1), "me") for i, p in enumerate(configs)]

    other = studies.SharedStudy(db, "batches", make_sampler("tpe", 0, dists), {}, dists, "you",
                                (DEVICE, "sgemv", "float32", PROBLEM.shape_key, "cold"))
    changed = {**dists, "unroll": optuna.distributions.CategoricalDistribution((1, 3))}
    other.record({**configs[0], "unroll": 3}, changed, 1.0, {"kernel": "x"})
    other.record({**configs[0], "unroll": 3}, changed, 2.0, {"kernel": "y"})
    assert other.close() == 2  # the batch failed as a whole: both counted, none written
    assert len(optuna.load_study(study_name="batches", storage=db_url).trials) == len(configs)


def _three_trials_written(db, name: str, dists: dict, key: tuple) -> list[dict]:
    """The shared study ``name`` with the space's first three points written by another worker
    (finished, values 1, 2, 3); their params."""
    from autogen.search.loop import make_sampler

    writer = studies.SharedStudy(db, name, make_sampler("tpe", 0, dists), {}, dists, "writer", key)
    configs = [c.as_dict() for c in list(SGEMV.space.enumerate())[:3]]
    for i, params in enumerate(configs):
        writer.record(params, dists, float(i + 1), {"kernel": f"k{i}", "status": "ok"})
    assert writer.close() == 0
    return configs


def test_an_older_autogen_s_trials_are_mirrored_with_an_added_parameter_s_old_behaviour(db_url):
    """A shared study written before a parameter was added: its trials reach the local mirror
    completed (Space.complete), so TPE, which fits only trials holding its whole space, uses them."""
    from autogen.search.loop import distributions, make_sampler
    from autogen.core.space import Param, Space

    old_dists = distributions(SGEMV.space)
    db = TuningDB(db_url)
    key = (DEVICE, "sgemv", "float32", PROBLEM.shape_key, "cold")
    configs = _three_trials_written(db, "grown", old_dists, key)

    grown = Space(SGEMV.space.params + (Param("probe", ("off", "on"), "pb", added_with_default="off"),),
                  SGEMV.space.constraints)
    dists = distributions(grown)
    after = studies.SharedStudy(db, "grown", make_sampler("tpe", 0, dists), {}, dists, "new", key,
                                complete=grown.complete)
    after.refresh()
    mirrored = after.local.get_trials(deepcopy=False)
    assert [t.params for t in mirrored] == [{**p, "probe": "off"} for p in configs]
    assert all(t.distributions == dists for t in mirrored)
    after.close()


def test_a_process_first_tunes_the_problems_no_other_worker_is_searching(db_url):
    """A problem another worker holds live claims of waits until the others are tuned: by then
    that worker is usually done with it. Results still come back in the problems' order."""
    from tuning_db.records import TrialRecord

    db = TuningDB(db_url)
    config = SGEMV.default_config()
    other_problem = SGEMV.problem(m=4096, n=16)
    busy = TrialRecord("sgemv", "float32", PROBLEM.shape_key, "k_bob", config.as_dict(), "rejected")
    assert db.claim(DEVICE, busy, "v_bob", "bob", 60).status == "claimed"
    done, lines = [], []

    def on_result(result):
        done.append(result.problem)
        db.release_claims("bob")  # bob is done with his problem meanwhile

    options = TuneOptions(db_url=db_url, trials=4, workers=1, sampler="random", seed=0)
    results = distributed.tune_problems([PROBLEM, other_problem], options, lines.append,
                                        backend_factory=ReplayBackend.factory(RECORDING), on_result=on_result)
    assert done == [other_problem, PROBLEM]
    assert [r.problem for r in results] == [PROBLEM, other_problem]
    assert all(r.measured + r.failed == 4 for r in results)
    assert any(str(PROBLEM) in line and "another worker" in line for line in lines)


def test_a_process_gives_way_where_another_began_the_problem_at_the_same_moment(db_url):
    """Bob claims his first variant of the problem while this process starts its GPU worker for
    it (neither saw the other before): found before this process's first claim, the problem waits
    for the end of the list, with nothing measured of it meanwhile."""
    from tuning_db.records import TrialRecord

    db = TuningDB(db_url)
    busy = TrialRecord("sgemv", "float32", PROBLEM.shape_key, "k_bob", SGEMV.default_config().as_dict(), "rejected")
    other_problem = SGEMV.problem(m=4096, n=16)
    backends = []

    def factory(*_args, **_kwargs):  # no identity: the first look, before the start, sees nothing
        if not backends:
            assert db.claim(DEVICE, busy, "v_bob", "bob", 60).status == "claimed"
        backends.append(ReplayBackend(RECORDING))
        return backends[-1]

    done, lines = [], []

    def on_result(result):
        done.append((result.problem, result.measured + result.failed))
        db.release_claims("bob")

    options = TuneOptions(db_url=db_url, trials=4, workers=1, sampler="random", seed=0)
    distributed.tune_problems([PROBLEM, other_problem], options, lines.append, backend_factory=factory,
                              on_result=on_result)
    assert done == [(other_problem, 4), (PROBLEM, 4)]
    assert backends[0].evaluator.evaluated == []  # the first start measured nothing
    assert any(str(PROBLEM) in line and "another worker" in line for line in lines)


def test_a_random_sampler_s_mirror_copies_no_other_worker_s_trials(db_url):
    """A random sampler reads no history: its worker's refresh copies neither the other workers'
    finished trials nor their claims, where a TPE worker's copies the finished ones."""
    from autogen.search.loop import distributions, make_sampler

    dists = distributions(SGEMV.space)
    db = TuningDB(db_url)
    key = (DEVICE, "sgemv", "float32", PROBLEM.shape_key, "cold")
    configs = _three_trials_written(db, "history", dists, key)
    mirrored = {}
    for sampler in ("random", "tpe"):
        reader = studies.SharedStudy(db, "history", make_sampler(sampler, 0, dists), {}, dists, sampler, key)
        reader.refresh()
        mirrored[sampler] = [t.params for t in reader.local.get_trials(deepcopy=False)]
        reader.close()
    assert mirrored == {"random": [], "tpe": configs}


class _Finaliser:
    def __init__(self, path):
        self.path = path

    def __del__(self):
        with open(self.path, "w") as marker:
            marker.write("finalised")


def _leave_an_object_to_finalise(path):
    import types
    module = sys.modules["_autogen_test_finalised"] = types.ModuleType("_autogen_test_finalised")
    module.finaliser = _Finaliser(path)  # lives until the interpreter's modules are torn down
    return os.getpid()


def test_compile_workers_leave_without_finalising_the_interpreter(tmp_path):
    # Shutting the pool down waits for its processes; finalising CuPy and NumPy in each of them
    # made every tune wait, for nothing to clean up (docs/history/sessions.md, eighth session).
    from autogen.gpu.backend import _new_pool

    marker = tmp_path / "finalised"
    pool = _new_pool(1)
    pool.submit(_leave_an_object_to_finalise, str(marker)).result()
    pool.shutdown(wait=True)
    assert not marker.exists()


def test_compile_workers_run_at_a_lower_priority_than_the_tuner():
    # Busy compile processes: the GPU worker and the search must not wait behind them.
    from autogen.gpu.backend import COMPILE_NICENESS, _new_pool

    pool = _new_pool(1)
    try:
        assert pool.submit(os.nice, 0).result() == min(19, os.nice(0) + COMPILE_NICENESS)
    finally:
        pool.shutdown(wait=True)


# -- nothing waits forever (issue 34.2) -----------------------------------------------------------


def _dead_claim(url, params, lease_s, spoil=None):
    """A running claim of another worker (killed) on a point of PROBLEM; ``spoil`` (SQL text)
    then replaces its params column as a tampered or foreign row would."""
    from tuning_db.records import TrialRecord

    from autogen.core.render import render
    from autogen.search.claims import body_hash

    config = SGEMV.space.check(params)
    name = SGEMV.kernel_name("float32", config)
    trial = TrialRecord("sgemv", "float32", PROBLEM.shape_key, name, config.as_dict(), "rejected")
    variant = body_hash(render(SGEMV, "float32", config), name)
    assert TuningDB(url).claim(DEVICE, trial, variant, "dead:1:gpu", lease_s).status == "claimed"
    if spoil is not None:
        import sqlite3
        with sqlite3.connect(url.removeprefix("sqlite:///")) as connection:
            connection.execute("UPDATE autogen_claims SET params = ?", (spoil,))
    return name


def _tune_within(url, limit_s: float, **options):
    """Tune PROBLEM on the replay aid in a thread; (result or the exception, progress lines)
    once it ends, failing the test when it runs past ``limit_s``."""
    from autogen.search.tuner import Tuner

    lines, outcome = [], []

    def work():
        try:
            tuner = Tuner(PROBLEM, TuneOptions(db_url=url, workers=1, **options), progress=lines.append,
                          backend_factory=lambda *_args: ReplayBackend(RECORDING))
            outcome.append(tuner.run())
        except BaseException as exc:  # reported by the test
            outcome.append(exc)

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(limit_s)
    assert not thread.is_alive(), f"tune still waiting after {limit_s} s: {lines[-3:]}"
    assert not isinstance(outcome[0], BaseException), outcome[0]
    return outcome[0], lines


NEAR_DEFAULT = {**SGEMV.default_params, "unroll": 4}


@pytest.mark.parametrize("spoil, lease_s", [
    (None, 1e9),  # a worker started with a huge lease, killed while holding a claim
    (json.dumps({**NEAR_DEFAULT, "x_path": "ldg2"}), 0.0),  # lapsed, outside today's space
    ("{not json", 0.0),
    ("[4, 4, 4]", 0.0),
    ("{not json", 1e9),  # unreadable and held: released, not waited for
], ids=["huge_lease", "outside_the_space", "not_json", "json_list", "not_json_held"])
def test_a_dead_or_unreadable_claim_is_never_waited_for(tmp_path, spoil, lease_s):
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    name = _dead_claim(url, NEAR_DEFAULT, lease_s, spoil)
    result, lines = _tune_within(url, 30, trials=4, lease_s=LEASE_S)
    assert result.winner is not None
    claims = TuningDB(url).claims(DEVICE, "sgemv", "float32", PROBLEM.shape_key, running=True)
    assert claims == []  # taken over and measured, or released
    if spoil is None:
        assert any(f"taking over {name} from dead:1:gpu" in line for line in lines)
    else:
        assert any(f"released dead:1:gpu's claim of {name}: it is not a point" in line for line in lines)


def test_timeout_bounds_the_wait_for_other_workers(tmp_path):
    # Another worker holds a live claim for longer than the time limit: tune stops waiting there.
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    _dead_claim(url, NEAR_DEFAULT, 120.0)
    started = time.monotonic()
    result, lines = _tune_within(url, 40, trials=4, lease_s=LEASE_S, timeout_s=1.0)
    assert time.monotonic() - started < 30 and result.winner is not None
    assert any("the time limit is up: not waiting for 1 variant(s) other workers hold" in line for line in lines)


def test_the_lease_has_an_upper_bound():
    from autogen.search.tuner import check_options

    from autogen.search.lease import MAX_LEASE_S

    with pytest.raises(UsageError, match=f"--lease must be between 2 and {MAX_LEASE_S:g} seconds"):
        check_options(TuneOptions(lease_s=1e9))
    check_options(TuneOptions(lease_s=MAX_LEASE_S))
