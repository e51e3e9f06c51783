"""GPU-side evaluation of variants, in a child process that can be replaced.

A kernel that faults (illegal address) poisons its CUDA context for the rest of the process, and
one that hangs never returns. So the tuner never touches the GPU itself: an Evaluator lives in a
spawned child, the parent talks to it through a pipe with a deadline, and a dead, hung or poisoned
child is killed and started again while the trial that broke it is recorded as failed.
"""

from __future__ import annotations

import importlib
import json
import multiprocessing
import os
import secrets
from dataclasses import dataclass

import numpy as np

from .family import get_family
from .gpu import device_identity, free_device_memory, require_cupy
from .measure import build_timer, time_enqueue, timing_sets, validate

STARTUP_TIMEOUT_S = 180.0

COPY_KERNEL = r"""
extern "C" __global__ void autogen_copy_float4(const float4* __restrict__ src, float4* __restrict__ dst,
                                               long long count)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < count;
         i += (long long)gridDim.x * blockDim.x)
        dst[i] = src[i];
}
"""


def _bandwidth_file():
    from .compile import default_cache_dir
    return default_cache_dir().parent / "copy_bandwidth.json"


def _bandwidth_cache() -> dict:
    try:
        return json.loads(_bandwidth_file().read_text())
    except (OSError, ValueError):
        return {}


def _store_bandwidth(key: str, gbs: float) -> None:
    path = _bandwidth_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**_bandwidth_cache(), key: gbs}, indent=1))


@dataclass(frozen=True)
class WorkSpec:
    """Everything a worker needs to set itself up; picklable."""

    family: str
    dtype: str
    dims: tuple[tuple[str, int | str], ...]
    family_module: str  # the module that registers the family: the child imports it to find it
    cache_mode: str = "cold"  # "cold": rotate input sets larger than 4x L2; "hot": one set

    @classmethod
    def of(cls, problem, cache_mode: str = "cold") -> "WorkSpec":
        return cls(problem.family, problem.dtype, problem.dims, get_family(problem.family).module, cache_mode)


@dataclass(frozen=True)
class Outcome:
    kernel_name: str
    status: str  # "ok" | "failed"
    reason: str = ""
    error: float | None = None
    samples_us: tuple[float, ...] = ()


class Evaluator:
    """Validates and times variants of one problem on the current GPU, in this process."""

    def __init__(self, spec: WorkSpec):
        importlib.import_module(spec.family_module)  # registers a user's family in this process too
        self.cupy = require_cupy()
        self.family = get_family(spec.family)
        self.problem = self.family.problem(spec.dtype, **dict(spec.dims))
        self.device = device_identity()
        self.cold = spec.cache_mode == "cold"
        self.context_lost = False
        self._sets: list[dict] | None = None
        self._modules: dict[str, object] = {}  # keeps loaded modules alive

    def _rng(self):
        # Fresh inputs for every check: a new unpredictable seed each time.
        return self.cupy.random.default_rng(secrets.randbits(63))

    def timing_inputs(self) -> list[dict]:
        if self._sets is None:
            self._sets = timing_sets(self.family, self.problem, self.cupy, self._rng(), self.cold,
                                     self.device.l2_bytes, free_device_memory())
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
                        self.cupy, self._rng())

    def evaluate(self, kernel_name: str, cubin: bytes, params: dict) -> Outcome:
        """Validate on fresh random inputs, then time; a failure is an Outcome, not an exception."""
        try:
            launch = self._launcher(kernel_name, cubin, params)
            check = validate(self.family, self.problem, launch, self.cupy, self._rng())
            if not check.ok:
                return Outcome(kernel_name, "failed", f"validation: {check.reason}", check.error)
            sets = self.timing_inputs()
            timing = time_enqueue(self.cupy, lambda i: launch(sets[i]), len(sets))
            return Outcome(kernel_name, "ok", "", check.error, timing.samples_us)
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

    def copy_bandwidth_gbs(self, nbytes: int = 1 << 30) -> float:
        """Device-to-device copy bandwidth, bytes read plus written: the roofline's ceiling.
        Measured once per GPU and driver with a 16-byte-per-thread copy kernel, then cached."""
        cached = _bandwidth_cache()
        key = f"{self.device.name}|{self.device.driver_version}"
        if key in cached:
            return cached[key]
        from .compile import compile_cubin

        count = min(nbytes, free_device_memory() // 4) // 16  # float4 elements
        src = self.cupy.ones(4 * count, dtype=self.cupy.float32)
        dst = self.cupy.empty_like(src)
        module = self.cupy.cuda.function.Module()
        module.load(compile_cubin(COPY_KERNEL, self.device.arch))
        copy = module.get_function("autogen_copy_float4")
        blocks = 4 * self.device.sm_count * 8
        args = (src, dst, np.int64(count))
        timing = time_enqueue(self.cupy, lambda _i: copy((blocks,), (256,), args), 1, replays=5)
        gbs = 2 * 16 * count / (timing.median_us * 1e-6) / 1e9
        _store_bandwidth(key, gbs)
        return gbs

    def identity(self):
        return self.device, free_device_memory()

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
    try:
        evaluator = Evaluator(spec)
        conn.send(("ok", evaluator.identity(), True))
    except Exception as exc:
        conn.send(("raise", f"{type(exc).__name__}: {_one_line(exc)}", False))
        return
    while True:
        message = conn.recv()
        if message is None:
            return
        method, args = message
        try:
            reply = ("ok", getattr(evaluator, method)(*args))
        except Exception as exc:
            reply = ("raise", f"{type(exc).__name__}: {_one_line(exc)}")
        conn.send(reply + (not evaluator.context_lost,))
        if evaluator.context_lost:
            # Leave without CuPy's teardown: freeing memory on a poisoned context only prints noise.
            conn.close()
            os._exit(3)


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
        self.device, self.free_bytes = self._start()

    def _start(self):
        context = multiprocessing.get_context("spawn")
        self._conn, child_conn = context.Pipe()
        self._process = context.Process(target=_worker_main, args=(child_conn, self.spec), daemon=True)
        self._process.start()
        child_conn.close()
        return self._receive(STARTUP_TIMEOUT_S, "starting the GPU worker")

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

    def call(self, method: str, *args, timeout_s: float | None = None):
        if self._process is None:
            self.restarts += 1
            self._start()
        self._conn.send((method, args))
        return self._receive(timeout_s or self.timeout_s, f"in {method}")

    def evaluate(self, kernel_name: str, cubin: bytes, params: dict) -> Outcome:
        try:
            return self.call("evaluate", kernel_name, cubin, params)
        except (WorkerLost, WorkerError) as exc:
            return Outcome(kernel_name, "failed", str(exc))

    def _kill(self) -> int | None:
        process, self._process = self._process, None
        if process is None:
            return None
        if process.is_alive():
            process.kill()
        process.join(10)
        return process.exitcode

    def close(self) -> None:
        if self._process is not None and self._process.is_alive():
            try:
                self._conn.send(None)
                self._process.join(5)
            except OSError:
                pass
        self._kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


def default_workers() -> int:
    return max(1, os.cpu_count() or 1)
