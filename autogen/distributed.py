"""Tuning on several GPUs of one machine: one isolated evaluator per GPU, one compile pool.

A thread per GPU takes the next problem nobody has started and tunes it as its owner: it starts
the problem (warm start), runs a search loop, then re-times the finalists on its own GPU and
stores the winner. A GPU that finds no problem left to start joins a problem still being
searched, with a search loop of its own on the same shared study: the claims of the tuning
database keep the two loops from measuring a variant twice and hold the trial budget, exactly as
for workers on several machines (autogen.search). So 8 problems spread over 2 GPUs four by four,
and 1 problem gets both GPUs; the owner waits for its helpers' loops before it re-times, so the
winner is chosen on one GPU from every measurement.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from .backend import GpuBackend
from .errors import UsageError
from .problem import Problem
from .tuner import TuneOptions, TuneResult, Tuner


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def parse_gpus(text: str | None) -> tuple[int, ...] | str | None:
    """`--gpus`: "all", or device ordinals "0,1,3" (each once); None when not given."""
    if text is None:
        return None
    if text.strip() == "all":
        return "all"
    items = [item.strip() for item in text.split(",")]
    if not items or any(not item.isdigit() or not item.isascii() for item in items):
        raise UsageError(f"--gpus expects 'all' or device numbers separated by commas, like 0,1; got {text!r}")
    ordinals = tuple(int(item) for item in items)
    if len(set(ordinals)) != len(ordinals):
        raise UsageError(f"--gpus names a GPU twice: {text!r}")
    return ordinals


def resolve_gpus(gpus, count: int) -> tuple[int, ...] | None:
    """Ordinals to use, given how many GPUs this process sees."""
    if gpus is None:
        return None
    if gpus == "all":
        return tuple(range(count))
    missing = [g for g in gpus if g >= count]
    if missing:
        raise UsageError(f"--gpus {','.join(map(str, gpus))}: this machine has {count} GPU(s), numbered 0 to {count - 1}")
    return tuple(gpus)


@dataclass
class _Job:
    problem: Problem
    tuner: Tuner
    index: int
    state: str = "waiting"  # waiting -> searching -> finishing -> done
    helpers: int = 0  # joined loops still running
    joined: set = field(default_factory=set)  # GPUs that joined (each joins a problem once)
    ready: threading.Event = field(default_factory=threading.Event)  # the owner's begin() is over
    result: TuneResult | None = None
    error: BaseException | None = None


class MultiGpu:
    """Tunes ``problems`` on ``options.gpus`` (two or more), returning results in problem order."""

    def __init__(self, problems: list[Problem], options: TuneOptions, progress: Callable[[str], None] = _log,
                 backend_factory=GpuBackend, on_result: Callable[[TuneResult], None] | None = None):
        self.options, self.progress = options, progress
        self.backend_factory = backend_factory
        self.on_result = on_result
        self.gpus = tuple(options.gpus or ())
        if len(self.gpus) < 2:
            raise ValueError("MultiGpu needs two GPUs or more; Tuner.run tunes on one")
        self.jobs = [_Job(p, Tuner(p, options, self._progress_for(p), backend_factory), i)
                     for i, p in enumerate(problems)]
        self.lock = threading.Condition()
        self.started = time.monotonic()

    def _progress_for(self, problem: Problem) -> Callable[[str], None]:
        def report(message: str) -> None:
            gpu = getattr(threading.current_thread(), "gpu", None)
            self.progress((f"[gpu {gpu}] " if gpu is not None else "") + message)
        return report

    def run(self) -> list[TuneResult]:
        # The owners' compile pool (GpuBackend.compile_pool: a Future) starts on a thread while
        # the GPU workers start.
        make_pool = getattr(self.backend_factory, "compile_pool", None)
        self.pool = make_pool(self.options.workers) if callable(make_pool) else None
        threads = []
        try:
            for slot, gpu in enumerate(self.gpus):
                thread = threading.Thread(target=self._gpu_main, args=(gpu, slot), name=f"gpu {gpu}", daemon=True)
                thread.gpu = gpu
                thread.start()
                threads.append(thread)
            for thread in threads:
                while thread.is_alive():  # joined in slices, so Ctrl-C reaches this thread
                    thread.join(0.2)
        finally:
            if self.pool is not None:
                self.pool.result().shutdown(cancel_futures=True)
        errors = [job.error for job in self.jobs if job.error is not None]
        if errors:
            raise errors[0]
        return [job.result for job in self.jobs]

    # -- one thread per GPU -------------------------------------------------------------------------

    def _gpu_main(self, gpu: int, slot: int) -> None:
        while True:
            with self.lock:
                job, owner = self._pick(gpu)
                if job is None:
                    return
                if owner:
                    job.state = "searching"
                else:
                    job.helpers += 1
                    job.joined.add(gpu)
            try:
                if owner:
                    self._own(job, gpu)
                else:
                    self._help(job, gpu, slot)
            except BaseException as exc:  # the job fails; the GPU goes on with the others
                self.progress(f"[gpu {gpu}] {job.problem}: {type(exc).__name__}: {exc}")
                with self.lock:
                    if owner or job.error is None:
                        job.error = job.error or exc
                    if owner:
                        job.state = "done"
                        job.ready.set()
                    self.lock.notify_all()
            finally:
                if not owner:
                    with self.lock:
                        job.helpers -= 1
                        self.lock.notify_all()

    def _pick(self, gpu: int) -> tuple[_Job | None, bool]:
        """The next problem nobody started (as its owner); else the one being searched with the
        fewest loops that this GPU has not joined yet (as a helper); else none."""
        for job in self.jobs:
            if job.state == "waiting":
                return job, True
        searching = [j for j in self.jobs if j.state == "searching" and gpu not in j.joined]
        if not searching:
            return None, False
        return min(searching, key=lambda j: (j.helpers, j.index)), False

    def _own(self, job: _Job, gpu: int) -> None:
        tuner, started = job.tuner, time.monotonic()
        with tuner.open_backend(gpu, self.pool) as backend:
            result = tuner.begin(backend, started)
            job.ready.set()
            tuner.search(backend, started, gpu, slot=0)
            with self.lock:
                job.state = "finishing"  # no new helper; wait for those searching
                while job.helpers:
                    self.lock.wait()
            job.result = tuner.end(backend, result, started)
        with self.lock:
            job.state = "done"
        if self.on_result is not None:
            self.on_result(job.result)

    def _help(self, job: _Job, gpu: int, slot: int) -> None:
        job.ready.wait()
        if job.error is not None or job.state != "searching":
            return
        tuner = job.tuner
        with tuner.open_backend(gpu, self.pool) as backend:
            if backend.device.name != tuner.device.name:
                self.progress(f"[gpu {gpu}] not helping with {job.problem}: a {backend.device.name}, "
                              f"not a {tuner.device.name}")
                return
            self.progress(f"[gpu {gpu}] helping with {job.problem}")
            tuner.search(backend, time.monotonic(), gpu, slot=len(job.joined))


def tune_problems(problems: list[Problem], options: TuneOptions, progress: Callable[[str], None] = _log,
                  backend_factory=GpuBackend, on_result: Callable[[TuneResult], None] | None = None
                  ) -> list[TuneResult]:
    """Every problem tuned, on the GPUs of options.gpus (one after another on a single GPU)."""
    if options.gpus is None or len(options.gpus) < 2:
        results = []
        for problem in problems:
            results.append(Tuner(problem, options, progress, backend_factory).run())
            if on_result is not None:
                on_result(results[-1])
        return results
    return MultiGpu(problems, options, progress, backend_factory, on_result).run()
