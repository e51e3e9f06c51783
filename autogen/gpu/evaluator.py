"""The GPU side of tuning: an Evaluator validates and times variants of one problem on one GPU
(it lives in the worker process of autogen.gpu.worker), and the typed requests and replies that
cross the pipe between that process and the tuner."""

from __future__ import annotations

import importlib
import pickle
import secrets
import threading
import time
from dataclasses import dataclass

import numpy as np

from autogen.core.registry import get_family, recreate
from autogen.gpu import roofline
from autogen.gpu.device import device_identity, free_device_memory, require_cupy
from autogen.gpu.measure import (build_timer, EARLY_FACTOR, REPLAYS, rehearse_checks, sample_until, time_enqueue,
                                 time_into, timing_sets, validate)

# The longest a timing waits for the peer's import still running (Evaluator._await_peer_imports).
PEER_IMPORT_WAIT_S = 300.0


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
    # Family.worker_recipe() pickled, for a family that importing its module does not register
    # (autogen.core.kernel_family's); b"" for every other.
    family_recipe: bytes = b""

    def __post_init__(self):
        if not self.family_module:
            object.__setattr__(self, "family_module", get_family(self.family).module)
        if not self.family_recipe:
            recipe = get_family(self.family).worker_recipe()
            object.__setattr__(self, "family_recipe", pickle.dumps(recipe) if recipe is not None else b"")

    @classmethod
    def of(cls, problem, cache_mode: str = "cold", device_index: int | None = None) -> "WorkSpec":
        return cls(problem.family, problem.dtype, problem.dims, cache_mode, device_index=device_index)



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


@dataclass(frozen=True)
class Serve:
    """From now on, the problem of ``spec`` (on the same GPU): a worker kept from an earlier
    problem, its CUDA context and imports already paid. Answers the identity, as a new worker's
    first message does: (device, free bytes, {}). ``prepare``: then prepare for the problem's
    first variant while no request waits (Evaluator.prepare); without it (a worker put to rest
    between problems) the worker holds no device memory for the problem until asked."""

    spec: "WorkSpec"
    prepare: bool = False


class Evaluator:
    """Validates and times variants of one problem on the current GPU, in this process."""

    def __init__(self, spec: WorkSpec):
        began = time.monotonic()
        _register_family(spec)
        self.cupy = require_cupy()
        imported = time.monotonic()
        self.cupy.cuda.runtime.free(0)  # creates the CUDA context now, where it is timed
        self.startup_s = {"worker_imports": round(imported - began, 3),
                          "worker_context": round(time.monotonic() - imported, 3)}
        queried = time.monotonic()
        self.device = device_identity()
        self.startup_s["worker_device"] = round(time.monotonic() - queried, 3)  # the driver, runtime and NVRTC queried
        self.context_lost = False
        self._generator = None
        self._host_generator = None
        self._use(spec)

    def _use(self, spec: WorkSpec) -> None:
        """Serve the problem of ``spec``; what an earlier problem left (its input sets, loaded
        modules, stage times) is let go, its memory back to the device for the next one's sets."""
        self.family = get_family(spec.family)
        self.problem = self.family.problem(spec.dtype, **dict(spec.dims))
        self.cold = spec.cache_mode == "cold"
        self._sets: list[dict] | None = None
        self._modules: dict[str, object] = {}  # keeps loaded modules alive
        self.spent_s: dict[str, float] = {}  # per stage of evaluate (load, validate, inputs, graph, replay)
        self._peer_imports_started = False
        self._peer_imports: threading.Thread | None = None  # import_in_background's, while it runs
        self.cupy.get_default_memory_pool().free_all_blocks()

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

    def prepare(self) -> None:
        """What the problem's first requests would do first, done ahead while the worker waits for
        them: the checks rehearsed (their CuPy operations compiled: rehearse_checks) and the timing
        sets made. Seconds on an empty CuPy cache, which every GPU worker of a cold machine would
        otherwise pay at its first variant. A failure here is left for that variant to meet and
        report; the time spent is the stage "prepare"."""
        try:
            with self._stage("prepare"):
                rehearse_checks(self.family, self.problem, self.cupy, self._rng())
                self.timing_inputs()
        except Exception:
            self._sets = None  # made again, or failing again, where a request needs them
            self._note_context_health()

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
            self._await_peer_imports()
            with self._stage("graph"):
                timer = build_timer(self.cupy, lambda i: launch(sets[i]), len(sets))
            with self._stage("replay"):
                samples = sample_until(timer.replay_us, REPLAYS, EARLY_FACTOR * best_us if best_us else None)
            return Outcome(kernel_name, "ok", "", check.error, samples)
        except Exception as exc:  # CUDA launch/driver errors, out of resources, ...
            self._note_context_health()
            return Outcome(kernel_name, "failed", f"launch: {type(exc).__name__}: {one_line(exc)}")

    def _await_peer_imports(self) -> None:
        """Timing waits for the peer's import (validation does not). A library's loading holds the
        interpreter for long stretches; replays enqueued meanwhile reach the GPU late, which idles
        between them, and a sample counts the idling: the first variants of a search measured
        several times their time (docs/internals.md, "How a variant is judged"). At most
        PEER_IMPORT_WAIT_S: nothing waits forever."""
        thread = self._peer_imports
        if thread is not None and thread.is_alive():
            with self._stage("peer_imports"):
                thread.join(timeout=PEER_IMPORT_WAIT_S)

    def time_peer(self) -> tuple[str, tuple[float, ...]] | None:
        """The family's library peer timed the same way, on the same input sets."""
        peer = self.family.peer(self.problem)
        if peer is None:
            return None
        sets = self.timing_inputs()
        self._await_peer_imports()
        timing = time_enqueue(self.cupy, lambda i: peer.run(sets[i]), len(sets))
        return peer.name, timing.samples_us

    def retime(self, candidates: list[tuple[str, bytes, dict]], rounds: int) -> dict[str, tuple[float, ...]]:
        """Replay the candidates' graphs interleaved, round after round, so drift hits all alike."""
        sets = self.timing_inputs()
        self._await_peer_imports()
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
            if not self._peer_imports_started:  # a search measures: its peer comes after it
                self._peer_imports_started = True
                self._peer_imports = import_in_background(self.family.peer_imports)
            return self.evaluate(request.kernel_name, request.cubin, request.params, request.best_us)
        if isinstance(request, TimePeer):
            return self.time_peer()
        if isinstance(request, Retime):
            return self.retime(list(request.candidates), request.rounds)
        if isinstance(request, MeasureCeilings):
            return self.ceilings()
        if isinstance(request, StagesSpent):
            return {name: round(seconds, 3) for name, seconds in self.spent_s.items()}
        if isinstance(request, Serve):
            _register_family(request.spec)
            self._use(request.spec)
            return self.device, free_device_memory(), {}
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


def import_in_background(modules: tuple[str, ...]) -> threading.Thread | None:
    """Import `modules` on a daemon thread (None when there are none). A peer's library (PyTorch's
    import takes seconds: docs/internals.md) is then loaded while the search measures rather than
    after it; the peer's own import, when it comes, finds it loaded or waits for it (Python's import
    lock). A module that fails to import is left to the peer, whose own import meets the same error
    and says what it does."""
    if not modules:
        return None

    def load() -> None:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - reported where the peer imports it
                return

    thread = threading.Thread(target=load, name="autogen-peer-imports", daemon=True)
    thread.start()
    return thread


def _register_family(spec: WorkSpec) -> None:
    importlib.import_module(spec.family_module)  # registers a user's family in this process too
    if spec.family_recipe:
        recreate(pickle.loads(spec.family_recipe))  # the parent's own definition of its family


def one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
