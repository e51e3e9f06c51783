"""The seam between the tuning loop and the machine: compile ahead, evaluate on the GPU.

GpuBackend is the real one: NVRTC compiles in a pool of worker processes (default_workers) while
an isolated child process validates and times earlier variants on the GPU. Tests of search and
storage swap in autogen.testing.replay.ReplayBackend, which replays timings recorded on a GPU.

Start-up overlaps the parent's own work: `prestart` (called by `autogen tune` before it imports
the tuner, Optuna and SQLAlchemy) spawns the GPU worker at once, and the compile pool on a helper
thread; the worker creates its CUDA context while the parent imports and reads the database, and
the backend that needs them adopts them (a run answered from the database discards them unused).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import multiprocessing
import os
import threading

from autogen.gpu.compile import compile_cubin
from autogen.gpu.evaluator import WorkSpec
from autogen.gpu.worker import child_environment, IsolatedEvaluator, stop_with_parent

# Started ahead of need by prestart(): the GPU worker, adopted by the first GpuBackend of the same
# spec (or GPU), and the compile pool, (workers, the Future of the pool), by the first of that size.
_prestarted: dict = {"evaluator": None, "pool": None}

# GPU workers and compile pools of finished backends, kept for the next problem of this process:
# a new worker made every problem pay its start-up again (its interpreter, imports and CUDA
# context; measured in docs/distributed.md). Workers by GPU (device_index), pools by their number
# of processes.
_kept: dict = {"workers": {}, "pools": {}, "in_child": False}
_kept_lock = threading.Lock()


def _new_pool(workers: int) -> concurrent.futures.ProcessPoolExecutor:
    context = multiprocessing.get_context("spawn")
    # Its workers end with this process, even one killed with SIGKILL (a GPU agent of
    # autogen.distributed.multi_gpu, say): orphaned, they would wait for tasks forever.
    pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=context, initializer=_compile_worker_start,
                                                  initargs=(os.getpid(),))
    # Spawn every compile worker now (they import NVRTC's bindings while the GPU worker starts).
    with child_environment():
        for _ in range(workers):
            pool.submit(os.getpid)
    return pool


# How much lower the compile processes' CPU priority is than the tuner's (os.nice): with many
# compile processes busy, the GPU worker (validation and timing: Python, CUDA synchronisations)
# and the search otherwise wait for time slices behind NVRTC.
COMPILE_NICENESS = 10


def _compile_worker_start(parent_pid: int) -> None:
    """In each compile process: end with the parent (stop_with_parent), run at a lower CPU
    priority than the GPU worker and the search, and end without finalising the interpreter
    once the pool is shut down. A compile leaves nothing to clean up (its cubin is returned,
    its cache file written), and finalising CuPy and NumPy in every process made the pool's
    shutdown a visible part of every tune (docs/history/sessions.md, eighth session)."""
    stop_with_parent(parent_pid)
    try:
        os.nice(COMPILE_NICENESS)
    except (AttributeError, OSError):  # no os.nice (Windows), or not allowed: same priority
        pass
    atexit.register(os._exit, 0)  # registered last: the first exit hook to run


def _new_pool_soon(workers: int) -> concurrent.futures.Future:
    """_new_pool on a helper thread: spawning a compile process holds the spawning thread
    for a while each, while the caller goes on (the first compile waits for the pool)."""
    starter = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="autogen-pool")
    future = starter.submit(_new_pool, workers)
    starter.shutdown(wait=False)
    return future


def prestart(spec: WorkSpec, workers: int, eval_timeout_s: float) -> None:
    """Spawn the GPU worker for `spec` now (one process; the long pole of start-up is its CUDA
    context) and the compile pool of `workers` processes (on a helper thread); returns at once.
    Started with the backend instead, the pool's first compiles came after the worker's rehearsal
    and held up the first variant (measured: docs/distributed.md)."""
    discard_prestarted()
    _prestarted["evaluator"] = IsolatedEvaluator(spec, eval_timeout_s)
    _prestarted["pool"] = (workers, _new_pool_soon(workers))


def discard_prestarted() -> None:
    """Stop what prestart started and nobody adopted (a run answered from the database)."""
    evaluator, _prestarted["evaluator"] = _prestarted["evaluator"], None
    held, _prestarted["pool"] = _prestarted["pool"], None
    if evaluator is not None:
        evaluator.discard()
    if held is not None:
        try:
            pool = held[1].result()  # its processes spawned (a fraction of a second), not waited for
        except Exception:  # it could not be made: nothing to stop
            return
        # Shut down, not waited for: its processes leave once started, and no semaphore of its
        # queues is left for multiprocessing's resource tracker to report at this process's exit.
        pool.shutdown(wait=False, cancel_futures=True)


def _prestarted_pool(workers: int) -> concurrent.futures.Future | None:
    """The compile pool prestart() started, if it has ``workers`` processes."""
    held = _prestarted["pool"]
    if held is None or held[0] != workers:
        return None
    _prestarted["pool"] = None
    return held[1]


def _adopt(spec: WorkSpec, eval_timeout_s: float):
    """The prestarted worker of ``spec``, else one prestarted or kept from an earlier problem on
    the same GPU (taking up ``spec``), else None."""
    evaluator = _prestarted["evaluator"]
    if evaluator is not None and evaluator.spec == spec:
        evaluator.timeout_s = eval_timeout_s
        _prestarted["evaluator"] = None
        return evaluator
    with _kept_lock:
        kept = _kept["workers"].pop(spec.device_index, None)
    if kept is None and evaluator is not None and evaluator.spec.device_index == spec.device_index:
        kept, _prestarted["evaluator"] = evaluator, None
    if kept is None:
        return None
    try:
        kept.take_up(spec, eval_timeout_s)
    except Exception:  # lost, or it could not take the problem up: a new worker instead
        kept.discard()
        return None
    return kept


def _keep(evaluator: IsolatedEvaluator | None, pool: concurrent.futures.ProcessPoolExecutor | None,
          workers: int) -> None:
    """Keep a finished backend's worker (if it is still usable) and compile pool for this
    process's next problem, each in place of one kept before (which is stopped)."""
    if not _may_keep():
        if evaluator is not None:
            evaluator.close(wait=False)
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        return
    stale = []
    keep_worker = evaluator is not None and evaluator.usable() and evaluator.rest()
    with _kept_lock:
        if keep_worker:
            stale.append(_kept["workers"].pop(evaluator.spec.device_index, None))
            _kept["workers"][evaluator.spec.device_index] = evaluator
        elif evaluator is not None:
            stale.append(evaluator)
        if pool is not None:
            old_pool = _kept["pools"].pop(workers, None)
            if old_pool is not None:
                old_pool.shutdown(wait=False, cancel_futures=True)
            _kept["pools"][workers] = pool
    for worker in stale:
        if worker is not None:
            worker.close(wait=False)


def _kept_pool(workers: int) -> concurrent.futures.Future | None:
    """A compile pool of ``workers`` processes kept from an earlier problem, as a done Future."""
    with _kept_lock:
        pool = _kept["pools"].pop(workers, None)
    if pool is None:
        return None
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_result(pool)
    return future


@atexit.register
def _stop_kept(wait: bool = False) -> None:
    """At exit: the kept workers asked to stop (not waited for: daemons), the pools shut down
    (``wait``: their processes gone before this returns)."""
    with _kept_lock:
        workers, pools = list(_kept["workers"].values()), list(_kept["pools"].values())
        _kept["workers"].clear(), _kept["pools"].clear()
    for worker in workers:
        worker.close(wait=False)
    for pool in pools:
        pool.shutdown(wait=wait, cancel_futures=True)


def keep_in_this_child() -> None:
    """Let this multiprocessing child keep what its backends leave, as a top-level process does:
    one that tunes problem after problem on its GPU (autogen.distributed.gpu_agent), and calls
    release_kept() before its work returns."""
    _kept["in_child"] = True


def release_kept() -> None:
    """Stop what this process keeps, its compile pools' processes gone when this returns: a
    multiprocessing child's exit joins its children (see _may_keep)."""
    _kept["in_child"] = False
    discard_prestarted()
    _stop_kept(wait=True)


def _may_keep() -> bool:
    """Whether this process keeps what a finished backend leaves. Not a multiprocessing child
    (unless keep_in_this_child): it runs no atexit hooks when its work returns, and multiprocessing
    then joins its children, a kept pool's processes among them, which wait for work forever
    (measured: docs/distributed.md)."""
    return multiprocessing.parent_process() is None or _kept["in_child"]


class GpuBackend:
    prestart = staticmethod(prestart)  # for a process that knows its first problem before its imports

    def __init__(self, spec: WorkSpec, workers: int, eval_timeout_s: float):
        self.spec = spec
        self.workers = workers
        self.eval_timeout_s = eval_timeout_s
        self._pool_future: concurrent.futures.Future = concurrent.futures.Future()
        self.evaluator: IsolatedEvaluator | None = None

    def __enter__(self) -> "GpuBackend":
        self._pool_future = _kept_pool(self.workers) or _prestarted_pool(self.workers) or _new_pool_soon(self.workers)
        try:
            # Spawned, not waited for: the first request (or .device) waits for its context.
            self.evaluator = _adopt(self.spec, self.eval_timeout_s) or IsolatedEvaluator(self.spec,
                                                                                          self.eval_timeout_s)
        except BaseException:
            self._close_pool()
            raise
        return self

    def __exit__(self, exc_type, *exc_info) -> None:
        """The worker and the compile pool are kept for this process's next problem (_keep);
        after an error, stopped."""
        if exc_type is not None:
            if self.evaluator is not None:
                self.evaluator.close(wait=False)
            self._close_pool()
            return
        _keep(self.evaluator, self._pool_future.result(), self.workers)

    def _close_pool(self) -> None:
        self._pool_future.result().shutdown(cancel_futures=True)

    @property
    def _pool(self) -> concurrent.futures.ProcessPoolExecutor:
        return self._pool_future.result()

    @property
    def device(self):
        return self.evaluator.device

    @property
    def free_bytes(self) -> int:
        return self.evaluator.free_bytes

    def compile(self, source: str, arch: str, family_options: tuple[str, ...] = ()) -> concurrent.futures.Future:
        """The cubin of `source`, compiled in the pool with its family's own options (arguments:
        a compile process has no registry, and learns them with each source)."""
        return self._pool.submit(compile_cubin, source, arch, None, family_options)
