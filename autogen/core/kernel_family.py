"""A plain CUDA kernel as an autogen family, from Kernel Tuner's description of it (see
autogen.core.kernel_spec for the rules): `kernel_family(...)` builds and registers it, and
`autogen.tune_kernel` tunes it. Named `kernel.<kernel_name>` unless `name=` says otherwise.

How a process serves such a family: it is code (a source and a parameter dict), so it exists in
a process only where that process's own code defines it: the same `autogen.kernel_family(...)`
call (with the same source, parameters and argument types) before `autogen.lookup`/`call`, or a
module named like the family that makes that call, which `autogen show|export|tune NAME` import
as they import any user family. A database row never re-creates one. The tuner's GPU worker, a
child process, gets the definition from its parent (Family.worker_recipe).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from autogen.core.compare import relative_error
from autogen.core.compiler_options import checked as checked_options
from autogen.core.dtypes import DTYPES
from autogen.core.family import Family, Launch
from autogen.core.kernel_spec import (Argument, block_names, defines, divisor_of, evaluate, grid_divisors, grid_of,
                                      IDENTIFIER, parameter_names, parse_argument_rule, prepared_source,
                                      problem_sizes, SIZE_NAMES, thread_block, tunable_space)
from autogen.core.operands import device_array, random_uniform
from autogen.core.registry import register
from autogen.errors import ArgumentError, FamilyError, NotTunedError, UsageError

# The relative L2 error a variant may show against the answer, per output dtype (integers: exact).
TOLERANCES = {"float32": 1e-5, "float16": 1e-3, "float64": 1e-12}


@dataclass(frozen=True)
class KernelDefinition:
    """Everything that makes the family's code and launches (no data): picklable where its
    callables are module-level functions."""

    name: str
    kernel_name: str
    source: str
    tune_params: tuple[tuple[str, tuple], ...]
    dims: int
    arguments: tuple[Argument, ...]
    grid_div: tuple
    restrictions: object
    block_size_names: tuple[str, str, str]
    jinja: bool = False
    atol: float = 1e-6
    tolerance: float | None = None
    poison_outputs: bool = True
    compiler_options: tuple[str, ...] = ()  # NVRTC's spelling (autogen.core.compiler_options.checked)


class KernelFamily(Family):
    """A family made from a KernelDefinition. `data`: the caller's arguments and answers for
    the problem of `data_sizes`, what validation runs on at that size (as Kernel Tuner's)."""

    template = "(none: rendered from the kernel source, see render_source)"
    roofline = "memory"

    def __init__(self, definition: KernelDefinition, data: dict | None = None, data_sizes: tuple = ()):
        self.definition = definition
        self.name = definition.name
        self.description = f"the CUDA kernel {definition.kernel_name}, tuned as Kernel Tuner describes it"
        self.dims = SIZE_NAMES[:definition.dims]
        self.compiler_options = definition.compiler_options  # Family.compiler_options: every compile gets them
        self.space = tunable_space(dict(definition.tune_params), definition.restrictions)
        first = next(self.space.enumerate(), None)
        if first is None:
            raise UsageError(f"{definition.name}: no configuration of tune_params satisfies the restrictions")
        self.default_params = first.as_dict()
        arrays = [a for a in definition.arguments if a.array]
        self.dtypes = (arrays[0].dtype if arrays else definition.arguments[0].dtype,)
        self.outputs = tuple(a.name for a in definition.arguments if a.output)
        self.c_params = ", ".join([f"int {d}" for d in self.dims] + [a.c_decl for a in definition.arguments])
        self.data, self.data_sizes, self.data_path = data, tuple(data_sizes), None
        self._scalar_types = tuple(None if a.array else np.dtype(DTYPES[a.dtype].storage).type
                                   for a in definition.arguments)

    # --- code -----------------------------------------------------------------------------
    def rendering_inputs(self) -> str:
        return self.definition.source  # the kernel's text: an edited .cu is another rendering

    def render_source(self, variables: dict) -> str:
        """The variant's CUDA source (autogen.core.render calls this in place of a template)."""
        d = self.definition
        params = {name: variables[name] for name in self.space.names}
        block = thread_block(params, d.block_size_names)
        source = d.source
        if d.jinja:
            from autogen.core.render import render_string  # Jinja2, only for a source that asks for it
            source = render_string(source, {**params, "kernel_name": d.kernel_name}, self)
        text = prepared_source(source, d.kernel_name, variables["kernel_name"], defines(params, block,
                                                                                          d.block_size_names))
        return text + (self._host_launcher(variables["kernel_name"], params, block) if variables["host_launcher"]
                       else "")

    def _host_launcher(self, symbol: str, params: dict, block: tuple) -> str:
        """`<symbol>_launch(c_params, stream)` for nvcc builds (autogen export)."""
        per_axis = [divisor_of(self.definition.grid_div, axis, params) for axis in range(len(self.dims))]
        grid = ", ".join(f"(unsigned int)(({d} + {p} - 1) / {p})" for d, p in zip(self.dims, per_axis))
        guard = " || ".join(f"{d} < 1" for d in self.dims)
        names = ", ".join(a.name for a in self.definition.arguments)
        return (f'\nextern "C" cudaError_t {symbol}_launch({self.c_params}, cudaStream_t stream)\n{{\n'
                f"    if ({guard}) return cudaErrorInvalidValue;\n    const dim3 grid({grid});\n"
                f"    {symbol}<<<grid, dim3({block[0]}, {block[1]}, {block[2]}), 0, stream>>>({names});\n"
                "    return cudaGetLastError();\n}\n")

    def launch(self, problem, config) -> Launch:
        params = config.as_dict()
        sizes = tuple(size for _name, size in problem.sizes)
        return Launch(grid=grid_of(sizes, params, self.definition.grid_div),
                      block=thread_block(params, self.definition.block_size_names))

    def kernel_args(self, problem, inputs: dict) -> tuple:
        return tuple(inputs[a.name] if kind is None else kind(inputs[a.name])
                     for a, kind in zip(self.definition.arguments, self._scalar_types))

    def worker_recipe(self):
        """How the tuner's GPU worker makes this family: recreate(definition, data_path). A
        callable restriction stays here (the worker measures points this process checked)."""
        definition = self.definition
        if callable(definition.restrictions):
            definition = replace(definition, restrictions=None)
        return (__name__, "recreate", {"definition": definition, "data_path": self.data_path,
                                       "data_sizes": self.data_sizes})

    # --- data -----------------------------------------------------------------------------
    def _sizes(self, problem) -> tuple[int, ...]:
        return tuple(size for _name, size in problem.sizes)

    def make_inputs(self, problem, xp, rng, case: dict) -> dict:
        sizes = self._sizes(problem)
        if self.data is not None and sizes == self.data_sizes:
            inputs = {a.name: xp.array(v) if a.array else v
                      for a, v in zip(self.definition.arguments, self.data["values"])}
        elif all(a.shape or a.value for a in self.definition.arguments):
            inputs = {a.name: self._made(a, dict(zip(self.dims, sizes)), xp, rng) for a in self.definition.arguments}
        else:
            where = ", ".join(f"{d}={s}" for d, s in zip(self.dims, self.data_sizes)) or "no problem size"
            raise NotTunedError(f"{self.name} has arguments to validate with only at {where} (those given to "
                                "tune_kernel); it is served at the sizes it was tuned at")
        if self.definition.poison_outputs:
            for name in self.outputs:
                inputs[name][...] = np.nan if inputs[name].dtype.kind == "f" else -1
        return inputs

    @staticmethod
    def _made(argument: Argument, sizes: dict, xp, rng):
        """An argument made by the rule of kernel_spec.parse_argument_rule."""
        storage = DTYPES[argument.dtype].storage
        if not argument.array:
            return np.dtype(storage).type(evaluate(argument.value, sizes, "argument"))
        shape = tuple(int(evaluate(e, sizes, "argument shape")) for e in argument.shape)
        if np.dtype(storage).kind == "f":
            return random_uniform(xp, rng, shape, getattr(xp, storage))
        return rng.integers(0, 100, size=shape).astype(storage)

    def reference(self, problem, inputs: dict, xp=np):
        """The answers as float64 at the size they were given for; None for an output without one."""
        given = self.data is not None and self._sizes(problem) == self.data_sizes
        answers = dict(zip((a.name for a in self.definition.arguments), self.data["answers"])) if given else {}
        return {name: (xp.asarray(answers[name]).astype(xp.float64) if answers.get(name) is not None else None)
                for name in self.outputs}

    def tolerance_for(self, problem) -> float:
        return self.definition.tolerance if self.definition.tolerance is not None else TOLERANCES.get(
            self.dtypes[0], 0.0)

    def compare(self, problem, inputs: dict, expected, magnitude, xp=np) -> tuple[float, str]:
        """Against an answer: relative L2 (judged against the tolerance by the caller) and
        Kernel Tuner's own rule, allclose(atol); integer outputs exactly. Without one: every
        element written (no poison left) and finite."""
        worst = 0.0
        for name in self.outputs:
            out, ref = inputs[name], expected[name]
            if ref is None:
                bad = int((~xp.isfinite(out.astype(xp.float64))).sum()) if out.dtype.kind == "f" else 0
                if bad:
                    return float("nan"), f"{name}: {bad} of {out.size} outputs unwritten or not finite"
                continue
            if out.shape != ref.shape:
                return float("nan"), f"{name}: output shape {out.shape} differs from the answer's {ref.shape}"
            error, reason = relative_error(xp, out, ref)
            if not reason and out.dtype.kind != "f" and bool((out.astype(xp.float64) != ref).any()):
                reason = "differs from the answer (integers are compared exactly)"
            if not reason and not bool(xp.allclose(out.astype(xp.float64), ref, atol=self.definition.atol)):
                reason = f"not within atol={self.definition.atol:g} of the answer (allclose)"
            if reason:
                return error, f"{name}: {reason}"
            worst = max(worst, error)
        return worst, ""

    def bytes_moved(self, problem, case=None) -> int:
        sizes = self._sizes(problem)
        if self.data is not None and sizes == self.data_sizes:
            return sum(int(np.asarray(v).nbytes) for a, v in zip(self.definition.arguments, self.data["values"])
                       if a.array) or 1
        named = dict(zip(self.dims, sizes))
        return sum(np.dtype(DTYPES[a.dtype].storage).itemsize
                   * int(np.prod([int(evaluate(e, named, "argument shape")) for e in a.shape]))
                   for a in self.definition.arguments if a.array and a.shape) or 1

    # --- calls from Python ------------------------------------------------------------------
    def bind(self, cupy, device: int, args: tuple, kwargs: dict):
        """autogen.call(name, *arguments, problem_size=N or (N, M)): the kernel's arguments in
        its order (CUDA arrays and scalars); outputs are written in place; returns None."""
        kwargs = dict(kwargs)
        if "problem_size" not in kwargs:
            raise ArgumentError(f"{self.name}: pass problem_size= (the size its grid is computed from)")
        sizes = problem_sizes(kwargs.pop("problem_size"))
        if kwargs or len(args) != len(self.definition.arguments) or len(sizes) != len(self.dims):
            raise ArgumentError(f"{self.name} takes {len(self.definition.arguments)} arguments ("
                                f"{self.c_params.split(', ', len(self.dims))[-1]}) and problem_size= of "
                                f"{len(self.dims)} sizes")
        inputs = {}
        for argument, value in zip(self.definition.arguments, args):
            inputs[argument.name] = (device_array(cupy, value, argument.name, (argument.dtype,),
                                                  getattr(value, "ndim", 1), device) if argument.array else value)
        return self.problem_cached(self.dtypes[0], tuple(zip(self.dims, sizes))), inputs, None


def source_text(kernel_source) -> str:
    """A source string, or the text of a file (a path, or a string naming an existing file)."""
    if isinstance(kernel_source, Path) or (isinstance(kernel_source, str) and "\n" not in kernel_source
                                           and len(kernel_source) < 4096 and Path(kernel_source).is_file()):
        try:
            return Path(kernel_source).read_text()
        except OSError as exc:
            raise UsageError(f"cannot read the kernel source {kernel_source}: {exc.strerror or exc}") from None
    if not isinstance(kernel_source, str) or "__global__" not in kernel_source:
        raise UsageError("kernel_source must be CUDA source text holding a __global__ kernel, or its file")
    return kernel_source


def _arguments(values, answer, source: str, kernel_name: str, dims: int):
    """(Argument descriptions, data) from Kernel Tuner's arguments (arrays and NumPy scalars)
    and answer (aligned, None for each non-output), or from a rule string (kernel_spec)."""
    if isinstance(values, str):
        if answer is not None:
            raise UsageError("answer goes with arguments given as arrays, not with an argument rule")
        rule = parse_argument_rule(values, dims)
        names = parameter_names(source, kernel_name, len(rule))
        return tuple(replace(a, name=n) for a, n in zip(rule, names)), None
    values = list(values)
    answer = [None] * len(values) if answer is None else list(answer)
    if not values or len(answer) != len(values):
        raise UsageError(f"answer has {len(answer)} entries for {len(values)} arguments: give one per argument, "
                         "None for each that is not an output")
    names = parameter_names(source, kernel_name, len(values))
    arguments, kept, answers = [], [], []
    for index, (value, expected) in enumerate(zip(values, answer)):
        value = value.get() if hasattr(value, "get") and not isinstance(value, np.generic) else value
        if isinstance(value, np.ndarray) and value.ndim > 0:
            array = True
        elif isinstance(value, (np.generic, np.ndarray)):
            array, value = False, np.asarray(value)[()]
        else:
            raise UsageError(f"argument {index} is a {type(value).__name__}: give NumPy/CuPy arrays, and NumPy "
                             "scalars such as numpy.int32(n) or numpy.float32(x), as Kernel Tuner asks")
        dtype = np.dtype(value.dtype).name
        if dtype not in DTYPES or dtype == "bfloat16":
            raise UsageError(f"argument {index} has dtype {dtype}; autogen takes "
                             f"{', '.join(d for d in DTYPES if d != 'bfloat16')}")
        if expected is not None:
            expected = np.asarray(expected.get() if hasattr(expected, "get") else expected)
            if not array or expected.shape != value.shape:
                raise UsageError(f"answer {index} must be an array of argument {index}'s shape {np.shape(value)}")
        arguments.append(Argument(names[index], dtype, array, expected is not None))
        kept.append(value)
        answers.append(expected)
    return tuple(arguments), {"values": tuple(kept), "answers": tuple(answers)}


def kernel_family(kernel_name, kernel_source, problem_size, arguments, tune_params, grid_div_x=None,
                  grid_div_y=None, grid_div_z=None, restrictions=None, answer=None, atol=1e-6,
                  block_size_names=None, compiler_options=None, *, name=None, jinja=False, tolerance=None,
                  poison_outputs=True):
    """Define (and register) the family of one CUDA kernel from Kernel Tuner's arguments (the
    same as autogen.tune_kernel's, which calls this); returns it. `arguments` are arrays and
    NumPy scalars, or a rule string (kernel_spec.parse_argument_rule). `compiler_options`: NVRTC
    options every variant is compiled with (autogen.core.compiler_options says which are taken).
    Call it again with the same definition in a later process to serve what was tuned (see the
    module's docstring)."""
    if not isinstance(kernel_name, str) or not IDENTIFIER.fullmatch(kernel_name):
        raise UsageError(f"kernel_name must be the kernel's C identifier, got {kernel_name!r}")
    family_name = name or f"kernel.{kernel_name}"
    if not isinstance(family_name, str) or "." not in family_name or not all(
            IDENTIFIER.fullmatch(p) for p in family_name.split(".")):
        raise UsageError(f"name must be identifiers joined by dots, e.g. kernel.{kernel_name}, got {family_name!r}")
    source = source_text(kernel_source)
    options = checked_options(compiler_options)
    sizes = problem_sizes(problem_size)
    described, data = _arguments(arguments, answer, source, kernel_name, len(sizes))
    tunable_space(tune_params)  # its errors first, before the divisors and restrictions name its parameters
    params = tuple((k, tuple(v)) for k, v in tune_params.items())
    blocks = block_names(block_size_names)
    divisors = grid_divisors(grid_div_x, grid_div_y, grid_div_z, blocks, tuple(tune_params))
    rules = tuple(restrictions) if isinstance(restrictions, (list, tuple)) else restrictions
    definition = KernelDefinition(family_name, kernel_name, source, params, len(sizes), described, divisors, rules,
                                  blocks, bool(jinja), float(atol), tolerance, bool(poison_outputs), options)
    family = KernelFamily(definition, data, sizes)
    register(family)
    return family


def recreate(definition: KernelDefinition, data_path: str | None, data_sizes: tuple) -> None:
    """In the tuner's GPU worker: register the family its parent defined (worker_recipe)."""
    data = None
    if data_path:
        with np.load(data_path, allow_pickle=False) as stored:
            count = len(definition.arguments)
            data = {"values": tuple(stored[f"value{i}"][()] for i in range(count)),
                    "answers": tuple(stored[f"answer{i}"] if f"answer{i}" in stored else None for i in range(count))}
    register(KernelFamily(definition, data, data_sizes))


def save_data(family: KernelFamily, path: Path) -> None:
    """Write the family's arguments and answers for its GPU worker (recreate reads them)."""
    if family.data is None:
        return
    arrays = {f"value{i}": np.asarray(v) for i, v in enumerate(family.data["values"])}
    arrays.update({f"answer{i}": a for i, a in enumerate(family.data["answers"]) if a is not None})
    np.savez(path, **arrays)
    family.data_path = str(path)


def check_picklable(family: KernelFamily) -> None:
    """The GPU worker is another process: what it needs of the definition must pickle."""
    try:
        pickle.dumps(family.worker_recipe())
    except Exception as exc:
        raise FamilyError(f"{family.name}: a grid divisor callable cannot reach autogen's GPU worker process "
                          f"({type(exc).__name__}: {exc}); use a module-level function or a list of expressions") \
            from None


__all__ = ["KernelDefinition", "KernelFamily", "kernel_family", "recreate", "save_data"]
