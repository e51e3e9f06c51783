"""The contract every kernel family fulfils: a Family subclass states its dimensions, dtypes,
search space, launches, inputs, float64 reference and peer once; the core and the GPU layers
reach a family only through this contract (and autogen.core.registry), never by its name.

A family, built in or a user's own, is one Python module holding a Family subclass decorated
with @autogen.register, plus its templates: <name>/kernel.cu.j2 (and <name>/selftest.cu.j2 for
`autogen export --self-test`), in templates/ for a built-in family, beside the module for a
user's (which may name its own files, e.g. template = "axpy.cu.j2"). See autogen.family, the
public face family authors import.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

from autogen.core.compare import relative_error, rounding_error
from autogen.core.dtypes import DTYPES, to_float64
from autogen.core.problem import Config, Problem
from autogen.errors import UsageError
from autogen.paths import templates_dir

if TYPE_CHECKING:  # a family's space is checked by the registry; the contract only names its type
    from autogen.core.space import Space

# Each dimension must fit the kernels' 32-bit int arguments.
MAX_DIM = 2**31 - 1


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
    # A two-choice trait may name a command-line switch: --<switch>, taking no value, selects
    # the second choice (scan's --exclusive); --<name> VALUE works as for every trait.
    switch: str | None = None

    def value(self, given: object) -> str:
        text = str(given)
        value = self.parse(text) if self.parse is not None else text
        if value not in self.choices:
            raise UsageError(f"{self.name} must be one of {', '.join(self.choices)}, not {given!r}")
        return value


class Family:
    """Base class. Subclasses set the class attributes and implement the methods that raise."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # A family's kernel template defaults to its own folder, <name>/kernel.cu.j2 (in templates/
        # for a built-in family, beside the module for a user's); a subclass keeps its parent's.
        inherited = any("template" in c.__dict__ for c in cls.__mro__[1:] if c is not Family)
        if "template" not in cls.__dict__ and not inherited and isinstance(cls.__dict__.get("name"), str):
            cls.template = f"{cls.name}/kernel.cu.j2"


    name: str  # "sgemv"; a user family's is namespaced by @register: "mykernels.axpy"
    template: str  # the kernel template, looked up in template_dirs(); default <name>/kernel.cu.j2
    selftest_includes: tuple[str, ...] = ()  # headers the hook's code needs, e.g. CUB's (included once)
    dims: tuple[str, ...]  # integer dimensions in order, e.g. ("m", "n")
    dim_defaults: Mapping[str, int] = {}  # dimensions a caller may leave out, e.g. {"batch": 1}
    traits: tuple[Trait, ...] = ()  # categorical problem attributes, after the dims in the key
    dtypes: tuple[str, ...]  # supported dtype names (autogen.core.dtypes.DTYPES), the first the default
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
    # for the launch, the outputs read back (autogen.gpu.measure.checks_on_host). 0: always on the GPU,
    # for a family whose cases read views into larger buffers (an upload would align them) or
    # whose reference is slow in NumPy. The default is about where a host check stops being
    # cheaper than the GPU's, whose CuPy kernels a GPU worker compiles while it waits for its first
    # variant (docs/internals.md, "How a variant is judged"; scripts/check_cost.py measures it).
    host_check_bytes: int = 128 << 10
    # True when `bind` only checks and arranges the call's operands (no GPU work, no scratch memory
    # made per call, nothing that depends on the data): the dispatcher may then serve a repeat of
    # a call (the same CuPy arrays with the same shapes, the same other arguments, device and
    # stream) from an earlier binding, behind guards, without running bind again (autogen.runtime.bound_calls).
    reuse_bound_calls: bool = False
    # The Python call as PyTorch sees it (autogen.core.signature.OpSignature: operands in call
    # order, outputs with their shapes): the family's torch.ops.autogen.<op>. None: no torch op.
    op_signature = None
    # The family's own compiler options besides autogen's, e.g. ("-use_fast_math",)
    # (autogen.core.compiler_options says which are taken; registration checks them): every compile
    # of its variants gets them (NVRTC when tuning and serving; nvcc in `autogen check`, `show
    # --resources` and the export's build), and they are part of the compile cache key and of each
    # stored source hash, so a change recompiles and re-tunes. One set per family: an export
    # compiles all its variants in one file.
    compiler_options: tuple[str, ...] = ()

    def rendering_inputs(self) -> str:
        """What a rendering reads besides the family's module, the files beside it and its
        templates (autogen.catalog.source_memo fingerprints those): a family made from source
        text returns that text, so editing it makes stored winners stale. "" for the others."""
        return ""

    # --- identity -------------------------------------------------------------------------
    @property
    def symbol(self) -> str:
        """The name as a C identifier: kernel names and exported symbols start with it."""
        return self.name.replace(".", "_")

    @property
    def module(self) -> str:
        """The module that registers this family: the GPU worker imports it to find it."""
        return type(self).__module__

    @property
    def selftest_template(self) -> str | None:
        """The `autogen export --self-test` hook (see templates/export/selftest.cu.j2): selftest.cu.j2
        beside a kernel template named <folder>/kernel.cu.j2, where there is one; else None (a
        family may name its own)."""
        folder, _, file = self.template.rpartition("/")
        hook = f"{folder}/selftest.cu.j2" if folder and file == "kernel.cu.j2" else None
        return hook if hook and any((d / hook).is_file() for d in self.template_dirs()) else None

    def worker_recipe(self) -> tuple | None:
        """How a child process (the tuner's GPU worker) registers this family where importing its
        module does not: (module, function, keyword arguments), picklable, called there by
        autogen.core.registry.recreate. None (the default): importing `module` registers it."""
        return None

    def template_dirs(self) -> list[Path]:
        """Where this family's templates are looked up: beside its module, then autogen's."""
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
        reason = self.traits_reason(dtype, problem.traits)
        if reason:
            raise UsageError(f"{self.name}: {reason}")
        self.check_problem(problem)
        return problem

    def check_problem(self, problem: Problem) -> None:
        """Raise UsageError for a shape the family cannot compute (e.g. a bias size that does
        not divide n). Default: every shape is fine."""

    def traits_reason(self, dtype: str, traits: tuple[tuple[str, str], ...]) -> str | None:
        """Why these trait values cannot go with this dtype (scan's int64 sums of float x), or
        None: problem() refuses such a problem, and an export makes no entry point for it."""
        return None
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
        """Another shape's winner `params` as a point for `problem`: tried first by the warm start,
        and served by the dispatcher before `problem` is tuned (its nearest and arch steps, after
        validation on `problem`). Unchanged by default; a family changes what only fits the other
        shape (hgemv: the batch tile that covers this batch, and the row form on rows off the
        16-byte boundary). The result is checked against the space by the caller."""
        return params

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

    # A family states its kernels' arguments once: a one-kernel family in launch and kernel_args
    # (the default plan's sources), any other, or one that converts its scalars once per shape
    # rather than per call, in plan alone (registry._check_definition refuses a family with neither).
    def launch(self, problem: Problem, config: Config) -> Launch:
        """The grid and block of the one kernel (the default plan's)."""
        raise NotImplementedError

    def kernel_args(self, problem: Problem, inputs: dict) -> tuple:
        """The one kernel's arguments, in c_params order, from the inputs dict (the default plan's)."""
        raise NotImplementedError

    def plan(self, problem: Problem, config: Config) -> list[Step]:
        """The launches of one call, in order, each with its arguments. Default: the one kernel
        of `launch`, called with `kernel_args`."""
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

    # Shapes with tails (sizes not a multiple of any tile or vector width, single rows and
    # columns) the export's self-test checks every variant on, in `dims` order, beside the tuned
    # shapes: their inputs and references are made here (make_inputs, reference) at export time
    # and shipped as data (autogen.export.selftest_data).
    tail_shapes: tuple[tuple[int, ...], ...] = ()

    def export_tail_shapes(self) -> tuple[tuple[int, ...], ...]:
        """tail_shapes, or by default every dimension 1, 3, 37, then 257."""
        return self.tail_shapes or tuple((size,) * len(self.dims) for size in (1, 3, 37, 257))

    def c_arguments(self, problem: Problem, inputs: dict) -> dict:
        """The values of the exported entry point's C parameters (c_params_for) for one launch on
        `inputs`, by name: an inputs entry, else a dimension. The export's self-test replays a
        launch with them; a family with a C parameter that is neither adds it here."""
        return {**dict(problem.sizes), **inputs}

    def export_compare(self, problem: Problem, configs: tuple = ()) -> str | None:
        """How the export's self-test compares replayed outputs with the reference, as compare()
        does, for an entry point serving `configs`: "l2" (the relative L2 error of each output,
        judged as autogen.gpu.measure.judge),
        "exact" (every finite reference value equal, NaN ones free), "exact_multiset" (the same,
        as sorted multisets). None: compare() is the family's own and has no such form (then
        its C++ hook alone checks it)."""
        return "l2" if type(self).compare is Family.compare else None

    def make_inputs(self, problem: Problem, xp, rng, case: dict) -> dict:
        """Arrays (numpy or cupy, per xp) and scalars for one launch; every output poisoned
        (NaN, or a sentinel for integers) wherever the kernel must overwrite it."""
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
        (autogen.gpu.measure.judge): a softmax row of 128256 columns holds probabilities near
        1/128256, fp16 subnormals, whose correct rounding alone exceeds the fp16 tolerance. With
        several outputs the largest applies to compare's worst error (every built-in family
        with a half output has that one output)."""
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

    # Modules peer() imports (e.g. "torch"): the GPU worker imports them in the background once a
    # search measures, so that timing the peer after the search does not wait for them.
    peer_imports: tuple[str, ...] = ()

    # --- calls from Python (the dispatcher) -------------------------------------------------
    def bind(self, cupy, device: int, args: tuple, kwargs: dict) -> tuple[Problem, dict, Any]:
        """Check a call's operands (on the current `device`) and turn them into
        (problem, inputs dict, value to return). It runs on every dispatched call: keep it to
        cheap checks (device_array), cached problems (problem_cached) and no synchronisation.
        Inside CUDA graph capture it must not allocate from CuPy's pool (new_output refuses;
        take outputs and workspace from the caller or from a per-stream cache)."""
        raise NotImplementedError(f"{self.name} has no Python call API")

    # The shape of the example call the GPU tests and scripts/bench_dispatch.py make (dimension ->
    # size; traits take their defaults). None: 1000 along each dimension. A family whose operands
    # grow with several dimensions (a batched GEMM, a list of inputs) states a small one: the
    # default of 1000 each would allocate gigabytes there.
    example_dims: dict | None = None

    def example_problem(self) -> Problem:
        """The problem of the family's example call: example_dims, or 1000 along each dimension."""
        return self.problem(None, **(self.example_dims or {d: 1000 for d in self.dims}))

    def example_call(self, problem: Problem, cupy) -> tuple[tuple, dict] | None:
        """(args, kwargs) of a call of autogen.<api> at `problem`'s shape, made of CuPy arrays,
        with every output passed in (out=, y=...) so that the call is safe inside CuPy's stream
        capture. Used by scripts/bench_dispatch.py and tests/runtime/test_gpu_capture.py; None: no
        example (the family is skipped there)."""
        return None

    @functools.lru_cache(maxsize=4096)
    def problem_cached(self, dtype: str, dims: tuple[tuple[str, int | str], ...]) -> Problem:
        """self.problem(dtype, **dict(dims)), validated once per shape: binds call it per call."""
        return self.problem(dtype, **dict(dims))


def _of_output(value, name: str):
    """A reference or magnitude for one output: families with several outputs give dicts."""
    return value[name] if isinstance(value, dict) else value
