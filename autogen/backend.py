"""The seam between the tuning loop and the machine: compile ahead, evaluate on the GPU.

GpuBackend is the real one: NVRTC compiles in a pool of worker processes (one per core) while
an isolated child process validates and times earlier variants on the GPU. Tests of search and
storage swap in autogen.testing.replay.ReplayBackend, which replays timings recorded on a GPU.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os

from .compile import compile_cubin
from .worker import IsolatedEvaluator, WorkSpec


class GpuBackend:
    def __init__(self, spec: WorkSpec, workers: int, eval_timeout_s: float,
                 pool: concurrent.futures.ProcessPoolExecutor | None = None):
        self.spec = spec
        self.workers = workers
        self.eval_timeout_s = eval_timeout_s
        self._pool = pool  # given: a compile pool shared by the backends of several GPUs
        self._owns_pool = pool is None
        self.evaluator: IsolatedEvaluator | None = None

    @staticmethod
    def compile_pool(workers: int) -> concurrent.futures.ProcessPoolExecutor:
        pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
        for _ in range(workers):  # start the compile workers while the GPU worker creates its context
            pool.submit(os.getpid)
        return pool

    def __enter__(self) -> "GpuBackend":
        if self._owns_pool:
            self._pool = self.compile_pool(self.workers)
        try:
            self.evaluator = IsolatedEvaluator(self.spec, self.eval_timeout_s)
        except BaseException:
            if self._owns_pool:
                self._pool.shutdown(cancel_futures=True)
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        if self.evaluator is not None:
            self.evaluator.close()
        if self._owns_pool:
            self._pool.shutdown(cancel_futures=True)

    @property
    def device(self):
        return self.evaluator.device

    @property
    def free_bytes(self) -> int:
        return self.evaluator.free_bytes

    def compile(self, source: str, arch: str) -> concurrent.futures.Future:
        return self._pool.submit(compile_cubin, source, arch)
