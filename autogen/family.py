"""What every kernel family provides, and the registry that finds families.

A family, built in or a user's own, is one Python module holding a Family subclass decorated with
@register, plus one Jinja2 template beside that module (built-in families keep theirs in the
top-level templates/ folder), plus optionally one self-test template for `autogen export`. Core
modules never name a family: they go through this registry.

    import autogen

    @autogen.register
    class Axpy(autogen.Family):
        name = "axpy"                    # stored as "<top-level package>.axpy" for user families
        template = "axpy.cu.j2"          # looked up beside this module, then in autogen's templates
        ...

Installed packages make their families visible to the CLI through the entry-point group
`autogen.families` (the value names the module that registers them).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import re
import sys
import threading
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from .dtypes import DTYPES
from .errors import AutogenError, ArgumentError, CaptureError, FamilyError, InvalidConfigError, UsageError
from .problem import Config, Problem, shape_distance
from .space import Space

# Each dimension must fit the kernels' 32-bit int arguments.
MAX_DIM = 2**31 - 1
ENTRY_POINT_GROUP = "autogen.families"
BUILTIN_PACKAGE = "autogen.families"


@dataclass(frozen=True)
class Launch:
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int = 0  # dynamic shared memory; static shared memory is in the source


@dataclass(frozen=True)
class Step:
    """One kernel launch of a variant. Most variants are one step; a two-kernel reduction is two.
    `symbol` is the extern "C" name: the variant's kernel name plus `suffix`."""

    suffix: str
    launch: Launch
    args: Callable[[dict], tuple]  # kernel arguments, from the inputs dict


@dataclass(frozen=True)
class Peer:
    """The library routine a family is compared with, run on the current stream."""

    name: str
    run: Callable[[dict], Any]  # takes the same inputs dict as the kernel


@dataclass(frozen=True)
class Trait:
    """A categorical attribute of a problem that changes the best kernel but is not a size:
    the data distribution of a histogram, GELU's approximation. Part of the database key; the
    CLI takes it as --<name>; `parse` turns the user's text (e.g. "0.5") into a choice."""

    name: str
    choices: tuple[str, ...]
    help: str = ""
    parse: Callable[[str], str] | None = None
    # True when the trait changes the function the kernel computes (GELU's approximation): its
    # value is then part of the kernel's name and a variable of its template. False when it
    # only describes the data the kernel is tuned for (a histogram's value distribution).
    code: bool = False

    def value(self, given: object) -> str:
        text = str(given)
        value = self.parse(text) if self.parse is not None else text
        if value not in self.choices:
            raise UsageError(f"{self.name} must be one of {', '.join(self.choices)}, not {given!r}")
        return value


class Family:
    """Base class. Subclasses set the class attributes and implement the methods that raise."""

    name: str  # "sgemv"; a user family's is namespaced by @register: "mykernels.axpy"
    template: str  # the kernel template's file name, beside the module or in templates/
    selftest_template: str | None = None  # `autogen export --self-test` hook (see export/selftest.cu.j2)
    selftest_includes: tuple[str, ...] = ()  # headers the hook's code needs, e.g. CUB's (included once)
    dims: tuple[str, ...]  # integer dimensions in order, e.g. ("m", "n")
    dim_defaults: Mapping[str, int] = {}  # dimensions a caller may leave out, e.g. {"batch": 1}
    traits: tuple[Trait, ...] = ()  # categorical problem attributes, after the dims in the key
    dtypes: tuple[str, ...]  # supported dtype names (autogen.dtypes.DTYPES), the first the default
    space: Space
    default_params: Mapping[str, int | str]  # served when nothing is tuned; must be valid
    outputs: tuple[str, ...]  # the inputs-dict entries the kernel writes, each validated
    # C parameter list shared by every variant's host launcher and the exported entry point
    # (templates rendered with host_launcher=True define `<kernel_name>_launch(c_params, stream)`).
    c_params: str
    c_headers: tuple[str, ...] = ("cuda_runtime.h",)
    # Relative L2 error allowed against the float64 reference: the arithmetic's share; a half
    # output may exceed it by its type's own rounding of the reference (representable_error).
    tolerance: float = 1e-5
    description: str = ""
    # What bounds the family: "memory" (bytes over the measured copy bandwidth) or "compute"
    # (flops over the measured FP32 FMA peak); reports state the share of that floor.
    roofline: str = "memory"
    api: str | None = None  # the Python call: autogen.<api>(...), bound by `bind`
    # Exported entry points are autogen_<name> for the first dtype and autogen_<name>_<tag> for
    # the others; True names the dtype on every one (autogen_hgemv_f16, autogen_hgemv_bf16).
    export_names_dtype: bool = False
    # True when the template honours the variable `pdl` ("on": the kernel waits for the previous
    # kernel with griddepcontrol.wait after the loads that do not depend on it; see render()).
    pdl_capable: bool = False
    # Problems moving at most this many bytes (and at most measure.HOST_CHECK_FLOPS) are
    # validated on the host: inputs made and the float64 reference computed with NumPy, uploaded
    # for the launch, the outputs read back (autogen.measure.checks_on_host). 0: always on the GPU,
    # for a family whose cases read views into larger buffers (an upload would align them) or
    # whose reference is slow in NumPy. The default's measure (H100 host, one variant): the host
    # takes 12 ms at 1 MiB (sgemv 16384x16), 24 ms at 2 MiB, 95 ms at 8 MiB (softmax 1024x1024);
    # the GPU 1.4-2.7 ms once CuPy's kernels are compiled (0.1-4.7 s for the first check).
    host_check_bytes: int = 2 << 20
    # True when `bind` only checks and arranges the call's operands (no GPU work, no scratch memory
    # made per call, nothing that depends on the data): the dispatcher may then serve a repeat of
    # a call (the same CuPy arrays with the same shapes, the same other arguments, device and
    # stream) from an earlier binding, behind guards, without running bind again (autogen.bound).
    reuse_bound_calls: bool = False
    # The Python call as PyTorch sees it (autogen.torch.signature.OpSignature: operands in call
    # order, outputs with their shapes): the family's torch.ops.autogen.<op>. None: no torch op.
    op_signature = None

    # --- identity -------------------------------------------------------------------------
    @property
    def symbol(self) -> str:
        """The name as a C identifier: kernel names and exported symbols start with it."""
        return self.name.replace(".", "_")

    @property
    def module(self) -> str:
        """The module that registers this family: the GPU worker imports it to find it."""
        return type(self).__module__

    def template_dirs(self) -> list[Path]:
        """Where this family's templates are looked up: beside its module, then autogen's."""
        from .paths import templates_dir
        here = Path(sys.modules[self.module].__file__).resolve().parent
        return [here, templates_dir()] if here != templates_dir() else [here]

    # --- problems -------------------------------------------------------------------------
    def problem(self, dtype: str | None = None, **dims: int | str) -> Problem:
        """A validated Problem; bad dimensions, traits or dtype raise UsageError naming them."""
        dtype = dtype or self.dtypes[0]
        if dtype not in self.dtypes:
            raise UsageError(f"{self.name} supports dtype {', '.join(self.dtypes)}, not {dtype!r}")
        names = self.dims + tuple(t.name for t in self.traits)
        dims = {**self.dim_defaults, **dims}
        missing = [d for d in self.dims if d not in dims]
        extra = [d for d in dims if d not in names]
        if missing or extra:
            raise UsageError(
                f"{self.name} needs dimensions {', '.join(self.dims)}"
                + (f"; missing {', '.join(missing)}" if missing else "")
                + (f"; unknown {', '.join(extra)}" if extra else "")
            )
        values = []
        for d in self.dims:
            value = dims[d]
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise UsageError(f"{self.name}: {d} must be an integer, got {value!r}")
            if not 1 <= value <= MAX_DIM:
                raise UsageError(f"{self.name}: {d} must be between 1 and {MAX_DIM}, got {value}")
            values.append((d, int(value)))
        for trait in self.traits:
            values.append((trait.name, trait.value(dims.get(trait.name, trait.choices[0]))))
        problem = Problem(self.name, dtype, tuple(values))
        self.check_problem(problem)
        return problem

    def check_problem(self, problem: Problem) -> None:
        """Raise UsageError for a shape the family cannot compute (e.g. a bias size that does
        not divide n). Default: every shape is fine."""

    def tolerance_for(self, problem: Problem) -> float:
        """The relative error a variant may show on this problem (families with several dtypes
        may differ per dtype), before what half outputs' types add (representable_error)."""
        return self.tolerance

    def default_config(self, problem: Problem | None = None) -> Config:
        """The config served where nothing is tuned; a family may pick it per problem (e.g. a
        batch tile that covers the batch)."""
        return self.space.check(self.default_params)

    def seed_configs(self, problem: Problem) -> list[Config]:
        """Configs every search of `problem` measures first, best first, after the nearest tuned
        shapes' winners: the default config, or a family's several strongest known ones for the
        shape (sgemm's tile shapes with split-K fitted to it)."""
        return [self.default_config(problem)]

    def seed_from(self, problem: Problem, params: dict) -> dict:
        """Another shape's winner `params` as a point to try first on `problem` (the warm start).
        Unchanged by default; a family changes what only fits the other shape (hgemv: the batch
        tile that covers this batch). The result is checked against the space by the caller."""
        return params

    def distance(self, a: Problem, b: Problem) -> float:
        """How far apart two shapes are, for the nearest-tuned-shape fallback."""
        return shape_distance(a, b)

    # --- code -----------------------------------------------------------------------------
    def kernel_name(self, dtype: str, config: Config, traits: tuple[tuple[str, str], ...] = ()) -> str:
        """Procedural name, e.g. sgemv_f32_tpr4_vw4_wpb4_rpg1_u2_xldg_rshfl: the extern "C"
        symbol, part of the database key and the exported symbol. `traits` are the problem's;
        those that change the code (Trait.code) are named too: gelu_f16_tanh_... A parameter added
        later is named only away from its old behaviour (Param.added_with_default)."""
        parts = [self.symbol, DTYPES[dtype].tag] + [value for _name, value in self.code_traits(traits)]
        params = [(self.space.param(k), v) for k, v in config.params]
        parts += [f"{p.abbrev}{v}" for p, v in params if p.named_in_kernel(v)]
        return "_".join(parts)

    def code_traits(self, traits: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        """The trait values that change the kernel's code, checked against the choices."""
        coded = {t.name: t for t in self.traits if t.code}
        found = tuple((name, value) for name, value in traits if name in coded)
        for name, value in found:
            if value not in coded[name].choices:
                raise UsageError(f"{self.name}: {name} must be one of {', '.join(coded[name].choices)}")
        missing = [name for name in coded if name not in dict(found)]
        if missing:
            raise UsageError(f"{self.name}: the kernel needs the trait(s) {', '.join(missing)}")
        return found

    def c_params_for(self, dtype: str) -> str:
        """The C parameter list of this dtype's variants (default: the same for every dtype)."""
        return self.c_params

    def template_vars(self, dtype: str, config: Config, host_launcher: bool = False,
                      traits: tuple[tuple[str, str], ...] = ()) -> dict:
        d = DTYPES[dtype]
        return {"kernel_name": self.kernel_name(dtype, config, traits), "dtype": dtype,
                "elem_t": d.c_type, "dtype_bytes": d.itemsize, **dict(self.code_traits(traits)),
                "host_launcher": host_launcher, "c_params": self.c_params_for(dtype), **config.as_dict()}

    def launch(self, problem: Problem, config: Config) -> Launch:
        raise NotImplementedError

    def plan(self, problem: Problem, config: Config) -> list[Step]:
        """The launches of one call, in order. Default: the one kernel of `launch`."""
        return [Step("", self.launch(problem, config), lambda inputs: self.kernel_args(problem, inputs))]

    def reject_reason(self, problem: Problem, config: Config) -> str | None:
        """Why a valid config is not worth timing on this shape (search pruning), or None."""
        return None

    # --- data -----------------------------------------------------------------------------
    def validation_cases(self, problem: Problem) -> list[dict]:
        """Scalar settings each variant is checked under; each runs on fresh random inputs."""
        return [{}]

    def timing_case(self, problem: Problem) -> dict:
        return self.validation_cases(problem)[0]

    def make_inputs(self, problem: Problem, xp, rng, case: dict) -> dict:
        """Arrays (numpy or cupy, per xp) and scalars for one launch; every output poisoned
        (NaN, or a sentinel for integers) wherever the kernel must overwrite it."""
        raise NotImplementedError

    def kernel_args(self, problem: Problem, inputs: dict) -> tuple:
        raise NotImplementedError

    def reference(self, problem: Problem, inputs: dict, xp=np):
        """The expected output in float64, computed with xp (numpy, or cupy on the GPU): an
        array for a family with one output, else a dict keyed by output name."""
        raise NotImplementedError

    def reference_magnitude(self, problem: Problem, inputs: dict, xp=np):
        """The denominator of the relative error, or None for the reference itself. Families
        whose outputs are sums of signed terms return the same sums of |terms|: that is the
        scale floating-point rounding is proportional to, so a near-zero output by cancellation
        (likely on tiny shapes) does not fail a correct kernel."""
        return None

    def compare(self, problem: Problem, inputs: dict, expected, magnitude, xp=np) -> tuple[float, str]:
        """(error, why it fails or ""): the worst relative L2 error over the outputs. Families
        whose results are exact (integers, selected values) override this with an exact check."""
        from .measure import relative_error
        worst = 0.0
        for name in self.outputs:
            ref, scale = _of_output(expected, name), _of_output(magnitude, name)
            error, reason = relative_error(xp, self.output_values(problem, inputs, name, xp), ref, scale)
            if reason:
                return error, (f"{name}: {reason}" if len(self.outputs) > 1 else reason)
            worst = max(worst, error)
        return worst, ""

    def representable_error(self, problem: Problem, inputs: dict, expected, magnitude, xp=np) -> float:
        """What the outputs' types alone cost: the largest relative error (as compare measures
        it) of the float64 reference rounded to an output's type, for outputs stored in float16
        or bfloat16 (subnormals included); 0 for every other type, so fp32 and exact outputs are
        judged by the tolerance alone. Validation allows tolerance_for(problem) plus this
        (autogen.measure.judge): a softmax row of 128256 columns holds probabilities near
        1/128256, fp16 subnormals, whose correct rounding alone exceeds the fp16 tolerance. With
        several outputs the largest applies to compare's worst error (every built-in family
        with a half output has that one output)."""
        from .measure import rounding_error
        worst = 0.0
        for name in self.outputs:
            dtype = self.output_dtype(problem, inputs, name, xp)
            if dtype in DTYPES and DTYPES[dtype].is_half:
                scale = _of_output(magnitude, name)
                worst = max(worst, rounding_error(xp, _of_output(expected, name), dtype, scale))
        return worst

    def output_dtype(self, problem: Problem, inputs: dict, name: str, xp=np) -> str:
        """The dtype an output is stored in: bfloat16 for the problem's bfloat16 bit patterns,
        else its array's dtype (reduce's float32 sum of fp16 values is float32)."""
        array = inputs[name]
        if problem.dtype == "bfloat16" and array.dtype == xp.uint16:
            return "bfloat16"
        return np.dtype(array.dtype).name

    def output_values(self, problem: Problem, inputs: dict, name: str, xp=np):
        """An output as float64-comparable values (bfloat16 bit patterns decoded)."""
        from .dtypes import to_float64
        array = inputs[name]
        return to_float64(xp, array, "bfloat16") if self.output_dtype(problem, inputs, name, xp) == "bfloat16" \
            else array

    def bytes_moved(self, problem: Problem, case: dict | None = None) -> int:
        """The fewest bytes one launch must move through device memory."""
        raise NotImplementedError

    def flops(self, problem: Problem) -> int:
        return 0

    def peer(self, problem: Problem) -> Peer | None:
        return None

    # --- calls from Python (the dispatcher) -------------------------------------------------
    def bind(self, cupy, device: int, args: tuple, kwargs: dict) -> tuple[Problem, dict, Any]:
        """Check a call's operands (on the current `device`) and turn them into
        (problem, inputs dict, value to return). It runs on every dispatched call: keep it to
        cheap checks (device_array), cached problems (problem_cached) and no synchronisation.
        Inside CUDA graph capture it must not allocate from CuPy's pool (new_output refuses;
        take outputs and workspace from the caller or from a per-stream cache)."""
        raise NotImplementedError(f"{self.name} has no Python call API")

    def example_call(self, problem: Problem, cupy) -> tuple[tuple, dict] | None:
        """(args, kwargs) of a call of autogen.<api> at `problem`'s shape, made of CuPy arrays,
        with every output passed in (out=, y=...) so that the call is safe inside CuPy's stream
        capture. Used by scripts/bench_dispatch.py and tests/test_gpu_capture.py; None: no
        example (the family is skipped there)."""
        return None

    @functools.lru_cache(maxsize=4096)
    def problem_cached(self, dtype: str, dims: tuple[tuple[str, int | str], ...]) -> Problem:
        """self.problem(dtype, **dict(dims)), validated once per shape: binds call it per call."""
        return self.problem(dtype, **dict(dims))


def _of_output(value, name: str):
    """A reference or magnitude for one output: families with several outputs give dicts."""
    return value[name] if isinstance(value, dict) else value


# --- the registry ---------------------------------------------------------------------------

_REGISTRY: dict[str, Family] = {}
_builtins_loaded = False
_entry_points_loaded = False


def register(family):
    """Class decorator (or call on an instance): make a family known to the CLI, the tuner, the
    dispatcher and export. A family defined outside autogen gets a namespaced name, its top-level
    package (or module) and its own name: `mykernels.axpy`."""
    instance = family() if isinstance(family, type) else family
    module = type(instance).__module__
    if not isinstance(getattr(instance, "name", None), str):
        raise FamilyError(f"family {module}.{type(instance).__qualname__} does not define its name (a string)")
    if "." not in instance.name and not module.startswith(BUILTIN_PACKAGE + "."):
        instance.name = f"{module.split('.')[0]}.{instance.name}"
    _check_definition(instance)
    known = _REGISTRY.get(instance.name)
    if known is not None and (known.module, type(known).__qualname__) != (module, type(instance).__qualname__):
        raise FamilyError(f"family {instance.name!r} is registered twice ({known.module}.{type(known).__qualname__} "
                          f"and {module}.{type(instance).__qualname__}); rename one")
    if instance.api:
        clash = next((f for f in _REGISTRY.values() if f.api == instance.api and f.name != instance.name), None)
        if clash is not None:
            raise FamilyError(f"{describe_family(instance)}: the call name autogen.{instance.api} is taken by "
                              f"{clash.name}")
    _REGISTRY[instance.name] = instance
    torch_ops = sys.modules.get("autogen.torch.ops")
    if torch_ops is not None and hasattr(torch_ops, "_on_register"):  # its torch op, where torch's are in use
        torch_ops._on_register(instance)
    return family


# Names a dimension or trait cannot take: options of the family commands (a dimension becomes the
# flag --<name>), the parser's own destinations, and the keywords of Family.problem and
# autogen.lookup, which take the dimensions as keyword arguments beside them.
# tests/test_family_hardening.py checks that this covers every option of the parser.
RESERVED_DIM_NAMES = frozenset({
    "help", "trials", "timeout", "sampler", "seed", "cache", "workers", "no_warm_start", "eval_timeout", "refresh",
    "gpus", "lease", "json", "db", "dtype", "shapes", "gpu", "arch", "resources", "version",
    "command", "family", "family_object", "db_command", "strict", "pdl", "stream",
})
# Variables every template gets (Family.template_vars, render): a parameter of that name would
# replace them.
TEMPLATE_VARIABLES = frozenset({"kernel_name", "dtype", "elem_t", "dtype_bytes", "host_launcher", "c_params", "pdl"})
KERNEL_NAME_PART = re.compile(r"[A-Za-z0-9_]+")


def describe_family(family) -> str:
    """How errors name a family: its name and the module that defines it."""
    return f"family {getattr(family, 'name', '?')!r} ({type(family).__module__})"


def _check_definition(family: Family) -> None:
    """A family definition that would break later (at --help, render, storage or export) fails
    at registration, with one line naming the family and its module. Cheap: no template is
    read here (see check_family_renders)."""
    where = describe_family(family)
    for attribute in ("name", "template", "dims", "dtypes", "space", "default_params", "outputs", "c_params"):
        if not hasattr(family, attribute):
            raise FamilyError(f"{where} does not define {attribute}")
    if not all(part.isidentifier() for part in family.name.split(".")):
        raise FamilyError(f"{where}: the name must be identifiers joined by dots")
    if not isinstance(family.space, Space):
        raise FamilyError(f"{where}: space must be an autogen.Space, not {type(family.space).__name__}")
    for attribute in ("dims", "dtypes", "outputs"):
        if isinstance(getattr(family, attribute), str):
            raise FamilyError(f"{where}: {attribute} must be a tuple of names, not the string "
                              f"{getattr(family, attribute)!r} (one name is written (\"n\",))")
    unknown = [d for d in family.dtypes if d not in DTYPES]
    if unknown:
        raise FamilyError(f"{where}: unknown dtype(s) {', '.join(unknown)}; known: {', '.join(DTYPES)}")
    if family.roofline not in ("memory", "compute"):
        raise FamilyError(f"{where}: roofline must be 'memory' or 'compute'")
    problem_names = tuple(family.dims) + tuple(t.name for t in family.traits)
    _check_names(where, "dimension or trait", problem_names, RESERVED_DIM_NAMES)
    for trait in family.traits:
        if not trait.choices:
            raise FamilyError(f"{where}: trait {trait.name!r} has no choices")
    coded = {t.name for t in family.traits if t.code}
    _check_names(where, "parameter", family.space.names, TEMPLATE_VARIABLES | coded)
    for param in family.space.params:
        if not param.choices:
            raise FamilyError(f"{where}: parameter {param.name!r} has no choices")
        odd = [c for c in param.choices if isinstance(c, bool) or not isinstance(c, (int, str))
               or not KERNEL_NAME_PART.fullmatch(f"{param.abbrev}{c}")]
        if odd:
            raise FamilyError(f"{where}: parameter {param.name!r} has choice(s) {odd!r} that do not make a kernel "
                              f"name with its abbreviation {param.abbrev!r} (integers, or letters, digits and _)")
    try:
        family.space.check(family.default_params)  # the default must be a valid point
    except InvalidConfigError as exc:
        raise FamilyError(f"{where}: default_params: {exc}") from None
    _check_templates_exist(family, where)
    if family.op_signature is not None:
        from .torch.signature import check_signature
        check_signature(family)


def _check_names(where: str, kind: str, names: tuple, reserved: frozenset) -> None:
    seen = set()
    for name in names:
        if not isinstance(name, str) or not name.isidentifier():
            raise FamilyError(f"{where}: {kind} name {name!r} is not an identifier")
        if name in reserved:
            raise FamilyError(f"{where}: {kind} name {name!r} is reserved (an option or variable of autogen's "
                              "own); rename it")
        if name in seen:
            raise FamilyError(f"{where}: {kind} name {name!r} is listed twice")
        seen.add(name)


def _check_templates_exist(family: Family, where: str) -> None:
    # Built-in families' templates ship beside them and their contract test renders every
    # point: not looked for here, which would cost every CLI start a few file lookups.
    module = sys.modules.get(family.module)
    if family.module.startswith(BUILTIN_PACKAGE + ".") or getattr(module, "__file__", None) is None:
        return  # (no file: defined interactively; its templates are looked up in autogen's folder alone)
    folders = family.template_dirs()
    for template in (family.template, family.selftest_template):
        if template is not None and not any((folder / template).is_file() for folder in folders):
            raise FamilyError(f"{where}: template {template!r} not found in {', '.join(map(str, folders))}")


_rendered_once: set[tuple[str, str]] = set()  # (family name, module) whose default point rendered


def check_family_renders(family) -> None:
    """Before a user family's first search, show, bench, export or dispatch in this process: its
    default point renders in every dtype, for NVRTC and with the host launcher, under
    StrictUndefined; a missing template, a syntax error, an undefined variable or a failing
    template_vars is then one FamilyError line naming the family and its module, not a
    traceback in the middle of a search. Built-in families are skipped: their contract test
    renders every point, and rendering here would load Jinja2 and the template on paths that
    otherwise render nothing (a tune answered from the database). Not at registration: that
    runs when the CLI starts, for every plug-in."""
    key = (family.name, family.module)
    if key in _rendered_once or family.module.startswith(BUILTIN_PACKAGE + "."):
        return
    from .render import render
    config = family.space.check(family.default_params)
    traits = tuple((trait.name, trait.choices[0]) for trait in family.traits)
    for dtype in family.dtypes:
        for host_launcher in (False, True):
            try:
                render(family, dtype, config, host_launcher, traits)
            except AutogenError:
                raise
            except Exception as exc:
                raise FamilyError(f"{describe_family(family)}: its default point does not render "
                                  f"({type(exc).__name__}: {exc})") from None
    _rendered_once.add(key)


def _load_builtins() -> None:
    global _builtins_loaded
    if not _builtins_loaded:
        _builtins_loaded = True
        import pkgutil
        package = importlib.import_module(BUILTIN_PACKAGE)
        for info in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{BUILTIN_PACKAGE}.{info.name}")


def _load_entry_points() -> None:
    """Import every module an installed package declares under `autogen.families`."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            entry.load()
        except Exception as exc:  # one broken plug-in must not take the CLI down
            print(f"autogen: warning: cannot load family plug-in {entry.name!r} ({entry.value}): "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr)


def all_families(include_plugins: bool = True) -> dict[str, Family]:
    """Every registered family by name: built-ins, plug-ins, and whatever user modules have
    registered so far."""
    _load_builtins()
    if include_plugins:
        _load_entry_points()
    return dict(sorted(_REGISTRY.items()))


def registered_family(name: str) -> Family | None:
    """The family called `name` among those this environment registers (built-ins, plug-ins of
    the entry-point group, modules already imported), else None. For a name read from data (a
    database row, a catalog entry): it never imports a module the name points to, so a shared
    database cannot make its readers run code from their sys.path."""
    _load_builtins()
    if name not in _REGISTRY:
        _load_entry_points()
    return _REGISTRY.get(name)


def get_family(name: str) -> Family:
    """The family called `name`, as the user typed it (command line, autogen.lookup): a dotted
    name not yet registered is imported (`mykernels.axpy` imports the module mykernels.axpy,
    else mykernels) or found among the plug-ins. A name read from data goes through
    registered_family instead."""
    _load_builtins()
    if name in _REGISTRY:
        return _REGISTRY[name]
    if "." in name and all(part.isidentifier() for part in name.split(".")):
        parts = name.split(".")
        for end in range(len(parts), 0, -1):
            module = ".".join(parts[:end])
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as exc:
                if exc.name is not None and not module.startswith(exc.name):
                    raise UsageError(f"cannot import the module of family {name!r}: {exc}") from None
                continue
            except UsageError:
                raise  # a family of that module is refused: the message names it
            except Exception as exc:  # the user's module is broken: one line naming it, not a traceback
                raise FamilyError(f"cannot import the module {module} of family {name!r}: "
                                  f"{type(exc).__name__}: {exc}") from None
            if name in _REGISTRY:
                return _REGISTRY[name]
    _load_entry_points()
    if name in _REGISTRY:
        return _REGISTRY[name]
    raise UsageError(f"unknown family {name!r}; known: {', '.join(sorted(_REGISTRY))} (a user family is "
                     "named <package>.<name> and found by importing the package)")


def family_for_api(api: str) -> Family | None:
    """The family whose Python call is autogen.<api>."""
    for family in all_families(include_plugins=False).values():
        if family.api == api:
            return family
    return None


# --- operand helpers for bind() -------------------------------------------------------------

def device_array(cupy, obj, name: str, dtypes: tuple[str, ...], ndim: int, device: int):
    """A CuPy view of a caller's CUDA array (CuPy, PyTorch, __cuda_array_interface__ or DLPack),
    checked for dtype (names of autogen.dtypes; bfloat16 arrives as its uint16 bit patterns),
    rank, layout and device (the current one); errors name the argument."""
    if type(obj) is cupy.ndarray:
        allowed = _DTYPE_OBJECTS.get(dtypes)
        # The hot path of a dispatched call: every check passes, tested in one expression.
        if (allowed is not None and obj.ndim == ndim and obj.dtype in allowed and obj._c_contiguous
                and obj.data.device_id == device):
            return obj
        array = obj
    elif hasattr(obj, "__cuda_array_interface__"):
        # torch describes bfloat16 as raw 2-byte items ("<V2"): hand over its bit patterns.
        array = cupy.asarray(_bits_if_bfloat16(obj))
    elif hasattr(obj, "__dlpack__") and _on_cuda(obj):
        array = cupy.from_dlpack(_bits_if_bfloat16(obj))
    else:
        raise ArgumentError(f"{name} must be a CUDA array (CuPy, PyTorch, or anything with "
                            f"__cuda_array_interface__ or DLPack), got {type(obj).__name__}")
    if array.ndim != ndim:
        raise ArgumentError(f"{name} must be {ndim}-dimensional, got shape {array.shape}")
    if array.dtype not in _dtype_objects(dtypes):  # dtype.name is slow: compare dtype objects
        raise ArgumentError(f"{name} must have dtype {' or '.join(dtypes)}, got {dtype_name(array)}")
    if not array._c_contiguous:  # CuPy's own flag; .flags builds an object on every call
        raise ArgumentError(f"{name} must be C-contiguous (row-major, no strides)")
    if array.data.device_id != device:
        raise ArgumentError(f"{name} is on GPU {array.data.device_id}, but the current device is GPU {device}")
    return array


def dtype_name(array) -> str:
    """The autogen dtype name of an array as stored (uint16 is bfloat16's bit patterns)."""
    dtype = array.dtype
    name = _NAME_OF_STORAGE.get(dtype)  # not .get(dtype, dtype.name): .name is slow to build
    return name if name is not None else dtype.name


_NAME_OF_STORAGE = {np.dtype(d.storage): d.name for d in reversed(list(DTYPES.values()))
                    if d.storage != "uint16" or d.name == "bfloat16"}


_DTYPE_OBJECTS: dict[tuple[str, ...], tuple] = {}  # dtype names -> their storage dtype objects


def _dtype_objects(dtypes: tuple[str, ...]) -> tuple:
    found = _DTYPE_OBJECTS.get(dtypes)
    if found is None:
        found = _DTYPE_OBJECTS[dtypes] = tuple(np.dtype(DTYPES[d].storage) for d in dtypes)
    return found


def _bits_if_bfloat16(obj):
    # CuPy has no bfloat16: a torch bfloat16 tensor is handed over as its uint16 bit patterns.
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor) and obj.dtype == torch.bfloat16:
        return obj.view(torch.uint16)
    return obj


def _on_cuda(obj) -> bool:
    # DLPack device types: 2 = CUDA, 13 = CUDA managed. A host array (NumPy) is refused.
    try:
        return obj.__dlpack_device__()[0] in (2, 13)
    except Exception:
        return False


def new_output(cupy, like, shape: tuple[int, ...], dtype: str, argument: str = "out"):
    """An output of the caller's kind: a torch tensor when the operand is one (inside
    torch.cuda.graph it comes from the graph's pool), else CuPy (a bfloat16 CuPy output holds bit
    patterns, dtype uint16). Inside CuPy stream capture CuPy's pool cannot allocate for the graph:
    CaptureError asks for `argument` to be passed in."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(like, torch.Tensor):
        return torch.empty(shape, dtype=getattr(torch, DTYPES[dtype].torch_name), device=like.device)
    if stream_capturing(cupy):
        raise CaptureError(f"inside CUDA graph capture, pass {argument}= (allocated before the capture): "
                           "CuPy's memory pool cannot allocate for the graph")
    return cupy.empty(shape, dtype=DTYPES[dtype].storage)


# --- the stream of a dispatched call, CUDA graph capture, kernel scalars ----------------------

_call_state = threading.local()


@contextlib.contextmanager
def call_stream(stream):
    """Within: the stream the dispatched call will launch on (a CuPy stream; None: the
    framework's current one), for binds that keep per-stream workspace (call_stream_ptr)."""
    previous = getattr(_call_state, "stream", None)
    _call_state.stream = stream
    try:
        yield
    finally:
        _call_state.stream = previous


def call_stream_ptr(cupy, like) -> int:
    """The handle of the stream the current dispatched call launches on: the one given with
    stream=, else PyTorch's current stream for a tensor operand, else CuPy's current stream."""
    stream = getattr(_call_state, "stream", None)
    if stream is not None:
        return stream.ptr
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(like, torch.Tensor):
        return torch.cuda.current_stream(like.device).cuda_stream
    return cupy.cuda.get_current_stream().ptr


def stream_capturing(cupy, pointer: int | None = None) -> bool:
    """Whether the stream `pointer` (None: the current dispatched call's, see call_stream_ptr
    with a CuPy operand) is capturing a CUDA graph."""
    if pointer is None:
        stream = getattr(_call_state, "stream", None)
        pointer = stream.ptr if stream is not None else cupy.cuda.get_current_stream().ptr
    try:
        return cupy.cuda.runtime.streamIsCapturing(pointer) != 0
    except Exception:  # an invalidated capture raises: that stream is (was) capturing
        return True


_SCALARS: dict = {}
MAX_SCALARS = 4096


def kernel_scalar(value, kind=np.float32):
    """A kernel argument holding `value` as `kind` (np.float32, np.int32...), converted once per
    value: CuPy then passes it without converting it on every launch (a size-one array holder
    that CuPy's launcher accepts as is, where this CuPy has one; else the NumPy scalar).
    autogen.launch reads the value back from `.held`."""
    key = (kind, value)
    try:
        found = _SCALARS.get(key)
    except TypeError:  # unhashable (an array): converted on every call
        return _held_scalar(kind(value))
    if found is None:
        found = _held_scalar(kind(value))
        if len(_SCALARS) < MAX_SCALARS and value == value:  # NaN never equals its key
            _SCALARS[key] = found
    return found


_HOLDER = None


def _held_scalar(scalar):
    global _HOLDER
    if _HOLDER is None:
        _HOLDER = _holder_class()
    if _HOLDER is False:
        return scalar
    holder = _HOLDER(np.array(scalar))
    holder.held = scalar
    return holder


def _holder_class():
    """A Python subclass of CuPy's CNumpyArray (a CPointer: its launcher passes CPointers as
    they are), or False where this CuPy has none or it cannot be subclassed."""
    import os
    if os.environ.get("AUTOGEN_PLAIN_SCALARS"):  # kill switch: NumPy scalars, converted per launch
        return False
    cupy = sys.modules.get("cupy")
    base = getattr(getattr(getattr(cupy, "cuda", None), "function", None), "CNumpyArray", None)
    if base is None:
        return False
    try:
        holder = type("HeldScalar", (base,), {})
        probe = holder(np.array(np.float32(1.0)))
        probe.held = np.float32(1.0)
    except Exception:
        return False
    return holder


def random_uniform(xp, rng, shape, dtype) -> Any:
    """Uniform in [-0.5, 0.5): never zeros, so unwritten outputs and bad indexing show. `dtype`
    is an autogen dtype name ("bfloat16" gives bit patterns) or a NumPy/CuPy dtype."""
    from .dtypes import to_storage
    values = rng.random(shape, dtype=xp.float32)
    values -= xp.float32(0.5)  # in place: no second array
    if isinstance(dtype, str) and dtype in DTYPES:
        return to_storage(xp, values, dtype)
    return values.astype(dtype, copy=False)


_WORKSPACES: dict[tuple, tuple] = {}  # (device, stream, owner) -> its arrays
_FITTING: dict[tuple, tuple] = {}  # (device, stream, owner, sizes) -> the arrays, known large enough


def stream_workspace(cupy, device: int, like, owner: str, sizes: tuple[tuple[int, str], ...]) -> tuple:
    """Scratch arrays of a dispatched call ((count, dtype) each, zeroed once), kept per device,
    stream and owner, so that a call allocates nothing once warmed up (a CUDA graph can capture
    it) and concurrent calls on different streams never share them. Inside torch.cuda.graph they
    come from the graph's pool; inside CuPy's capture without a warm-up, a CaptureError says so."""
    stream = call_stream_ptr(cupy, like)
    fitting = _FITTING.get((device, stream, owner, sizes))  # the hot path: one lookup
    if fitting is not None:
        return fitting
    found = _WORKSPACES.get((device, stream, owner))
    if found is not None and all(a.size >= count for a, (count, _) in zip(found, sizes)):
        _FITTING[(device, stream, owner, sizes)] = found
        return found
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(like, torch.Tensor) and torch.cuda.is_current_stream_capturing():
        return tuple(cupy.asarray(torch.zeros(max(count, 1), dtype=getattr(torch, dtype), device=like.device))
                     for count, dtype in sizes)
    if stream_capturing(cupy, stream):
        raise CaptureError(f"{owner} keeps its workspace per stream and has none for the capturing stream: "
                           "warm up: call it once on that stream outside the graph, then capture")
    arrays = tuple(cupy.zeros(max(count, 1), dtype=dtype) for count, dtype in sizes)
    cupy.cuda.get_current_stream().synchronize()  # zeroed before any stream uses them (once)
    _WORKSPACES[(device, stream, owner)] = arrays
    for key in [k for k in _FITTING if k[:3] == (device, stream, owner)]:
        del _FITTING[key]  # they name the arrays just replaced
    _FITTING[(device, stream, owner, sizes)] = arrays
    return arrays
