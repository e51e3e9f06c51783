"""The seam between the tuning loop and the machine: compile ahead, evaluate on the GPU.

GpuBackend is the real one: NVRTC compiles in a pool of worker processes (default_workers) while
an isolated child process validates and times earlier variants on the GPU. Tests of search and
storage swap in autogen.testing.replay.ReplayBackend, which replays timings recorded on a GPU.

Start-up overlaps the parent's own work: `prestart` (called by `autogen tune` before it imports
the tuner, Optuna and SQLAlchemy) spawns the GPU worker at once; it creates its CUDA context
while the parent imports and reads the database, and the backend that needs it adopts it (a run
answered from the database discards it unused). The compile pool is spawned by a helper thread.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import multiprocessing
import os

from autogen.gpu.compile import compile_cubin
from autogen.gpu.evaluator import WorkSpec
from autogen.gpu.worker import child_environment, IsolatedEvaluator, stop_with_parent

# Started ahead of need by prestart(), adopted by the first GpuBackend of the same spec.
_prestarted: dict = {"evaluator": None}


def _new_pool(workers: int) -> concurrent.futures.ProcessPoolExecutor:
    context = multiprocessing.get_context("spawn")
    # Its workers end with this process, even one killed with SIGKILL (a helper process of
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
    context); returns at once. The compile pool is started by the backend, in the background."""
    discard_prestarted()
    _prestarted["evaluator"] = IsolatedEvaluator(spec, eval_timeout_s)


def discard_prestarted() -> None:
    """Stop what prestart started and nobody adopted (a run answered from the database)."""
    evaluator, _prestarted["evaluator"] = _prestarted["evaluator"], None
    if evaluator is not None:
        evaluator.discard()


def _adopt(spec: WorkSpec, eval_timeout_s: float):
    evaluator = _prestarted["evaluator"]
    if evaluator is not None and evaluator.spec == spec:
        evaluator.timeout_s = eval_timeout_s
        _prestarted["evaluator"] = None
        return evaluator
    return None


class GpuBackend:
    def __init__(self, spec: WorkSpec, workers: int, eval_timeout_s: float,
                 pool: concurrent.futures.ProcessPoolExecutor | concurrent.futures.Future | None = None):
        self.spec = spec
        self.workers = workers
        self.eval_timeout_s = eval_timeout_s
        # Given: a compile pool shared by the backends of several GPUs, or the Future of one that
        # is still starting (autogen.distributed.multi_gpu), which the first compile waits for.
        self._owns_pool = pool is None
        self._pool_future: concurrent.futures.Future = concurrent.futures.Future()
        if isinstance(pool, concurrent.futures.Future):
            self._pool_future = pool
        elif pool is not None:
            self._pool_future.set_result(pool)
        self.evaluator: IsolatedEvaluator | None = None

    @staticmethod
    def compile_pool(workers: int) -> concurrent.futures.Future:
        """A compile pool for the backends of several GPUs, started on a helper thread."""
        return _new_pool_soon(workers)

    def __enter__(self) -> "GpuBackend":
        if self._owns_pool:
            self._pool_future = _new_pool_soon(self.workers)
        try:
            # Spawned, not waited for: the first request (or .device) waits for its context.
            self.evaluator = _adopt(self.spec, self.eval_timeout_s) or IsolatedEvaluator(self.spec,
                                                                                          self.eval_timeout_s)
        except BaseException:
            self._close_pool()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        if self.evaluator is not None:
            self.evaluator.close(wait=False)  # nothing is left to ask of it
        self._close_pool()

    def _close_pool(self) -> None:
        if self._owns_pool:
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
