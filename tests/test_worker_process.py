"""The GPU worker process's lifecycle, on the CPU: a stand-in process object."""

from __future__ import annotations

import types

import pytest

from autogen.worker import IsolatedEvaluator


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
