"""A GPU's agent: a process of its own that tunes on one GPU for autogen.distributed.multi_gpu,
one request after another, keeping its GPU worker and compile pool from one to the next.

Why a process and not a thread: the search loop's host work (Optuna's asks, the claims, the
stores) is Python and holds the GIL. A 1-GPU sgemv search is host-bound already, so a second
loop as a thread of the same process only splits that host time between two GPUs: two GPUs ran
slower than one when they searched one problem, and when each GPU searched problems of its own
each search slowed down too (docs/distributed.md, "a process per GPU"). In a process of its own
a loop has its own interpreter, as a worker on another machine has, and cooperates with the
others only through the tuning database: claims, the global trial budget and the shared Optuna
study (autogen.search.loop, autogen.search.studies).

Requests (the parent sends one, then waits for the agent's "done"):

* HelpRequest: search a problem another GPU owns.
      agent -> parent  ("ready", DeviceIdentity)   its backend is up
      parent -> agent  Go(...) to search, or None to leave this problem
      agent -> parent  ("counts", SearchCounts)    its search loop is over
* OwnRequest: tune a problem as its owner, helpers' loops beside it.
      agent -> parent  ("begun", (DeviceIdentity, StartingPoint))   where helpers start from
      agent -> parent  ("searched", True)          its own loop is over
      parent -> agent  Finish(...) once every helper's loop is over: re-time and store, or
                       None to stop
      agent -> parent  ("result", TuneResult)

Any time: ("progress", line), printed by the parent as [gpu N] line; ("error", (text, exception))
when a request fails (the exception where it can be sent, else None); ("done", None) at the end
of every request. The parent's None between requests ends the agent.

An agent is spawned when the run starts, told the first problem it will serve: before its own
imports (the tuner, Optuna, SQLAlchemy) it starts that problem's GPU worker (``Warm``), whose
CUDA context is then made while it imports; the worker and compile pool are kept for the next
problem. `autogen tune` spawns its agents before its own imports too (start_agents_early), and
autogen.distributed.multi_gpu adopts them (adopt_early_agent).

Stopping: an agent ignores SIGINT (Ctrl-C reaches the parent too, which decides). The parent
ends an agent with SIGTERM, on which its search loop gives its claims back at its next step; an
agent whose parent is gone (killed with SIGKILL) sends itself SIGTERM.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import threading
import time
from dataclasses import dataclass
from typing import Callable

from autogen.core.problem import Problem
from autogen.gpu.backend import GpuBackend, keep_in_this_child, release_kept
from autogen.gpu.evaluator import WorkSpec
from autogen.gpu.worker import stop_with_parent

# How long an agent told to stop may take to exit (it stops its GPU worker and compile pool)
# before it is sent SIGTERM; and how long it then has before it is killed (its search loop stops
# after the variant on its GPU now).
EXIT_S = 30.0
TERMINATE_S = 5.0

# A GPU left without a problem joins one being searched only while at least this many of its
# trials are neither stored nor claimed. A 1-GPU sgemv search measures this many in about the
# time a helper takes to start (docs/distributed.md): with fewer trials left, the owner
# alone is done about when the helper would begin.
HELP_MIN_TRIALS_LEFT = 60


@dataclass(frozen=True)
class Warm:
    """What an agent starts before its imports: the GPU worker of its first problem, where the
    backend can start one ahead (``backend_factory.prestart``); picklable."""

    backend_factory: object
    spec: object  # autogen.gpu.evaluator.WorkSpec, on the agent's GPU
    workers: int
    eval_timeout_s: float


def warm_of(backend_factory, problem: Problem, cache_mode: str, device_index: int, workers: int,
            eval_timeout_s: float) -> Warm:
    """What the agent of GPU ``device_index`` starts for its first problem ``problem``."""
    return Warm(backend_factory, WorkSpec.of(problem, cache_mode, device_index), workers, eval_timeout_s)


def agents_first_problems(gpus: tuple[int, ...], problems: list[Problem], trials: int,
                          help_min_trials: int = HELP_MIN_TRIALS_LEFT) -> dict[int, Problem]:
    """The GPUs after the first that get an agent when a run starts, each with the problem its
    worker starts for: the i-th GPU owns the i-th problem; a GPU left over (fewer problems than
    GPUs) helps with the first, where the budget is worth a helper (``help_min_trials``)."""
    return {gpu: problems[i] if i < len(problems) else problems[0]
            for i, gpu in enumerate(gpus)
            if i > 0 and problems and (i < len(problems) or trials >= help_min_trials)}


@dataclass(frozen=True)
class HelpRequest:
    """Search a problem on the agent's GPU beside its owner; picklable."""

    problem: Problem
    options: object  # TuneOptions (its compile workers: the agent's own pool)
    backend_factory: object  # GpuBackend, or a picklable test aid (autogen.testing.replay)
    device_index: int
    slot: int  # its index among the problem's search loops (offsets its sampler's seed)


@dataclass(frozen=True)
class OwnRequest:
    """Tune a problem on the agent's GPU as its owner; picklable."""

    problem: Problem
    options: object
    backend_factory: object
    device_index: int


@dataclass(frozen=True)
class Go:
    """Search: the owner's begin() found ``device`` and ``start``, ``elapsed_s`` ago (its
    timeout counts from there)."""

    device: object  # DeviceIdentity
    start: object  # autogen.search.warmstart.StartingPoint
    elapsed_s: float


@dataclass(frozen=True)
class Finish:
    """Re-time and store: every other loop of the problem is over; ``searches`` are the helpers'
    (device ordinal, SearchCounts), added to the owner's result."""

    searches: tuple


# -- the parent's side ------------------------------------------------------------------------------


class GpuAgent:
    """An agent process for one GPU, started at once. Used by one thread of the parent at a time
    (its GPU's); end() may be called from another (cleanup)."""

    def __init__(self, device_index: int, warm: Warm | None = None):
        self.device_index = device_index
        self.exited = False
        self._progress: Callable[[str], None] = lambda line: None
        self._on_error: Callable[[str], None] | None = None
        self.error: BaseException | None = None  # the current request's failure, if any
        self._done = True  # the current request is over (its "done" read)
        context = multiprocessing.get_context("spawn")
        self._conn, child_conn = context.Pipe()
        # Not a daemon: a daemonic process may not start the GPU worker and the compile pool.
        self.process = context.Process(target=_agent_main, args=(child_conn, warm),
                                       name=f"autogen-agent-gpu{device_index}")
        try:
            self.process.start()
        finally:
            child_conn.close()  # the child's end: the pipe reads EOF once the child is gone

    def request(self, request, progress: Callable[[str], None],
                on_error: Callable[[str], None] | None = None) -> None:
        """Send a request; ``progress`` gets its lines, ``on_error`` the text of its failure."""
        self._progress, self._on_error, self.error, self._done = progress, on_error, None, False
        self.send(request)

    def send(self, message) -> None:
        try:
            self._conn.send(message)
        except OSError:
            pass  # it died: its reader reports it

    def wait_for(self, wanted: str, timeout_s: float | None = None):
        """Forward the request's lines until a message of kind ``wanted`` (its value is returned);
        None at the request's end ("done"), the agent's exit or ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not (self.exited or self._done):
            if deadline is not None and not self._conn.poll(max(0.0, deadline - time.monotonic())):
                return None
            try:
                kind, value = self._conn.recv()
            except (EOFError, OSError):
                self._on_exit()
                return None
            if kind == "progress":
                self._progress(value)
            elif kind == "error":
                text, self.error = value
                self.error = self.error or RuntimeError(text)
                if self._on_error is not None:
                    self._on_error(text)
            elif kind == wanted:
                return value
            elif kind == "done":
                self._done = True
        return None

    def finish_request(self) -> None:
        """Read the request's last lines until its end."""
        self.wait_for("done", timeout_s=EXIT_S)

    def failure(self, what: str) -> BaseException:
        """Why the request ended without ``what``: its error, or the agent's exit."""
        if self.error is not None:
            return self.error
        return RuntimeError(f"the GPU agent of GPU {self.device_index} {what}")

    def end(self, grace_s: float = EXIT_S) -> None:
        """Reap the process (told to leave by the caller, between requests): given ``grace_s``
        to exit, then stopped with SIGTERM (its search loop gives its claims back), then killed."""
        process = self.process
        process.join(grace_s)
        if process.is_alive():
            process.terminate()
            process.join(TERMINATE_S)
        if process.is_alive():
            process.kill()
            process.join()
        self.exited = True

    def _on_exit(self) -> None:
        self.exited = True
        self.process.join(TERMINATE_S)
        code = self.process.exitcode
        if self.error is None and code != 0:
            self._progress(f"GPU agent died (exit code {code})")


# Agents spawned by `autogen tune` before its imports (start_agents_early), by GPU, until the run
# adopts them (adopt_early_agent) or discards them (discard_early_agents).
_early: dict[int, "GpuAgent"] = {}


def start_agents_early(gpus: tuple[int, ...], problems: list[Problem], trials: int, cache_mode: str,
                       workers: int, eval_timeout_s: float) -> None:
    """Spawn now the agents a run on ``gpus`` starts with (agents_first_problems), each starting its
    first problem's GPU worker: their start-up overlaps the caller's imports."""
    discard_early_agents()
    for gpu, problem in agents_first_problems(gpus, problems, trials).items():
        _early[gpu] = GpuAgent(gpu, warm_of(GpuBackend, problem, cache_mode, gpu, workers, eval_timeout_s))


def adopt_early_agent(device_index: int) -> "GpuAgent | None":
    """The agent start_agents_early spawned for ``device_index``, now the caller's to end."""
    return _early.pop(device_index, None)


def discard_early_agents() -> None:
    """End the agents spawned early that no run adopted (a run answered from the database, say)."""
    agents = list(_early.values())
    _early.clear()
    for agent in agents:
        agent.send(None)  # its first request: it leaves at once, stopping its GPU worker
    for agent in agents:
        agent.end()


# -- the agent's side -------------------------------------------------------------------------------


class Parent:
    """The agent's end of the pipe; several threads of the search report through it."""

    def __init__(self, conn):
        self.conn = conn
        self.lock = threading.Lock()

    def send(self, kind: str, value) -> None:
        with self.lock:
            try:
                self.conn.send((kind, value))
            except OSError:
                pass  # the parent is gone: stop_with_parent's watch stops this process

    def progress(self, line: str) -> None:
        self.send("progress", line)

    def receive(self):
        """The parent's word (a request, Go, Finish, or None); None when the parent is gone."""
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            return None


class Stop:
    """SIGTERM in an agent: the parent ending it (Ctrl-C, an error), or its own watch once its
    parent is gone. While it searches, the search loop is asked to stop at its next step: it
    gives its claims back, never cut midway through a database transaction (an exception raised
    there can leave a connection holding SQLite's write lock, and this process's own threads
    then wait the busy timeout out). Otherwise nothing is claimed: KeyboardInterrupt ends it."""

    def __init__(self):
        self.event = threading.Event()
        self.searching = False

    def __call__(self, _signum, _frame) -> None:
        if not self.searching:
            raise KeyboardInterrupt
        self.event.set()


def _agent_main(conn, warm: Warm | None) -> None:
    # Ctrl-C reaches the whole process group; the parent decides, and ends its agents with
    # SIGTERM. Ignored here, SIGINT is ignored by the GPU worker and compile pool started here
    # too: none dies under a variant in flight, each is closed by this process on its way out.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stop = Stop()
    signal.signal(signal.SIGTERM, stop)
    # The parent's stdout carries its --json document: nothing of an agent's may go there.
    os.dup2(2, 1)
    parent = Parent(conn)
    stop_with_parent(os.getppid())  # orphaned, it stops as if the parent had ended it
    keep_in_this_child()
    start_ahead = getattr(warm.backend_factory, "prestart", None) if warm is not None else None
    if start_ahead is not None:
        start_ahead(warm.spec, warm.workers, warm.eval_timeout_s)
    # What a request does (the tuner; imported here, after the GPU worker is on its way): this
    # module is the process and its pipe.
    from autogen.distributed.multi_gpu import serve_request as serve
    try:
        while not stop.event.is_set():
            request = parent.receive()
            if request is None:
                break
            try:
                serve(parent, request, stop)
            except KeyboardInterrupt:
                break  # stopped
            except BaseException as exc:
                parent.send("error", (f"{type(exc).__name__}: {exc}", _portable(exc)))
            finally:
                parent.send("done", None)
    except KeyboardInterrupt:
        pass  # stopped between requests
    finally:
        release_kept()


def _portable(exc: BaseException) -> BaseException | None:
    """``exc`` if it survives pickling (the parent raises it as it is), else None."""
    try:
        return pickle.loads(pickle.dumps(exc))
    except Exception:
        return None
