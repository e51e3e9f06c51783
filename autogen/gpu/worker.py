"""GPU-side evaluation of variants, in a child process that can be replaced.

A kernel that faults (illegal address) poisons its CUDA context for the rest of the process, and
one that hangs never returns. So the tuner never touches the GPU itself: an Evaluator lives in a
spawned child, the parent talks to it through a pipe with a deadline, and a dead, hung or poisoned
child is killed and started again while the trial that broke it is recorded as failed.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time


from autogen.errors import GpuUnavailableError
from autogen.gpu.evaluator import (Ceilings, Evaluate, Evaluator, MeasureCeilings, one_line, Outcome, Retime,
                                   Serve, StagesSpent, TimePeer, WorkSpec)

STARTUP_TIMEOUT_S = 180.0

# Thread-pool sizes that autogen's child processes start with, unless the user set them. NumPy's
# BLAS (and OpenMP) otherwise start one thread per core in every process that imports NumPy, and
# those threads spin after each call: the GPU worker's host checks (small float64 products) then
# compete with the compile pool's processes for the cores.
CHILD_THREAD_LIMITS = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# CuPy compiles its own kernels (the checks' elementwise and reduction operations) on their first
# use in a process, most of a cold GPU worker's first check; with NVRTC's precompiled headers each
# compile after a process's first reuses the CuPy headers it parsed (measured: docs/internals.md,
# "How a variant is judged"). CuPy reads the variable when it is imported; its cache keys ignore it.
CHILD_CUPY_OPTIONS = {"CUPY_NVRTC_USE_PCH": "1"}
CHILD_ENVIRONMENT = {**CHILD_THREAD_LIMITS, **CHILD_CUPY_OPTIONS}
_environment_lock = threading.Lock()


@contextlib.contextmanager
def child_environment():
    """Within: processes spawned by this one start with CHILD_ENVIRONMENT (each variable where
    the user set none). os.environ is restored after, so that the caller's own later children are
    unaffected."""
    with _environment_lock:
        added = [name for name in CHILD_ENVIRONMENT if name not in os.environ]
        for name in added:
            os.environ[name] = CHILD_ENVIRONMENT[name]
        try:
            yield
        finally:
            for name in added:
                os.environ.pop(name, None)


# How often a child process checks that its parent is alive (stop_with_parent).
PARENT_POLL_S = 0.5


def stop_with_parent(parent_pid: int) -> None:
    """Send this process SIGTERM once its parent ``parent_pid`` is gone (killed with SIGKILL,
    say), from a daemon thread. A compile worker would otherwise wait on its task queue forever;
    a GPU agent (autogen.distributed.gpu_agent) turns SIGTERM into a clean stop."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="autogen-parent-watch", daemon=True).start()


def bind_device(device_index: int | None) -> None:
    """Make the child see only its GPU, before CUDA starts in it (autogen.distributed.multi_gpu)."""
    if device_index is None:
        return
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    entries = [e.strip() for e in visible.split(",")] if visible else None
    os.environ["CUDA_VISIBLE_DEVICES"] = entries[device_index] if entries else str(device_index)



def _worker_main(conn, spec: WorkSpec) -> None:
    # Every reply is (status, value, still_usable); a worker whose context is lost says so and exits.
    # The parent may be gone by the time this worker speaks or listens (it exits without waiting
    # for a worker it started ahead of need, e.g. after its own "no GPU" error, which can come
    # before or after this worker's): then this worker ends, quietly.
    entered_at = time.time()  # the parent subtracts its spawn time: the interpreter's start and unpickling
    bind_device(spec.device_index)
    try:
        evaluator = Evaluator(spec)
        message = ("ok", evaluator.identity() + (entered_at,), True)
    except Exception as exc:
        message = ("raise", f"{type(exc).__name__}: {one_line(exc)}", False)
    if not _send_to_parent(conn, message) or message[0] == "raise":
        return
    _prepare_while_idle(conn, evaluator)
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):  # the parent is gone (it exits without waiting for this worker's teardown)
            return
        if request is None:
            return
        try:
            reply = ("ok", evaluator.serve(request))
        except Exception as exc:
            reply = ("raise", f"{type(exc).__name__}: {one_line(exc)}")
        sent = _send_to_parent(conn, reply + (not evaluator.context_lost,))
        if evaluator.context_lost:
            # Leave without CuPy's teardown: freeing memory on a poisoned context only prints noise.
            conn.close()
            os._exit(3)
        if not sent:
            return
        if isinstance(request, Serve) and request.prepare and reply[0] == "ok":
            _prepare_while_idle(conn, evaluator)


def _prepare_while_idle(conn, evaluator: Evaluator) -> None:
    """Evaluator.prepare, unless a request is waiting already (it goes first: what prepare does,
    its first variant does anyway)."""
    try:
        if conn.poll(0):
            return
    except (EOFError, OSError):  # the parent is gone: the next recv ends this worker
        return
    evaluator.prepare()


def _send_to_parent(conn, message) -> bool:
    """Send `message`; False where the parent's end is closed (it exited or discarded this worker)."""
    try:
        conn.send(message)
        return True
    except OSError:  # BrokenPipeError, ConnectionResetError: nobody is listening any more
        return False


class WorkerLost(Exception):
    """The worker died, hung past its deadline, or lost its CUDA context."""


class WorkerError(Exception):
    """The worker raised while serving a request."""


class IsolatedEvaluator:
    """Parent-side handle of an Evaluator in a child process; restarts it when it is lost."""

    def __init__(self, spec: WorkSpec, timeout_s: float = 60.0):
        self.spec = spec
        self.timeout_s = timeout_s
        self.restarts = 0
        self._process = None
        self._conn = None
        self._identity = None
        self.waited_s: dict[str, float] = {}  # seconds the caller waited, per request kind (phases)
        self._spawn()  # the child imports CuPy and creates its context while the caller goes on

    @property
    def device(self):
        return self._ready()[0]

    @property
    def free_bytes(self) -> int:
        return self._ready()[1]

    def _ready(self):
        """(device identity, free bytes, start-up timings) from the worker's first message,
        waited for once."""
        if self._identity is None:
            began = time.monotonic()
            try:
                self._identity = self._receive(STARTUP_TIMEOUT_S, "starting the GPU worker")
            except WorkerError as exc:
                # CuPy or the device failed in the worker (the parent checked the GPU through the
                # driver only: autogen.gpu.device.require_gpu): one line, as require_cupy() says it.
                raise GpuUnavailableError(f"the GPU worker could not start: {exc}") from None
            self._count("startup_wait", time.monotonic() - began)
            for name, seconds in (self._identity[2] if len(self._identity) > 2 else {}).items():
                self.waited_s[name] = seconds
            if len(self._identity) > 3:  # from the spawn to the child's first line (wall clocks of one machine)
                self.waited_s["worker_boot"] = round(max(0.0, self._identity[3] - self._spawned_at), 3)
        return self._identity

    def _count(self, what: str, seconds: float) -> None:
        self.waited_s[what] = round(self.waited_s.get(what, 0.0) + seconds, 3)

    def _spawn(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child_conn = context.Pipe()
        self._process = context.Process(target=_worker_main, args=(child_conn, self.spec), daemon=True)
        self._spawned_at = time.time()
        with child_environment():
            self._process.start()
        child_conn.close()

    def _start(self):
        self._spawn()
        self._identity = None
        return self._ready()

    def _receive(self, timeout_s: float, what: str):
        if not self._conn.poll(timeout_s):
            self._kill()
            raise WorkerLost(f"timed out after {timeout_s:.0f} s {what}")
        try:
            status, value, usable = self._conn.recv()
        except (EOFError, OSError):
            code = self._kill()
            raise WorkerLost(f"GPU worker died {what} (exit code {code})") from None
        if not usable:
            self._kill()  # its CUDA context is gone; the next call starts a fresh worker
        if status == "raise":
            raise WorkerError(value)
        return value

    def request(self, request, timeout_s: float | None = None):
        """Send one typed request to the worker (started again if it was lost) and wait for
        the answer, at most `timeout_s` (default: the evaluation timeout)."""
        if self._process is None:
            self.restarts += 1
            self._start()
        self._ready()
        began = time.monotonic()
        self._conn.send(request)
        try:
            return self._receive(timeout_s or self.timeout_s, f"in {type(request).__name__}")
        finally:
            self._count(type(request).__name__, time.monotonic() - began)

    # The calls the tuner makes; autogen.testing.replay.ReplayEvaluator answers the same ones.
    def evaluate(self, kernel_name: str, cubin: bytes, params: dict, best_us: float | None = None) -> Outcome:
        try:
            return self.request(Evaluate(kernel_name, cubin, params, best_us))
        except (WorkerLost, WorkerError, GpuUnavailableError) as exc:  # the last: a restart that failed
            return Outcome(kernel_name, "failed", str(exc))

    def time_peer(self) -> tuple[str, tuple[float, ...]] | None:
        return self.request(TimePeer())

    def retime(self, candidates, rounds: int, timeout_s: float | None = None) -> dict[str, tuple[float, ...]]:
        return self.request(Retime(tuple(candidates), rounds), timeout_s)

    def ceilings(self) -> Ceilings:
        return self.request(MeasureCeilings())

    def stages_spent(self) -> dict[str, float]:
        """Where the worker's evaluations went (seconds per stage); {} when it is not running."""
        if self._process is None or self._identity is None:
            return {}
        try:
            self._conn.send(StagesSpent())
            return self._receive(10.0, "in StagesSpent")
        except (WorkerLost, WorkerError, OSError):
            return {}

    def usable(self) -> bool:
        """Whether the worker is running and was ready, to be kept for another problem."""
        return self._process is not None and self._identity is not None and self._process.is_alive()

    def rest(self) -> bool:
        """Let go of the problem's device memory (its input sets, loaded modules) while the worker
        is kept for another problem, so that it holds none beside another process's work on the
        same GPU. False if the worker cannot (lost, or it failed): then it is not to be kept."""
        try:
            self.request(Serve(self.spec), timeout_s=STARTUP_TIMEOUT_S)
            return True
        except (WorkerLost, WorkerError, GpuUnavailableError):
            return False

    def take_up(self, spec: WorkSpec, timeout_s: float) -> None:
        """Serve the problem of ``spec`` on the same GPU from now on (a worker kept from an earlier
        problem: no new process, imports or CUDA context). Its counts start again: what it waited
        for is the new problem's (``Serve``: the switch itself). Raises what the request raises
        (WorkerLost, WorkerError): the caller starts a new worker instead."""
        if spec.device_index != self.spec.device_index:
            raise ValueError(f"a worker of GPU {self.spec.device_index} cannot serve GPU {spec.device_index}")
        self.spec, self.timeout_s = spec, timeout_s
        self.waited_s, self.restarts = {}, 0
        self._identity = self.request(Serve(spec, prepare=True), timeout_s=STARTUP_TIMEOUT_S)

    def _kill(self) -> int | None:
        process, self._process = self._process, None
        if process is None:
            return None
        if process.is_alive():
            process.kill()
        process.join(10)
        return process.exitcode

    def discard(self) -> None:
        """Stop the worker at once, ready or not (it was started ahead of a need that went away),
        without waiting for it to exit: killed while the driver makes its CUDA context, it takes
        tens of ms to go, and nothing needs its exit status."""
        process, self._process = self._process, None
        if process is not None and process.is_alive():
            process.kill()

    def close(self, wait: bool = True) -> None:
        """Ask the worker to stop; `wait=False` leaves its CUDA teardown (a visible part of a
        short command) to run on its own (a daemon: the interpreter's exit ends it if it is still running)."""
        if self._process is not None and self._process.is_alive():
            try:
                self._conn.send(None)
                if not wait:
                    self._process = None
                    return
                self._process.join(5)
            except OSError:
                pass
        self._kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


# At most this many compile processes by default. A cold 60-trial sgemv tune was faster with 8
# than with one compile process per core on a 16-core host (docs/history/sessions.md, eleventh
# session): the spawned processes' start-up and compiles took CPU from the search loop and the GPU worker (its
# Optuna import, asks and checks all slower), and a search of 60 variants keeps 8 busy enough.
MAX_DEFAULT_WORKERS = 8


def default_workers(gpus: int = 1) -> int:
    """NVRTC compile processes for each GPU by default: half the cores (the search loops, the GPU
    workers and their threads need the rest) shared among the ``gpus`` tuning at once, at most
    MAX_DEFAULT_WORKERS each. Each GPU's search is fed by its own pool: with a fixed total split
    over the GPUs, two GPUs compiled no faster than one and waited on it (docs/distributed.md)."""
    return max(1, min(MAX_DEFAULT_WORKERS, (os.cpu_count() or 1) // 2 // max(1, gpus)))
