"""The GPU worker process's lifecycle, on the CPU: a stand-in process object."""

from __future__ import annotations

import time
import types

import pytest

from autogen.gpu.worker import IsolatedEvaluator
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
    from autogen.core.registry import get_family
    from autogen.gpu.evaluator import WorkSpec

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
    from autogen.gpu import worker

    monkeypatch.setattr(worker.os, "cpu_count", lambda: cores)
    assert worker.default_workers() == workers


@pytest.mark.parametrize("cores, gpus, workers", [(16, 2, 4), (32, 2, 8), (64, 2, 8), (32, 4, 4), (2, 2, 1), (None, 8, 1)])
def test_each_gpu_gets_its_share_of_the_cores_for_compiling(monkeypatch, cores, gpus, workers):
    from autogen.gpu import worker
    from autogen.search.tuner import TuneOptions

    monkeypatch.setattr(worker.os, "cpu_count", lambda: cores)
    assert worker.default_workers(gpus) == workers
    assert TuneOptions(gpus=tuple(range(gpus))).compile_workers() == workers
    assert TuneOptions(gpus=tuple(range(gpus)), workers=3).compile_workers() == 3  # --workers: per GPU, as given


# -- a parent that is gone before its worker speaks (issue 34, point 12) ----------------------------


def _spec():
    from autogen.core.registry import get_family
    from autogen.gpu.evaluator import WorkSpec

    return WorkSpec.of(get_family("sgemv").problem(m=64, n=16), "cold")


class _StandInEvaluator:
    """TEST AID: the worker's Evaluator without a GPU; fails to start when `fail` is set."""

    fail = False

    def __init__(self, spec):
        if self.fail:
            raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")
        self.context_lost = False

    def identity(self):
        return "device", 0, {}

    def serve(self, request):
        return "answer"

    def prepare(self):
        prepared.append(self)


prepared: list = []  # the _StandInEvaluators whose prepare() ran, in order


@pytest.mark.parametrize("fails_to_start", [True, False])
def test_a_worker_whose_parent_left_ends_quietly(monkeypatch, fails_to_start):
    # The race of a no-GPU `autogen tune`: the parent prints its own "no GPU" error and exits
    # while the prestarted worker is still starting; the worker's message then meets a closed pipe.
    import multiprocessing

    from autogen.gpu import worker

    monkeypatch.setattr(_StandInEvaluator, "fail", fails_to_start)
    monkeypatch.setattr(worker, "Evaluator", _StandInEvaluator)
    parent_end, child_end = multiprocessing.Pipe()
    parent_end.close()
    assert worker._worker_main(child_end, _spec()) is None  # no BrokenPipeError


def test_a_worker_whose_parent_left_mid_request_ends_quietly(monkeypatch):
    from autogen.gpu import worker

    monkeypatch.setattr(worker, "Evaluator", _StandInEvaluator)

    class LeavesAfterAsking:  # the child's end of a pipe whose parent asks once, then is gone
        def __init__(self):
            self.sent, self.asked = [], False

        def send(self, message):
            if self.asked:
                raise BrokenPipeError(32, "Broken pipe")
            self.sent.append(message)

        def poll(self, timeout=None):
            return not self.asked  # its one request is waiting from the start

        def recv(self):
            if self.asked:
                raise EOFError
            self.asked = True
            return worker.StagesSpent()

    conn = LeavesAfterAsking()
    before = time.time()
    assert worker._worker_main(conn, _spec()) is None
    [(status, (device, free, startup, entered_at), usable)] = conn.sent
    assert (status, device, free, startup, usable) == ("ok", "device", 0, {}, True)
    assert before <= entered_at <= time.time()  # when the child began: the parent times its boot from it


class _Scripted:
    """TEST AID: the child's end of a pipe whose parent sends ``requests`` in turn, each waiting
    already (``waiting``) or sent later; None ends the worker."""

    def __init__(self, requests, waiting: bool):
        self.requests, self.waiting, self.sent = list(requests), waiting, []

    def send(self, message):
        self.sent.append(message)

    def poll(self, timeout=None):
        return self.waiting

    def recv(self):
        prepared.append(("asked", self.requests[0]))
        return self.requests.pop(0)


@pytest.mark.parametrize("waiting", [False, True])
def test_a_new_worker_prepares_for_its_problem_only_while_nothing_is_asked(monkeypatch, waiting):
    from autogen.gpu import worker

    monkeypatch.setattr(worker, "Evaluator", _StandInEvaluator)
    prepared.clear()
    worker._worker_main(_Scripted([worker.StagesSpent(), None], waiting), _spec())
    kinds = [entry if isinstance(entry, tuple) else "prepared" for entry in prepared]
    expected = [("asked", worker.StagesSpent()), ("asked", None)]
    assert kinds == (expected if waiting else ["prepared"] + expected)


def test_a_kept_worker_prepares_for_a_problem_it_takes_up_but_not_at_rest(monkeypatch):
    from autogen.gpu import worker

    monkeypatch.setattr(worker, "Evaluator", _StandInEvaluator)
    spec = _spec()
    conn = _Scripted([worker.Serve(spec), worker.Serve(spec, prepare=True), None], waiting=False)
    prepared.clear()
    worker._worker_main(conn, spec)
    kinds = [entry[1] if isinstance(entry, tuple) else "prepared" for entry in prepared]
    # at its start, then after taking up a problem; after a rest (Serve without prepare), not
    assert kinds == ["prepared", worker.Serve(spec), worker.Serve(spec, prepare=True), "prepared", None]


def test_the_parent_counts_the_workers_boot_imports_and_context():
    class Answers:  # the parent's end of the pipe: the child's first message, already sent
        def poll(self, timeout=None):
            return True

        def recv(self):
            return ("ok", ("device", 123, {"worker_imports": 1.5, "worker_context": 0.5, "worker_device": 0.1},
                           1000.75), True)

    evaluator = worker_with(types.SimpleNamespace(is_alive=lambda: True))
    evaluator._conn, evaluator._identity, evaluator._spawned_at = Answers(), None, 1000.0
    evaluator.waited_s, evaluator.restarts = {}, 0
    assert evaluator.free_bytes == 123
    assert {k: evaluator.waited_s[k] for k in ("worker_boot", "worker_imports", "worker_context", "worker_device")} \
        == {"worker_boot": 0.75, "worker_imports": 1.5, "worker_context": 0.5, "worker_device": 0.1}
    assert "startup_wait" in evaluator.waited_s


def test_a_tune_without_a_gpu_stops_its_prestarted_worker(monkeypatch, capsys):
    from autogen.gpu import backend, device as gpu
    from autogen.cli import tuning
    from autogen.cli.main import main
    from autogen.errors import GpuUnavailableError

    stopped = []
    monkeypatch.setattr(tuning, "_start_gpu_work_early", lambda args, problems, gpus: backend._prestarted.update(
        evaluator=types.SimpleNamespace(discard=lambda: stopped.append(problems[0]))))

    def no_gpu():
        raise GpuUnavailableError("no NVIDIA GPU or driver found")

    monkeypatch.setattr(gpu, "require_gpu", no_gpu)
    assert main(["tune", "sgemv", "--m", "64", "--n", "16"]) == 1
    assert "no NVIDIA GPU" in capsys.readouterr().err
    assert len(stopped) == 1 and backend._prestarted["evaluator"] is None


# -- a worker kept from one problem to the next (autogen.gpu.backend._keep) -------------------------


def test_a_kept_worker_takes_up_a_problem_with_its_counts_started_again():
    from autogen.core.registry import get_family
    from autogen.gpu.evaluator import Serve, WorkSpec

    sent = []

    class Pipe:  # the parent's end: the worker answers the switch with its identity
        def send(self, message):
            sent.append(message)

        def poll(self, timeout=None):
            return True

        def recv(self):
            return ("ok", ("device", 456, {}), True)

    evaluator = worker_with(types.SimpleNamespace(is_alive=lambda: True))
    evaluator._conn, evaluator._identity, evaluator.spec = Pipe(), ("device", 123, {}), _spec()
    evaluator.waited_s, evaluator.restarts, evaluator.timeout_s = {"Evaluate": 3.0}, 2, 60.0
    problem = get_family("sgemv").problem(m=128, n=16)
    new = WorkSpec.of(problem, "cold")
    evaluator.take_up(new, 30.0)
    assert sent == [Serve(new, prepare=True)] and evaluator.spec == new and evaluator.free_bytes == 456
    assert evaluator.restarts == 0 and set(evaluator.waited_s) == {"Serve"} and evaluator.timeout_s == 30.0
    with pytest.raises(ValueError, match="GPU"):
        evaluator.take_up(WorkSpec.of(problem, "cold", device_index=1), 30.0)


def test_a_finished_backend_s_worker_and_pool_serve_the_next_problem_on_its_gpu(monkeypatch):
    import concurrent.futures

    from autogen.core.registry import get_family
    from autogen.gpu import backend
    from autogen.gpu.evaluator import WorkSpec

    made, pools = [], []

    class StandInWorker:
        def __init__(self, spec, timeout_s=60.0):
            self.spec, self.taken_up, self.closed = spec, [], False
            made.append(self)

        def usable(self):
            return not self.closed

        def rest(self):
            return True

        def take_up(self, spec, timeout_s):
            self.taken_up.append(spec)
            self.spec = spec

        def close(self, wait=True):
            self.closed = True

        discard = close

    class StandInPool:
        shut = False

        def shutdown(self, wait=True, cancel_futures=False):
            self.shut = True

    def new_pool_soon(workers):
        pools.append(StandInPool())
        future = concurrent.futures.Future()
        future.set_result(pools[-1])
        return future

    monkeypatch.setattr(backend, "IsolatedEvaluator", StandInWorker)
    monkeypatch.setattr(backend, "_new_pool_soon", new_pool_soon)
    monkeypatch.setattr(backend, "_kept", {"workers": {}, "pools": {}, "in_child": False})
    monkeypatch.setattr(backend, "_prestarted", {"evaluator": None, "pool": None})
    other_problem = WorkSpec.of(get_family("sgemv").problem(m=128, n=16), "cold")
    other_gpu = WorkSpec.of(get_family("sgemv").problem(m=128, n=16), "cold", device_index=1)
    with backend.GpuBackend(_spec(), 2, 60.0) as first:
        pass
    with backend.GpuBackend(other_problem, 2, 60.0) as second:
        assert second.evaluator is first.evaluator and first.evaluator.taken_up == [other_problem]
    assert len(pools) == 1 and not pools[0].shut  # one compile pool for both problems
    with backend.GpuBackend(other_gpu, 2, 60.0) as elsewhere:
        assert elsewhere.evaluator is not first.evaluator  # another GPU: a worker of its own
    with pytest.raises(RuntimeError):
        with backend.GpuBackend(_spec(), 2, 60.0) as failing:
            raise RuntimeError("mid-problem")
    assert failing.evaluator.closed and pools[0].shut  # after an error: stopped, not kept
    backend._stop_kept()
    assert all(worker.closed for worker in made) and len(made) == 2

    # A worker prestarted for one problem (a GPU agent's first) serves another on its GPU; the
    # compile pool prestarted with it serves a backend of its size.
    backend.prestart(_spec(), 2, 60.0)
    prestarted, prestarted_pool = made[-1], pools[-1]
    with backend.GpuBackend(other_problem, 2, 60.0) as adopting:
        assert adopting.evaluator is prestarted and prestarted.taken_up == [other_problem]
        assert adopting._pool is prestarted_pool and backend._prestarted["pool"] is None
    backend.prestart(other_gpu, 3, 60.0)
    on_gpu1, pool_of_3 = made[-1], pools[-1]
    with backend.GpuBackend(_spec(), 2, 60.0) as again:
        assert again.evaluator is prestarted  # kept on GPU 0; the one prestarted on GPU 1 is not taken
        assert again._pool is prestarted_pool  # kept; the prestarted pool of 3 is not this size
    assert backend._prestarted["evaluator"] is on_gpu1 and not on_gpu1.taken_up and not pool_of_3.shut
    backend.discard_prestarted()
    backend._stop_kept()
    assert on_gpu1.closed and prestarted.closed and pool_of_3.shut and prestarted_pool.shut
    assert backend._prestarted == {"evaluator": None, "pool": None}


def _keep_a_pool_and_return() -> None:
    # In a multiprocessing child (as a helper process is): a compile pool offered to be kept for a
    # next problem. The child runs no atexit hooks, and multiprocessing joins its non-daemon
    # children (a kept pool's processes) at its exit: kept, they would hold it forever.
    from autogen.gpu import backend

    pool = backend._new_pool(1)
    pool.submit(abs, -1).result()  # the pool's process started and answering
    backend._keep(None, pool, 1)


def _keep_a_pool_as_an_agent_and_return() -> None:
    # A GPU agent keeps what its backends leave from one request to the next, and releases it
    # before its work returns (autogen.distributed.gpu_agent).
    from autogen.gpu import backend

    backend.keep_in_this_child()
    pool = backend._new_pool(1)
    pool.submit(abs, -1).result()
    backend._keep(None, pool, 1)
    assert backend._kept_pool(1).result() is pool  # kept, and taken up by the next backend
    backend._keep(None, pool, 1)
    backend.release_kept()
    assert not backend._kept["pools"]


def _exits_within(target, seconds: float) -> bool:
    import multiprocessing

    child = multiprocessing.get_context("spawn").Process(target=target)
    child.start()
    child.join(seconds)
    exited = child.exitcode is not None
    if not exited:
        child.kill()
        child.join(10)
    return exited and child.exitcode == 0


def test_a_helper_like_child_process_keeps_nothing_and_exits():
    assert _exits_within(_keep_a_pool_and_return, 60)


def test_an_agent_keeps_between_requests_and_exits_once_it_releases():
    assert _exits_within(_keep_a_pool_as_an_agent_and_return, 60)
