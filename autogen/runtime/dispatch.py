"""The runtime dispatcher: serve the best stored kernel for the GPU and shape at hand.

The chain, first match wins (`served_by` names the step):
  "exact"    a winner tuned for this GPU, family, dtype and shape;
  "nearest"  the winner of the nearest tuned shape on this GPU;
  "arch"     a winner from another GPU of the same compute capability (exact shape, else nearest);
  "default"  the family's default config.
Every step but "exact" is validated once on the new shape before it is served, and the check is
remembered in the database; a kernel that fails it is skipped. The user's database is consulted
before the pre-tuned catalog shipped with autogen. A hit costs a dictionary lookup and the launch.

Stale winners (autogen.catalog.environment: measured with another driver, runtime, NVRTC or autogen, or
whose template changed since) are validated here, once per process, before they are served.

The hot path (make_call: autogen.sgemv and the other per-family calls): the family's bind checks
the operands (dtype, shape, device, layout), one dictionary keyed by (device, problem, pdl) gives
the kernel, whose launch walks plain tuples. A call repeated with the same operands skips the bind
and launches argument blocks packed once, behind guards (autogen.runtime.bound_calls), served in C where
autogen/_hitpath.c is built. Building a kernel (compile, maybe validate) never
happens inside CUDA graph capture: that raises CaptureError asking for a warm-up call.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field

import numpy as np
from tuning_db import DatabaseError, TuningDB, one_per_problem
from tuning_db.records import DeviceIdentity, ValidationRecord, WinnerRecord
from tuning_db.engine import display_url

from autogen.catalog.environment import stale_reasons
from autogen.catalog.pretuned import pretuned_db
from autogen.catalog.stored import unusable_reason
from autogen.core.operands import call_stream
from autogen.core.problem import Config, nearest, parse_shape_key, Problem, problem_of_record
from autogen.core.registry import check_family_renders, get_family
from autogen.core.render import PDL_SUFFIX, render, source_hash
from autogen.errors import ArgumentError, CaptureError, InvalidConfigError, NotTunedError, UsageError
from autogen.gpu.compile import compile_cubin, compile_options
from autogen.gpu.device import device_identity, require_cupy
from autogen.gpu.launch import ensure_context, launch_ex
from autogen.gpu.measure import validate
from autogen.notes import note_once
from autogen.runtime.bound_calls import cuda_launch_kernel_address, MISSED, remember_call, Remembered
from autogen.runtime.streams import capturing, resolve_stream

try:  # the hit path in C (autogen/_hitpath.c), built by `pip install`; absent in a bare checkout
    from autogen.runtime._hitpath import HitPath
except ImportError:
    HitPath = None


@dataclass
class TunedKernel:
    """A compiled, validated kernel for one problem on one GPU; call it like the family's API."""

    problem: Problem
    name: str
    params: dict
    served_by: str
    provenance: dict
    _steps: list = field(repr=False, default_factory=list)  # (cupy Function, Step)
    _module: object = field(repr=False, default=None)  # keeps the loaded module alive
    stale: tuple = ()  # why the stored winner is stale here (autogen.catalog.environment); () when fresh
    pdl: bool = False  # launched with programmatic stream serialization (autogen.gpu.launch)

    def __call__(self, *args, stream=None, **kwargs):
        cupy = _cupy()
        family = get_family(self.problem.family)
        resolved = resolve_stream(cupy, stream, args)
        with call_stream(resolved):
            problem, inputs, result = family.bind(cupy, cupy.cuda.runtime.getDevice(), args, kwargs)
        if problem != self.problem:
            raise ArgumentError(f"{self.name} serves {self.problem}, called with {problem}")
        self.launch(inputs, resolved)
        return result

    def __post_init__(self):
        # Flattened once: a dispatched call walks plain tuples, not attribute chains. Non-PDL
        # steps launch through CuPy's own call: a struct-packed cuLaunchKernel from Python was
        # measured no faster (docs/history/sessions.md, 2026-11-22).
        launches = []
        for function, step in self._steps:
            if self.pdl:
                function = _PdlFunction(function)
            launches.append((function, step.launch.grid, step.launch.block, step.args, step.launch.shared_bytes))
        self._launches = tuple(launches)
        if len(self._launches) == 1:
            function, grid, block, args, shared_bytes = self._launches[0]

            def launch(inputs: dict, stream=None) -> None:
                function(grid, block, args(inputs), shared_bytes, stream)

            self.launch = launch  # one step: no loop, no tuple unpacking per call

    def launch(self, inputs: dict, stream=None) -> None:
        for function, grid, block, args, shared_bytes in self._launches:
            function(grid, block, args(inputs), shared_bytes, stream)


class _PdlFunction:
    """A CuPy Function launched through cuLaunchKernelEx with programmatic stream serialization."""

    def __init__(self, function):
        self.function = function

    def __call__(self, grid, block, args, shared_bytes=0, stream=None):
        cupy = _cupy()
        pointer = stream.ptr if stream is not None else cupy.cuda.get_current_stream().ptr
        launch_ex(self.function.ptr, grid, block, args, shared_bytes, pointer, pdl=True)


class Dispatcher:
    """Process-wide cache of served kernels, keyed by (device, family, dtype, shape)."""

    def __init__(self, db_url: str | None = None):
        self.db_url = db_url
        self._kernels: dict[tuple, TunedKernel] = {}
        self._lock = threading.Lock()
        self._dbs: list[TuningDB] | None = None
        self._validation_store: TuningDB | None = None  # opened for the first verdict to store
        self._verdicts: dict[tuple, bool] = {}  # validations of this process, stored or not

    def databases(self) -> list[TuningDB]:
        if self._dbs is None:
            shipped = pretuned_db()
            # Read-only: looking kernels up never creates, migrates or switches the user's database.
            self._dbs = [TuningDB(self.db_url, readonly=True)] + ([shipped] if shipped is not None else [])
        return self._dbs

    def lookup(self, problem: Problem, strict: bool = False, device: int | None = None,
               pdl: bool = False, stream=None) -> TunedKernel:
        """The kernel served for `problem` on `device` (default: the current one). Building it
        (compile, maybe validate) refuses to run inside CUDA graph capture on `stream` (default:
        CuPy's current stream): CaptureError, asking for a warm-up call outside the graph."""
        device = _cupy().cuda.runtime.getDevice() if device is None else device
        key = (device, problem, pdl) if not strict else (device, problem, pdl, strict)
        kernel = self._kernels.get(key)
        if kernel is None:
            with self._lock:  # one thread builds, the others wait and then hit the cache
                kernel = self._kernels.get(key)
                if kernel is None:
                    _refuse_inside_capture(problem, stream)
                    kernel = self._build(problem, strict, pdl) if pdl else self._build(problem, strict)
                    self._kernels[key] = kernel
        return kernel

    # --- the chain ------------------------------------------------------------------------
    def _build(self, problem: Problem, strict: bool, pdl: bool = False) -> TunedKernel:
        family = get_family(problem.family)
        check_family_renders(family)
        device = device_identity()
        if pdl and not getattr(family, "pdl_capable", False):
            raise UsageError(f"{family.name} has no programmatic-dependent-launch variant (pdl=True)")
        # Before sm_90 there is no griddepcontrol: the plain kernel and launch serve a pdl=True call.
        pdl = pdl and int(device.compute_capability.split(".")[0]) >= 9
        for served_by, winner in self._candidates(family, problem, device, strict):
            config = _served_config(family, problem, served_by, winner)
            kernel = self._compile(family, problem, config, served_by, winner, device, *((True,) if pdl else ()))
            if winner is not None and config == family.space.check(winner.trial.params):
                # (a neighbour's winner adapted to this shape is another kernel: validated below)
                kernel.stale = stale_reasons(winner, kernel.provenance.get("plain_source_hash"), device)
            if kernel.stale:
                # Measured elsewhere (another driver, runtime, NVRTC or autogen) or from another
                # source: checked here before it is served, whatever was stored about it.
                if self._validated(family, problem, config, kernel, device, True):
                    note_once(("stale", device.name, problem, kernel.name),
                              f"the stored {problem} winner {kernel.name} is stale ({'; '.join(kernel.stale)}): "
                              f"validated here before serving it; `autogen tune {problem.family} ... --refresh` "
                              "re-times it in this environment")
                    return kernel
                continue
            if (served_by == "exact" and not pdl) or self._validated(family, problem, config, kernel, device):
                return kernel
        raise NotTunedError(f"no validated kernel for {problem} on {device.name}")

    def _candidates(self, family, problem: Problem, device: DeviceIdentity, strict: bool):
        """(served_by, winner or None) in the order of the chain."""
        winners = [w for db in self.databases()
                   for w in db.winners(family=problem.family, dtype=problem.dtype,
                                       compute_capability=device.compute_capability)]
        # Malformed rows are left out by winners(); rows this family cannot serve are skipped
        # here, so the chain falls back to the next candidate. The cold-cache winner of a shape
        # goes first where a hot one is stored too.
        winners = one_per_problem([w for w in winners if _servable(family, w)])
        same_gpu = [w for w in winners if w.device.name == device.name]
        exact = [w for w in same_gpu if w.trial.shape_key == problem.shape_key]
        if exact:
            yield "exact", exact[0]
        if strict:
            raise NotTunedError(f"{problem} is not tuned on {device.name} (strict=True)")
        for winner in _by_distance(family, problem, [w for w in same_gpu if w not in exact]):
            yield "nearest", winner
        for winner in _by_distance(family, problem, [w for w in winners if w.device.name != device.name]):
            yield "arch", winner
        yield "default", None

    def _compile(self, family, problem, config: Config, served_by, winner: WinnerRecord | None,
                 device: DeviceIdentity, pdl: bool = False) -> TunedKernel:

        cupy = _cupy()
        plain = render(family, problem.dtype, config, traits=problem.traits)
        source = render(family, problem.dtype, config, traits=problem.traits, pdl=True) if pdl else plain
        name = family.kernel_name(problem.dtype, config, problem.traits) + (PDL_SUFFIX if pdl else "")
        module = cupy.cuda.function.Module()
        module.load(compile_cubin(source, device.arch, family_options=family.compiler_options))
        steps = [(module.get_function(name + step.suffix), step) for step in family.plan(problem, config)]
        options = family.compiler_options
        provenance = {"gpu": device.name, "arch": device.arch, "source_hash": source_hash(source, options),
                      "plain_source_hash": source_hash(plain, options),
                      "compile_options": " ".join(compile_options(device.arch, options))}
        if winner is not None:
            provenance.update(tuned_on=winner.device.name, tuned_shape=winner.trial.shape_key,
                              tuned_time_us=winner.trial.time_us, peer=winner.peer_name,
                              peer_time_us=winner.peer_time_us, driver_version=winner.device.driver_version,
                              runtime_version=winner.device.runtime_version,
                              nvrtc_version=winner.device.nvrtc_version, tuned_source_hash=winner.trial.source_hash,
                              autogen_version=winner.autogen_version, updated_at=winner.updated_at)
        return TunedKernel(problem, name, config.as_dict(), served_by, provenance, steps, module, pdl=pdl)

    def _check(self, family, problem: Problem, kernel: TunedKernel):
        import secrets

        cupy = _cupy()
        check = validate(family, problem, lambda inputs: kernel.launch(inputs), cupy,
                         cupy.random.default_rng(secrets.randbits(63)), np.random.default_rng(secrets.randbits(63)))
        cupy.cuda.get_current_stream().synchronize()
        return check

    def _validated(self, family, problem: Problem, config: Config, kernel: TunedKernel,
                   device: DeviceIdentity, here: bool = False) -> bool:
        """Check a kernel on a shape it was not tuned for, once; the verdict is stored (kept in
        memory where the database cannot take it). `here`: a stale winner, validated in this
        process and environment whatever the database says; the verdict is kept for the process."""
        digest = kernel.provenance["source_hash"]
        if here:
            remembered = ("here", device.name, device.compute_capability, problem, digest)
            if remembered not in self._verdicts:
                self._verdicts[remembered] = self._check(family, problem, kernel).ok
            return self._verdicts[remembered]
        user_db = self.databases()[0]
        remembered = (device.name, device.compute_capability, problem, digest)
        if remembered in self._verdicts:
            return self._verdicts[remembered]
        known = user_db.validation(device, problem.family, problem.dtype, problem.shape_key, digest)
        if known is not None:
            return known.passed
        check = self._check(family, problem, kernel)
        self._verdicts[remembered] = check.ok
        self._store_validation(device, ValidationRecord(
            family=problem.family, dtype=problem.dtype, shape_key=problem.shape_key,
            kernel_name=kernel.name, source_hash=digest, passed=check.ok,
            error=check.error if check.ok else None, reason=check.reason))
        return check.ok

    def _store_validation(self, device: DeviceIdentity, record: ValidationRecord) -> None:
        """Store a verdict in the user's database: created if missing, never migrated (an older
        schema asks for `autogen db upgrade`). Where that fails, says so once on stderr."""
        try:
            if self._validation_store is None:
                self._validation_store = TuningDB(self.db_url, upgrade=False, create=True)
            self._validation_store.record_validation(device, record)
        except DatabaseError as exc:
            note_once(("validations", self.db_url),
                      f"cannot store kernel validations in {display_url(self.databases()[0].url)} ({exc}); "
                      "they are kept in memory for this process")


def _served_config(family, problem: Problem, served_by: str, winner: WinnerRecord | None) -> Config:
    """The config a step of the chain serves: the exact winner's own; another shape's winner as
    the family adapts it to this shape (Family.seed_from, as the warm start does: hgemv gives it
    this batch's tile, and on rows off the 16-byte boundary a form that keeps wide loads), where
    the adapted point is in the space, else as it was stored; the default config."""
    if winner is None:
        return family.default_config(problem)
    stored = winner.trial.params
    if served_by == "exact":
        return family.space.check(stored)
    adapted = family.seed_from(problem, family.space.complete(stored))
    return family.space.check(stored if family.space.violations(adapted) else adapted)


def _servable(family, winner: WinnerRecord) -> bool:
    """Whether this family can serve the stored winner: its shape key names the family's
    dimensions, its params are in the family's space and name the kernel it is stored under (its
    stored time is that kernel's). Otherwise it is skipped, noted once."""
    try:
        dims = parse_shape_key(winner.trial.shape_key)
        names = family.dims + tuple(t.name for t in family.traits)
        if tuple(name for name, _ in dims) != names:
            raise InvalidConfigError(f"shape {winner.trial.shape_key!r} does not name {', '.join(names)}")
        problem = family.problem(winner.trial.dtype, **dict(dims))
        reason = unusable_reason(family, problem.dtype, problem.traits, winner.trial)
        if reason:
            raise InvalidConfigError(reason)
    except (ValueError, UsageError, InvalidConfigError) as exc:
        note_once(("unservable", winner.device.name, winner.trial.family, winner.trial.dtype, winner.trial.shape_key,
                   winner.trial.cache_mode),
                  f"skipped the stored {winner.trial.family} {winner.trial.dtype} winner for "
                  f"{winner.trial.shape_key!r} on {winner.device.name!r}: {exc}")
        return False
    return True


def _by_distance(family, problem: Problem, winners: list[WinnerRecord]) -> list[WinnerRecord]:
    """Nearest first (problem.nearest: the ordering export and the warm start share); a tie goes
    to the smaller shape key, then the GPU name."""
    return nearest(problem, winners,
                   lambda w: problem_of_record(w.trial.family, w.trial.dtype, w.trial.shape_key),
                   tie=lambda w: (w.device.name,))


_CUPY = None


def _cupy():
    # Checked once per process: the hot path must not ask the driver for its device count.
    global _CUPY
    if _CUPY is None:
        _CUPY = require_cupy()
    return _CUPY


_default_dispatcher: Dispatcher | None = None
_default_lock = threading.Lock()


def default_dispatcher() -> Dispatcher:
    global _default_dispatcher
    if _default_dispatcher is None:
        with _default_lock:
            if _default_dispatcher is None:
                _default_dispatcher = Dispatcher()
    return _default_dispatcher


def lookup(family: str, dtype: str | None = None, strict: bool = False, pdl: bool = False, **dims: int) -> TunedKernel:
    """The kernel autogen serves for `family` at this shape on the current GPU (`pdl=True`: its
    programmatic-dependent-launch variant, see autogen.gpu.launch)."""
    return default_dispatcher().lookup(get_family(family).problem(dtype, **dims), strict, pdl=pdl)


def call(family_name: str, args: tuple, kwargs: dict, stream=None, pdl: bool = False):
    """Bind the arguments, find (or reuse) the kernel for their shape, launch it."""
    return make_call(family_name)(*args, stream=stream, pdl=pdl, **kwargs)


_calls: dict[str, object] = {}


def make_call(family_name: str):
    """The function behind autogen.<api> for one family (cached): bind, one dictionary hit,
    launch. Every check of the family's bind runs on a call with new operands; a family with
    reuse_bound_calls serves a repeat of a call (the same CuPy arrays and arguments, device and
    stream) from an earlier binding, behind guards (autogen.runtime.bound_calls), in C where the hit path is
    built (autogen/_hitpath.c: the returned object is then a HitPath whose misses come here)."""
    found = _calls.get(family_name)
    if found is not None and found.family is get_family(family_name):
        return found
    family = get_family(family_name)
    bind = family.bind
    reuse = bool(getattr(family, "reuse_bound_calls", False))
    module = sys.modules[__name__]
    # Set by the first call: naming autogen.sgemv needs no GPU.
    cupy = get_device = ndarray = current_stream = launch_kernel = None
    use_bound = False  # reuse_bound_calls, where this CuPy has the driver binding it needs
    # The remembered calls and the dispatcher whose kernels they launch; a HitPath serves them.
    memo = HitPath() if reuse and HitPath is not None else Remembered()

    def call_family(*args, stream=None, pdl=False, **kwargs):
        nonlocal cupy, get_device, ndarray, current_stream, launch_kernel, use_bound
        if cupy is None:
            cupy = _cupy()
            get_device, ndarray = cupy.cuda.runtime.getDevice, cupy.ndarray
            current_stream = cupy.cuda.get_current_stream
            launch_kernel = getattr(getattr(cupy.cuda, "driver", None), "launchKernel", None)
            use_bound = reuse and launch_kernel is not None
            if use_bound and type(memo) is not Remembered:
                _serve_in_c(memo, get_device, current_stream)
        device = get_device()
        key = None
        if stream is None and (not args or type(args[0]) is ndarray):
            if use_bound and not pdl:
                stream_ptr = current_stream().ptr
                # The key of autogen.runtime.bound_calls: device, stream, keyword names, every argument's id.
                key = (device, stream_ptr, *kwargs, *map(id, args), *map(id, kwargs.values()))
                known = memo.calls.get(key)
                if known is not None and module._default_dispatcher is memo.dispatcher:
                    served = known.serve(stream_ptr)
                    if served is not MISSED:
                        return served
            resolved = None  # CuPy operands on CuPy's current stream: the common case
            problem, inputs, result = bind(cupy, device, args, kwargs)
        else:
            resolved = resolve_stream(cupy, stream, args)
            with call_stream(resolved):  # families that keep per-stream workspace see it
                problem, inputs, result = bind(cupy, device, args, kwargs)
        dispatcher = module._default_dispatcher or default_dispatcher()
        kernel = dispatcher._kernels.get((device, problem, pdl))
        if kernel is None:
            kernel = dispatcher.lookup(problem, False, device, pdl, resolved)
        kernel.launch(inputs, resolved)
        if key is not None:
            if dispatcher is not memo.dispatcher:  # another dispatcher serves: its kernels, bound anew
                memo.calls.clear()
                memo.sightings.clear()
                memo.dispatcher = dispatcher
            remember_call(key, args + tuple(kwargs.values()), result, kernel, inputs, memo.calls, memo.sightings,
                          ndarray, launch_kernel, _make_context_current)
        return result

    if type(memo) is Remembered:
        call_family.family = family
        _calls[family_name] = call_family
        return call_family
    memo.fallback, memo.family = call_family, family
    _calls[family_name] = memo
    return memo


def _serve_in_c(hit_path, get_device, current_stream) -> None:
    """Let `hit_path` serve remembered calls, where the driver's cuLaunchKernel can be found."""
    address = cuda_launch_kernel_address()
    if address:
        hit_path.configure(get_device, current_stream, address, globals())


def _make_context_current() -> None:
    ensure_context(_cupy())


def _refuse_inside_capture(problem: Problem, stream) -> None:
    """CaptureError where `stream` (None: CuPy's current stream) is capturing a CUDA graph."""
    cupy = _CUPY or sys.modules.get("cupy")
    if cupy is not None and capturing(cupy, stream):
        raise CaptureError(
            f"the first call for {problem} on this GPU compiles (and may validate) its kernel, which "
            "cannot run inside CUDA graph capture: warm up: call it once with the same shapes outside "
            "the graph, then capture")


__all__ = ["Dispatcher", "TunedKernel", "call", "default_dispatcher", "lookup", "make_call"]
