"""`autogen tune` spawns its GPUs' work before its own imports: the first GPU's worker and, on
several GPUs, the other GPUs' agents (autogen.distributed.gpu_agent.start_agents_early), which the
run then adopts; what no run adopts is ended. No GPU here: the worker and agents are stand-ins."""

from __future__ import annotations

import types

import pytest

from autogen.cli import tuning
from autogen.core.registry import get_family
from autogen.distributed import gpu_agent
from autogen.distributed import multi_gpu
from autogen.distributed.gpu_agent import agents_first_problems
from autogen.gpu import backend, device
from autogen.gpu.evaluator import WorkSpec
from autogen.gpu.worker import default_workers
from autogen.search.tuner import TuneOptions

SGEMV = get_family("sgemv")
PROBLEMS = [SGEMV.problem(m=1024 * (i + 1), n=16) for i in range(3)]


def test_each_gpu_after_the_first_starts_with_the_problem_it_will_own_or_help():
    assert agents_first_problems((0, 1), PROBLEMS, 60) == {1: PROBLEMS[1]}
    # GPUs left over help with the first problem, where the budget pays off a helper's start.
    assert agents_first_problems((0, 1, 2, 3), PROBLEMS[:2], 60) == {1: PROBLEMS[1], 2: PROBLEMS[0],
                                                                     3: PROBLEMS[0]}
    assert agents_first_problems((0, 1, 2), PROBLEMS[:1], 59) == {}
    assert agents_first_problems((0, 1, 2), PROBLEMS[:1], 20, help_min_trials=20) == {1: PROBLEMS[0],
                                                                                      2: PROBLEMS[0]}
    assert agents_first_problems((2, 5), PROBLEMS, 10) == {5: PROBLEMS[1]}
    assert agents_first_problems((0, 1), [], 60) == {}


class StandInAgent:
    def __init__(self, device_index, warm=None):
        self.device_index, self.warm = device_index, warm
        self.sent, self.ended, self.exited = [], False, False

    def send(self, message):
        self.sent.append(message)

    def end(self, grace_s=0.0):
        self.ended = True


@pytest.fixture
def gpus_here(monkeypatch):
    """Two GPUs as the driver would report them, CuPy installed; what would be spawned, recorded."""
    prestarted = []
    monkeypatch.delenv("AUTOGEN_NO_PRESTART", raising=False)
    monkeypatch.setattr(tuning, "installed_file", lambda package: f"/site/{package}/__init__.py")
    monkeypatch.setattr(device, "driver_device_count", lambda: 2)
    monkeypatch.setattr(backend, "prestart", lambda spec, workers, timeout_s: prestarted.append((spec, workers)))
    monkeypatch.setattr(gpu_agent, "GpuAgent", StandInAgent)
    monkeypatch.setattr(gpu_agent, "_early", {})
    return prestarted


def _args(**overrides):
    return types.SimpleNamespace(**{"workers": None, "cache": "cold", "eval_timeout": 60.0, "trials": 60,
                                    **overrides})


def test_tune_on_two_gpus_spawns_the_first_gpu_s_worker_and_the_second_s_agent_at_once(gpus_here):
    tuning._start_gpu_work_early(_args(), PROBLEMS[:2], "all")
    assert gpus_here == [(WorkSpec.of(PROBLEMS[0], "cold", 0), default_workers(2))]
    agent = gpu_agent._early[1]
    assert agent.warm.spec == WorkSpec.of(PROBLEMS[1], "cold", 1) and agent.warm.workers == default_workers(2)
    assert gpu_agent.adopt_early_agent(1) is agent and gpu_agent.adopt_early_agent(1) is None


def test_early_work_no_run_takes_is_ended(gpus_here):
    tuning._start_gpu_work_early(_args(workers=3), PROBLEMS[:2], (1, 0))
    assert gpus_here == [(WorkSpec.of(PROBLEMS[0], "cold", 1), 3)]  # the first GPU named
    left = gpu_agent._early[0]
    tuning._discard_early_work()
    assert left.sent == [None] and left.ended and gpu_agent._early == {}


@pytest.mark.parametrize("gpus", ["0", (0, 3)])
def test_one_gpu_or_gpus_the_driver_lacks_start_no_agent(gpus_here, gpus):
    tuning._start_gpu_work_early(_args(), PROBLEMS, tuning.parse_gpus(gpus) if isinstance(gpus, str) else gpus)
    assert gpu_agent._early == {}
    # --gpus 0: its worker, on GPU 0 (a GPU the driver lacks: nothing; the tuner says so later)
    assert gpus_here == ([(WorkSpec.of(PROBLEMS[0], "cold", 0), default_workers(1))] if gpus == "0" else [])


def test_without_a_driver_nothing_is_spawned(gpus_here, monkeypatch):
    def no_driver():
        raise RuntimeError("cuInit failed with CUDA error 100")

    monkeypatch.setattr(device, "driver_device_count", no_driver)
    tuning._start_gpu_work_early(_args(), PROBLEMS, "all")
    assert gpus_here == [] and gpu_agent._early == {}


def test_a_run_on_two_gpus_adopts_the_agent_spawned_early(gpus_here, monkeypatch, tmp_path):
    started = []
    monkeypatch.setattr(multi_gpu, "GpuAgent", lambda *args: started.append(StandInAgent(*args)) or started[-1])
    early = gpu_agent._early[1] = StandInAgent(1)
    options = TuneOptions(db_url=f"sqlite:///{tmp_path / 't.db'}", gpus=(0, 1), workers=1)
    multi = multi_gpu.MultiGpu(PROBLEMS[:2], options)
    assert multi._agent(1, PROBLEMS[1]) is early and multi._agent(1) is early and started == []
    early.exited = True  # it died: a new agent, not the early one again
    assert multi._agent(1) is started[0] and started[0].warm.spec == WorkSpec.of(PROBLEMS[0], "cold", 1)
