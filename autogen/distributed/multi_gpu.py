"""Tuning on several GPUs of one machine: one isolated evaluator per GPU.

Problems first: a thread per GPU takes the next problem nobody has started and tunes it as its
owner: it starts the problem (warm start), runs a search loop, then re-times the finalists on
its own GPU and stores the winner. The first GPU's owner runs in this process; every other GPU's
in that GPU's agent, a process of its own (autogen.distributed.gpu_agent), because the search
loop's host work is Python: two loops of one process take turns at the GIL, and a 1-GPU search
is host-bound already (autogen.distributed.gpu_agent has the measurements). This process's
other threads only pass messages.

Then trials: a GPU that finds no problem left to start helps a problem still being searched,
with a search loop of its own in its agent on the same shared study: the claims of the tuning
database keep the loops from measuring a variant twice and hold the trial budget, exactly as for
workers on several machines (autogen.search.loop). So 8 problems spread over 2 GPUs four by
four, and 1 problem gets both GPUs; the owner waits for its helpers' search loops before it
re-times, so the winner is chosen on one GPU from every measurement, and the helpers' counts
(measured, failed, taken over, time spent) are added to its result, which lists their GPUs.

When a helper starts: an agent's interpreter and imports, and a problem's GPU worker and compile
pool where the agent has none kept, take up to a couple of seconds, during which it measures
nothing, so a GPU helps a problem only while at least HELP_MIN_TRIALS_LEFT trials of its budget
are neither stored nor claimed (its whole budget until its owner has begun); with fewer, the
owner alone measures them in about the time a helper takes to start. Hence:

* where there are fewer problems than GPUs (and the budget is large enough), the spare GPUs'
  agents are spawned at once, with the owners, so that their start-up overlaps the owners' own;
  each waits for its owner's begin() before it searches;
* at the tail of a run (a GPU done with its problems while others still search), a GPU helps only
  a problem whose owner has most of a large budget left; otherwise it rests.

An owner whose search is over waits for the helpers that are searching, never for one still
starting: that one is told to leave the problem once it is ready. A helper that fails or dies is
reported on the progress output; the owner's search and result stand, and a killed helper's
claimed variants are taken over by the owner when their leases lapse (autogen.search.loop). An
owner's agent that dies fails its problem, and the GPU goes on with a new agent.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from autogen.core.problem import Problem
from autogen.distributed.gpu_agent import (EXIT_S, HELP_MIN_TRIALS_LEFT, Finish, Go, GpuAgent, HelpRequest,
                                           OwnRequest, adopt_early_agent, agents_first_problems, warm_of)
from autogen.gpu.backend import GpuBackend, release_kept
from autogen.report import terminal_text
from autogen.search.progress import TrialDone
from autogen.search.tuner import TuneOptions, Tuner, TuneResult


def _log(message: str) -> None:
    # Lines name stored kernels, GPUs and workers: what a database says never reaches the terminal raw.
    print(terminal_text(message), file=sys.stderr, flush=True)



@dataclass
class _Job:
    problem: Problem
    tuner: Tuner
    index: int
    state: str = "waiting"  # waiting -> searching -> finishing -> done
    started: float = 0.0  # when its owner started it (time.monotonic()); helpers' timeouts count from it
    helpers: int = 0  # helpers asked to join it and not over yet
    searching_helpers: int = 0  # those told to search: the owner waits for them before re-timing
    joined: set = field(default_factory=set)  # GPUs that chose it to help (each does so once)
    ready: threading.Event = field(default_factory=threading.Event)  # the owner's begin() is over
    searches: list = field(default_factory=list)  # helpers' (GPU, SearchCounts), added to the owner's before it ends
    result: TuneResult | None = None
    error: BaseException | None = None


class MultiGpu:
    """Tunes ``problems`` on ``options.gpus`` (two or more), returning results in problem order."""

    def __init__(self, problems: list[Problem], options: TuneOptions, progress: Callable[[str], None] = _log,
                 backend_factory=GpuBackend, on_result: Callable[[TuneResult], None] | None = None):
        self.options, self.progress = options, progress
        self.backend_factory = backend_factory  # agents get it pickled: GpuBackend, or a test aid
        self.on_result = on_result
        self.gpus = tuple(options.gpus or ())
        if len(self.gpus) < 2:
            raise ValueError("MultiGpu needs two GPUs or more; Tuner.run tunes on one")
        # Each process (this one and every agent) gets a compile pool of its own, of the size one
        # GPU's tuning gets (TuneOptions.compile_workers: by default the cores shared among the GPUs).
        self.gpu_options = replace(options, workers=options.compile_workers())
        self.jobs = [_Job(p, Tuner(p, self.gpu_options, self._progress_for(p), backend_factory), i)
                     for i, p in enumerate(problems)]
        self.lock = threading.Condition()
        self.agents: dict[int, GpuAgent] = {}  # by GPU; every one started is reaped at the end
        self.all_agents: list[GpuAgent] = []
        self.started = time.monotonic()

    def _progress_for(self, problem: Problem) -> Callable[[str], None]:
        def report(message) -> None:  # a line, or a TrialDone (autogen.search.progress)
            gpu = getattr(threading.current_thread(), "gpu", None)
            if isinstance(message, TrialDone):
                self.progress(message.on_gpu(gpu))
            else:
                self.progress((f"[gpu {gpu}] " if gpu is not None else "") + message)
        return report

    def run(self) -> list[TuneResult]:
        if not self.jobs:
            return []
        # The first problems go to the GPUs in order; a GPU left over starts helping at once.
        first = dict(zip(self.gpus, self.jobs))
        for job in first.values():
            job.state = "searching"
        threads = []
        over = False
        try:
            starting = agents_first_problems(self.gpus, [job.problem for job in self.jobs], self.options.trials,
                                             HELP_MIN_TRIALS_LEFT)
            for gpu, problem in starting.items():  # each starting its first problem's GPU worker at once
                self._agent(gpu, problem)
            for gpu in self.gpus:
                thread = threading.Thread(target=self._gpu_main, args=(gpu, first.get(gpu)), name=f"gpu {gpu}",
                                          daemon=True)
                thread.gpu = gpu
                thread.start()
                threads.append(thread)
            for thread in threads:
                while thread.is_alive():  # joined in slices, so Ctrl-C reaches this thread
                    thread.join(0.2)
            over = True
        finally:
            self._end_agents(over)
        errors = [job.error for job in self.jobs if job.error is not None]
        if errors:
            raise errors[0]
        return [job.result for job in self.jobs]

    def _end_agents(self, over: bool) -> None:
        """Reap every agent: once every GPU's thread is ``over``, each agent is between requests
        and leaves when told (all of them at once); after Ctrl-C or an error they are stopped now
        (they ignore Ctrl-C themselves: autogen.distributed.gpu_agent)."""
        with self.lock:
            agents = list(self.all_agents)
        for agent in agents:
            agent.send(None)
        # This process's own GPU worker and compile pool end now, while the agents end theirs,
        # rather than one after the other (at this process's exit).
        release_kept()
        for agent in agents:
            agent.end(grace_s=EXIT_S if over else 0)

    def _agent(self, gpu: int, first: Problem | None = None) -> GpuAgent:
        """``gpu``'s agent: the one `autogen tune` spawned before its imports, else started now if
        it has none (or its last one died); a new one starts the GPU worker of ``first`` (else of
        the first problem) before its imports."""
        with self.lock:
            agent = self.agents.get(gpu)
            if agent is None or agent.exited:
                options = self.gpu_options
                agent = None if gpu in self.agents else adopt_early_agent(gpu)
                if agent is None:
                    agent = GpuAgent(gpu, warm_of(self.backend_factory, first or self.jobs[0].problem,
                                                  options.cache_mode, gpu, options.workers, options.eval_timeout_s))
                self.agents[gpu] = agent
                self.all_agents.append(agent)
            return agent

    # -- one thread per GPU -------------------------------------------------------------------------

    def _gpu_main(self, gpu: int, job: _Job | None) -> None:
        owner = job is not None
        while True:
            if job is None:
                with self.lock:
                    job, owner = self._pick(gpu)
                if job is None:
                    return
            if owner:
                self._own(job, gpu)
            else:
                self._help(job, gpu)
            job = None

    def _pick(self, gpu: int) -> tuple[_Job | None, bool]:
        """Under the lock: the next problem nobody started (this GPU becomes its owner); else
        the one being searched with the fewest helpers that this GPU has not chosen yet (to
        help); else none."""
        for job in self.jobs:
            if job.state == "waiting":
                job.state = "searching"
                return job, True
        searching = [j for j in self.jobs if j.state == "searching" and gpu not in j.joined]
        if not searching:
            return None, False
        job = min(searching, key=lambda j: (j.helpers, j.index))
        job.joined.add(gpu)
        return job, False

    # -- owning a problem ---------------------------------------------------------------------------

    def _own(self, job: _Job, gpu: int) -> None:
        try:
            self._tune(job, gpu)
        except BaseException as exc:  # the problem fails; the GPU goes on with the others
            self.progress(f"[gpu {gpu}] {job.problem}: {type(exc).__name__}: {exc}")
            with self.lock:
                job.error = exc
                job.state = "done"
                job.ready.set()
                self.lock.notify_all()

    def _tune(self, job: _Job, gpu: int) -> None:
        if gpu == self.gpus[0]:
            self._tune_here(job, gpu)
        else:
            self._tune_in_agent(job, gpu)
        with self.lock:
            job.state = "done"
        if self.on_result is not None:
            self.on_result(job.result)

    def _tune_here(self, job: _Job, gpu: int) -> None:
        tuner = job.tuner
        job.started = started = time.monotonic()
        with tuner.open_backend(gpu) as backend:
            result = tuner.begin(backend, started)
            job.ready.set()
            tuner.search(backend, started, gpu, slot=0)
            self._wait_for_helpers(job)
            for device_index, counts in job.searches:
                tuner.add_search(device_index, counts)
            job.result = tuner.end(backend, result, started)

    def _tune_in_agent(self, job: _Job, gpu: int) -> None:
        """The owner's part in ``gpu``'s agent (serve_request); this thread relays: the owner's
        begin() to the helpers, and their counts to the owner once they are over."""
        agent = self._agent(gpu)
        job.started = time.monotonic()
        agent.request(OwnRequest(job.problem, self.gpu_options, self.backend_factory, gpu), job.tuner.progress)
        try:
            begun = agent.wait_for("begun")
            if begun is None:
                raise agent.failure("ended before the problem began")
            job.tuner.follow(*begun)
            job.ready.set()
            if agent.wait_for("searched") is None:
                raise agent.failure("ended during the search")
            self._wait_for_helpers(job)
            agent.send(Finish(tuple(job.searches)))
            job.result = agent.wait_for("result")
            if job.result is None:
                raise agent.failure("ended before the result")
        finally:
            agent.finish_request()

    def _wait_for_helpers(self, job: _Job) -> None:
        with self.lock:
            job.state = "finishing"  # no helper starts searching now; wait for those that are
            while job.searching_helpers:
                self.lock.wait()

    # -- helping with a problem ---------------------------------------------------------------------

    def _help(self, job: _Job, gpu: int) -> None:
        """Help ``job`` from ``gpu``'s agent; whatever goes wrong is reported and
        leaves the owner's search alone."""
        if not self._worth_helping(job, gpu):
            return
        with self.lock:
            job.helpers += 1
            slot = len(job.joined)
        try:
            self._run_helper(job, gpu, slot)
        except Exception as exc:
            self.progress(f"[gpu {gpu}] could not help with {job.problem}: {type(exc).__name__}: {exc}")
        finally:
            with self.lock:
                job.helpers -= 1

    def _worth_helping(self, job: _Job, gpu: int) -> bool:
        """Whether enough of ``job``'s budget is left for a helper to measure some of it
        once started: HELP_MIN_TRIALS_LEFT trials neither stored nor claimed (its whole budget
        while its owner's begin() is not over: nothing is claimed before)."""
        if not job.ready.is_set():
            left = self.options.trials
        elif job.error is not None or job.state != "searching":
            return False
        else:
            try:
                left = self._trials_left(job)
            except Exception as exc:  # the database away for a moment: this GPU rests
                self.progress(f"[gpu {gpu}] not helping with {job.problem}: {type(exc).__name__}: {exc}")
                return False
        if left < HELP_MIN_TRIALS_LEFT:
            self.progress(f"[gpu {gpu}] not helping with {job.problem}: {max(left, 0)} trials left, fewer "
                          f"than the {HELP_MIN_TRIALS_LEFT} for which a helper pays off its start")
            return False
        return True

    def _trials_left(self, job: _Job) -> int:
        """Trials of the budget not stored nor claimed yet (what TuningDB.claim counts)."""
        tuner, problem, cache_mode = job.tuner, job.problem, self.options.cache_mode
        key = (tuner.device, problem.family, problem.dtype, problem.shape_key, cache_mode)
        stored = sum(1 for t in tuner.db.trials(*key) if t.status != "rejected")
        return self.options.trials - stored - len(tuner.db.claims(*key, running=True))

    def _run_helper(self, job: _Job, gpu: int, slot: int) -> None:
        agent = self._agent(gpu)
        # The very database this process resolved.
        options = replace(self.gpu_options, db_url=job.tuner.db.url)
        progress = job.tuner.progress
        agent.request(HelpRequest(job.problem, options, self.backend_factory, gpu, slot), progress,
                      on_error=lambda text: progress(f"helper failed: {text}"))
        try:
            device = agent.wait_for("ready")  # its start-up, overlapping the owner's
            if device is None:
                return  # it failed or died starting (reported)
            job.ready.wait()
            if not self._join_search(job, gpu, device, agent):
                agent.send(None)  # leave this problem
                return
            try:
                agent.send(Go(job.tuner.device, job.tuner.start, time.monotonic() - job.started))
                counts = agent.wait_for("counts")
                if counts is not None:
                    job.searches.append((gpu, counts))
            finally:
                with self.lock:
                    job.searching_helpers -= 1
                    self.lock.notify_all()
        finally:
            agent.finish_request()

    def _join_search(self, job: _Job, gpu: int, device, agent: GpuAgent) -> bool:
        """Whether a ready helper searches ``job`` (counted as searching, then): not once its
        owner's search is over or failed, nor on a GPU of another model."""
        with self.lock:
            if job.state != "searching" or job.error is not None:
                return False
            if device.name != job.tuner.device.name:
                self.progress(f"[gpu {gpu}] not helping with {job.problem}: a {device.name}, "
                              f"not a {job.tuner.device.name}")
                return False
            job.searching_helpers += 1
        self.progress(f"[gpu {gpu}] helping with {job.problem} (process {agent.process.pid})")
        return True


def tune_problems(problems: list[Problem], options: TuneOptions, progress: Callable[[str], None] = _log,
                  backend_factory=GpuBackend, on_result: Callable[[TuneResult], None] | None = None
                  ) -> list[TuneResult]:
    """Every problem tuned, on the GPUs of options.gpus (one after another on a single GPU).
    Results in the order of ``problems``; ``on_result`` is called as each is done."""
    if options.gpus is None or len(options.gpus) < 2:
        return _one_after_another(problems, options, progress, backend_factory, on_result)
    return MultiGpu(problems, options, progress, backend_factory, on_result).run()


def _one_after_another(problems: list[Problem], options: TuneOptions, progress, backend_factory, on_result
                       ) -> list[TuneResult]:
    """Each problem in turn on one GPU. One that another worker is searching now (another process
    or machine on the database, come to it from its own place in the list: autogen.distributed.order)
    waits until those nobody has started are done: joined, each would pay its start-up and re-timing
    for half the trials. It is looked for before the problem starts, and again once its GPU worker
    is ready, before its first claim: two processes that begin a problem at the same moment see
    nothing of each other at first (measured: docs/distributed.md). By the end the problem is
    usually complete, and answered from the database; if not, it is joined (the claims keep the
    budget exact)."""
    results: dict[int, TuneResult] = {}
    later = []
    for index, problem in enumerate(problems):
        tuner = Tuner(problem, options, progress, backend_factory)
        several = len(problems) > 1
        result = None if several and tuner.searched_elsewhere() else tuner.run(give_way=several)
        if result is None:
            progress(f"{problem}: being searched by another worker; tuning the others first")
            later.append(index)
            continue
        results[index] = result
        if on_result is not None:
            on_result(result)
    for index in later:
        results[index] = Tuner(problems[index], options, progress, backend_factory).run()
        if on_result is not None:
            on_result(results[index])
    return [results[index] for index in range(len(problems))]


def serve_request(parent, request, stop) -> None:
    """An agent's part of a request (autogen.distributed.gpu_agent)."""
    if isinstance(request, OwnRequest):
        own_in_agent(parent, request, stop)
    else:
        search_as_helper(parent, request, stop)


def own_in_agent(parent, request: OwnRequest, stop) -> None:
    """An owner's part in an agent: begin (its device and starting point to the parent, for the
    helpers), search, then re-time and store once the parent says every helper is over."""
    tuner = Tuner(request.problem, request.options, parent.progress, request.backend_factory)
    started = time.monotonic()
    with tuner.open_backend(request.device_index) as backend:
        result = tuner.begin(backend, started)
        parent.send("begun", (tuner.device, tuner.start))
        _search_stoppably(tuner, backend, started, request.device_index, 0, stop)
        parent.send("searched", True)
        finish = parent.receive()
        if finish is None or stop.event.is_set():
            raise KeyboardInterrupt  # told to stop: this agent is over
        for device_index, counts in finish.searches:
            tuner.add_search(device_index, counts)
        result = tuner.end(backend, result, started)
    parent.send("result", result)


def _search_stoppably(tuner: Tuner, backend, started: float, device_index: int, slot: int, stop) -> None:
    """A search loop that SIGTERM stops at its next step (autogen.distributed.gpu_agent.Stop)."""
    stop.searching = True
    try:
        tuner.search(backend, started, device_index, slot, stop=stop.event)
    finally:
        stop.searching = False
    if stop.event.is_set():
        raise KeyboardInterrupt


def search_as_helper(parent, request: HelpRequest, stop) -> None:
    """A helper's part: open its backend, say it is ready, search when told to go."""
    tuner = Tuner(request.problem, request.options, parent.progress, request.backend_factory)
    with tuner.open_backend(request.device_index) as backend:
        tuner.open_search_soon()  # while the GPU worker creates its CUDA context
        parent.send("ready", backend.device)
        go = parent.receive()
        if go is None:
            return
        tuner.follow(go.device, go.start)
        try:
            _search_stoppably(tuner, backend, time.monotonic() - go.elapsed_s, request.device_index, request.slot,
                              stop)
        finally:
            parent.send("counts", tuner.counts)  # what it measured, also when it failed midway
