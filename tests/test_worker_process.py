"""The GPU worker process's lifecycle, on the CPU: a stand-in process object."""

from __future__ import annotations

import types

import pytest

from autogen.worker import IsolatedEvaluator
from conftest import gpu_unavailable_reason


def worker_with(process) -> IsolatedEvaluator:
    evaluator = IsolatedEvaluator.__new__(IsolatedEvaluator)  # no process spawned
    evaluator._process = process
    return evaluator


def test_a_discarded_worker_is_killed_and_not_waited_for():
    killed = []
    process = types.SimpleNamespace(is_alive=lambda: True, kill=lambda: killed.append(1),
                                    join=lambda *_: pytest.fail("discard waited for the worker"))
    evaluator = worker_with(process)
    evaluator.discard()
    assert killed == [1] and evaluator._process is None
    evaluator.discard()  # twice: nothing left to stop
    assert killed == [1]


def test_a_worker_that_already_exited_is_not_killed():
    process = types.SimpleNamespace(is_alive=lambda: False, kill=lambda: pytest.fail("killed an exited worker"))
    evaluator = worker_with(process)
    evaluator.discard()
    assert evaluator._process is None


@pytest.mark.skipif(gpu_unavailable_reason() is None, reason="this machine has a GPU: the worker starts")
def test_a_worker_that_cannot_start_says_why_in_one_line():
    # Without CuPy or a GPU the spawned worker's Evaluator fails; the parent raises the error the
    # CLI prints in one line (an AutogenError), not the worker's internal WorkerError.
    from autogen.errors import AutogenError, GpuUnavailableError
    from autogen.family import get_family
    from autogen.worker import WorkSpec

    spec = WorkSpec.of(get_family("sgemv").problem(m=64, n=16), "cold")
    evaluator = IsolatedEvaluator(spec)
    try:
        with pytest.raises(GpuUnavailableError, match="the GPU worker could not start: GpuUnavailableError") as caught:
            evaluator.device
        assert isinstance(caught.value, AutogenError) and "\n" not in str(caught.value)
    finally:
        evaluator.discard()


@pytest.mark.parametrize("cores, workers", [(None, 1), (1, 1), (2, 1), (4, 2), (16, 8), (128, 8)])
def test_default_compile_processes_leave_half_the_cores_to_the_search(monkeypatch, cores, workers):
    from autogen import worker

    monkeypatch.setattr(worker.os, "cpu_count", lambda: cores)
    assert worker.default_workers() == workers
