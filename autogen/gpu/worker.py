"""GPU-side evaluation of variants, in a child process that can be replaced.

A kernel that faults (illegal address) poisons its CUDA context for the rest of the process, and
one that hangs never returns. So the tuner never touches the GPU itself: an Evaluator lives in a
spawned child, the parent talks to it through a pipe with a deadline, and a dead, hung or poisoned
child is killed and started again while the trial that broke it is recorded as failed.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import os
import secrets
import signal
import threading
import time
from dataclasses import dataclass

import numpy as np

from autogen.gpu import roofline
from autogen.errors import GpuUnavailableError
from autogen.core.registry import get_family
from autogen.gpu.device import device_identity, free_device_memory, require_cupy
from autogen.gpu.measure import (
    EARLY_FACTOR,
    REPLAYS,
    build_timer,
    sample_until,
    time_enqueue,
    time_into,
    timing_sets,
    validate,
)

STARTUP_TIMEOUT_S = 180.0

# Thread-pool sizes that autogen's child processes start with, unless the user set them. NumPy's
# BLAS (and OpenMP) otherwise start one thread per core in every process that imports NumPy, and
# those threads spin after each call: the GPU worker's host checks (small float64 products) then
# compete with the compile pool's processes for the cores.
CHILD_THREAD_LIMITS = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
_environment_lock = threading.Lock()


@contextlib.contextmanager
def child_environment():
    """Within: processes spawned by this one start with CHILD_THREAD_LIMITS (where the user set
    none). os.environ is restored after, so that the caller's own later children are unaffected."""
    with _environment_lock:
        added = [name for name in CHILD_THREAD_LIMITS if name not in os.environ]
        for name in added:
            os.environ[name] = CHILD_THREAD_LIMITS[name]
        try:
            yield
        finally:
            for name in added:
                os.environ.pop(name, None)


@dataclass(frozen=True)
class WorkSpec:
    """Everything a worker needs to set itself up; picklable."""

    family: str
    dtype: str
    dims: tuple[tuple[str, int | str], ...]
    cache_mode: str = "cold"  # "cold": rotate input sets larger than 4x L2; "hot": one set
    # The module that registers the family: the child imports it to find it. Filled in from
    # the registry of the process that makes the spec when not given.
    family_module: str = ""
    device_index: int | None = None  # the GPU (ordinal as this process sees them); None: the current one

    def __post_init__(self):
        if not self.family_module:
            object.__setattr__(self, "family_module", get_family(self.family).module)

    @classmethod
    def of(cls, problem, cache_mode: str = "cold", device_index: int | None = None) -> "WorkSpec":
        return cls(problem.family, problem.dtype, problem.dims, cache_mode, device_index=device_index)


# How often a child process checks that its parent is alive (stop_with_parent).
PARENT_POLL_S = 0.5


def stop_with_parent(parent_pid: int) -> None:
    """Send this process SIGTERM once its parent ``parent_pid`` is gone (killed with SIGKILL,
    say), from a daemon thread. A compile worker would otherwise wait on its task queue forever;
    a helper process (autogen.distributed.helper_process) turns SIGTERM into a clean stop."""
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


@dataclass(frozen=True)
class Outcome:
    kernel_name: str
    status: str  # "ok" | "failed"
    reason: str = ""
    error: float | None = None
    samples_us: tuple[float, ...] = ()


@dataclass(frozen=True)
class Ceilings:
    """The roofline of the GPU (autogen.gpu.roofline): what % of floor is measured against."""

    copy_gbs: float
    fp32_tflops: float


# -- the requests the tuner makes of an evaluator (typed: the pipe carries these objects) ---------


@dataclass(frozen=True)
class Evaluate:
    """Validate one variant on fresh inputs, then time it: an Outcome."""

    kernel_name: str
    cubin: bytes
    params: dict
    best_us: float | None = None  # the best time so far: a variant over EARLY_FACTOR x it stops early


@dataclass(frozen=True)
class TimePeer:
    """The family's library peer, timed the same way on the same inputs: (name, samples) or None."""


@dataclass(frozen=True)
class Retime:
    """Re-time candidates (name, cubin, params) interleaved, `rounds` times: name -> samples."""

    candidates: tuple[tuple[str, bytes, dict], ...]
    rounds: int


@dataclass(frozen=True)
class MeasureCeilings:
    """The GPU's copy bandwidth and FP32 peak: a Ceilings."""


@dataclass(frozen=True)
class StagesSpent:
    """Seconds the worker spent in each stage of its evaluations so far (phases): a dict."""


class Evaluator:
    """Validates and times variants of one problem on the current GPU, in this process."""

    def __init__(self, spec: WorkSpec):
        began = time.monotonic()
        importlib.import_module(spec.family_module)  # registers a user's family in this process too
        self.cupy = require_cupy()
        imported = time.monotonic()
        self.cupy.cuda.runtime.free(0)  # creates the CUDA context now, where it is timed
        self.startup_s = {"worker_imports": round(imported - began, 3),
                          "worker_context": round(time.monotonic() - imported, 3)}
        self.family = get_family(spec.family)
        self.problem = self.family.problem(spec.dtype, **dict(spec.dims))
        self.device = device_identity()
        self.cold = spec.cache_mode == "cold"
        self.context_lost = False
        self._sets: list[dict] | None = None
        self._generator = None
        self._host_generator = None
        self._modules: dict[str, object] = {}  # keeps loaded modules alive
        self.spent_s: dict[str, float] = {}  # per stage of evaluate (load, validate, inputs, graph, replay)

    def _stage(self, name: str):
        return time_into(self.spent_s, name)

    def _rng(self):
        # Fresh inputs for every check: one generator per worker, seeded unpredictably once, whose
        # stream every check advances (a new CuPy Generator per check is not free).
        if self._generator is None:
            self._generator = self.cupy.random.default_rng(secrets.randbits(63))
        return self._generator

    def _host_rng(self):
        # Small problems are checked on the host (autogen.gpu.measure.checks_on_host), from this one.
        if self._host_generator is None:
            self._host_generator = np.random.default_rng(secrets.randbits(63))
        return self._host_generator

    def timing_inputs(self) -> list[dict]:
        if self._sets is None:
            self._sets = timing_sets(self.family, self.problem, self.cupy, self._rng(), self.cold,
                                     self.device.l2_bytes, free_device_memory(), self._host_rng())
        return self._sets

    def _launcher(self, kernel_name: str, cubin: bytes, params: dict):
        """A function that enqueues every step of the variant on the current stream."""
        config = self.family.space.check(params)
        module = self.cupy.cuda.function.Module()
        module.load(cubin)
        self._modules[kernel_name] = module
        steps = [(module.get_function(kernel_name + step.suffix), step)
                 for step in self.family.plan(self.problem, config)]

        def launch(inputs: dict) -> None:
            for function, step in steps:
                function(step.launch.grid, step.launch.block, step.args(inputs),
                         shared_mem=step.launch.shared_bytes)

        return launch

    def check(self, kernel_name: str, cubin: bytes, params: dict):
        """Validation only (fresh random inputs, poisoned outputs), raising on CUDA errors."""
        return validate(self.family, self.problem, self._launcher(kernel_name, cubin, params),
                        self.cupy, self._rng(), self._host_rng())

    def evaluate(self, kernel_name: str, cubin: bytes, params: dict, best_us: float | None = None) -> Outcome:
        """Validate on fresh random inputs, then time; a failure is an Outcome, not an exception.
        With `best_us` (the best so far), a variant whose first replays are over EARLY_FACTOR x
        it keeps those few samples and is not replayed further."""
        try:
            with self._stage("load"):
                launch = self._launcher(kernel_name, cubin, params)
            with self._stage("validate"):
                check = validate(self.family, self.problem, launch, self.cupy, self._rng(), self._host_rng())
            if not check.ok:
                return Outcome(kernel_name, "failed", f"validation: {check.reason}", check.error)
            with self._stage("inputs"):  # the first evaluation makes the rotating input sets
                sets = self.timing_inputs()
            with self._stage("graph"):
                timer = build_timer(self.cupy, lambda i: launch(sets[i]), len(sets))
            with self._stage("replay"):
                samples = sample_until(timer.replay_us, REPLAYS, EARLY_FACTOR * best_us if best_us else None)
            return Outcome(kernel_name, "ok", "", check.error, samples)
        except Exception as exc:  # CUDA launch/driver errors, out of resources, ...
            self._note_context_health()
            return Outcome(kernel_name, "failed", f"launch: {type(exc).__name__}: {_one_line(exc)}")

    def time_peer(self) -> tuple[str, tuple[float, ...]] | None:
        """The family's library peer timed the same way, on the same input sets."""
        peer = self.family.peer(self.problem)
        if peer is None:
            return None
        sets = self.timing_inputs()
        timing = time_enqueue(self.cupy, lambda i: peer.run(sets[i]), len(sets))
        return peer.name, timing.samples_us

    def retime(self, candidates: list[tuple[str, bytes, dict]], rounds: int) -> dict[str, tuple[float, ...]]:
        """Replay the candidates' graphs interleaved, round after round, so drift hits all alike."""
        sets = self.timing_inputs()
        timers = {}
        for name, cubin, params in candidates:
            launch = self._launcher(name, cubin, params)
            timers[name] = build_timer(self.cupy, lambda i, launch=launch: launch(sets[i]), len(sets))
        samples: dict[str, list[float]] = {name: [] for name in timers}
        for _ in range(rounds):
            for name, timer in timers.items():
                samples[name].append(timer.replay_us())
        return {name: tuple(values) for name, values in samples.items()}

    def ceilings(self) -> Ceilings:
        """The roofline's two ceilings, measured once per GPU and driver, then cached."""
        return Ceilings(roofline.copy_bandwidth_gbs(self.cupy, self.device, free_device_memory()),
                        roofline.fp32_peak_tflops(self.cupy, self.device))

    def serve(self, request):
        """Answer one typed request."""
        if isinstance(request, Evaluate):
            return self.evaluate(request.kernel_name, request.cubin, request.params, request.best_us)
        if isinstance(request, TimePeer):
            return self.time_peer()
        if isinstance(request, Retime):
            return self.retime(list(request.candidates), request.rounds)
        if isinstance(request, MeasureCeilings):
            return self.ceilings()
        if isinstance(request, StagesSpent):
            return {name: round(seconds, 3) for name, seconds in self.spent_s.items()}
        raise TypeError(f"the GPU worker has no request {type(request).__name__}")

    def identity(self):
        return self.device, free_device_memory(), self.startup_s

    def _note_context_health(self) -> None:
        # Sticky errors (illegal address, trap) leave the context unusable: the process must go.
        try:
            self.cupy.cuda.runtime.deviceSynchronize()
            int(self.cupy.arange(2).sum())
        except Exception:
            self.context_lost = True


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _worker_main(conn, spec: WorkSpec) -> None:
    # Every reply is (status, value, still_usable); a worker whose context is lost says so and exits.
    # The parent may be gone by the time this worker speaks or listens (it exits without waiting
    # for a worker it started ahead of need, e.g. after its own "no GPU" error, which can come
    # before or after this worker's): then this worker ends, quietly.
    bind_device(spec.device_index)
    try:
        evaluator = Evaluator(spec)
        message = ("ok", evaluator.identity(), True)
    except Exception as exc:
        message = ("raise", f"{type(exc).__name__}: {_one_line(exc)}", False)
    if not _send_to_parent(conn, message) or message[0] == "raise":
        return
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
            reply = ("raise", f"{type(exc).__name__}: {_one_line(exc)}")
        sent = _send_to_parent(conn, reply + (not evaluator.context_lost,))
        if evaluator.context_lost:
            # Leave without CuPy's teardown: freeing memory on a poisoned context only prints noise.
            conn.close()
            os._exit(3)
        if not sent:
            return


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
        return self._identity

    def _count(self, what: str, seconds: float) -> None:
        self.waited_s[what] = round(self.waited_s.get(what, 0.0) + seconds, 3)

    def _spawn(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child_conn = context.Pipe()
        self._process = context.Process(target=_worker_main, args=(child_conn, self.spec), daemon=True)
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


def default_workers() -> int:
    """NVRTC compile processes by default: half the cores (the search loop, the GPU worker and
    their threads need the rest), at most MAX_DEFAULT_WORKERS."""
    return max(1, min(MAX_DEFAULT_WORKERS, (os.cpu_count() or 1) // 2))
