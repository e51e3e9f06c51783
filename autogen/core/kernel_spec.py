"""A plain CUDA kernel described the way Kernel Tuner's users describe it (a source, a dict of
tunable parameters, a problem size, grid divisors, restrictions, arguments), turned into the
pieces of an autogen family: a Space, the grid and block of a launch, the #defines each variant
is compiled with, and the kernel's C parameters. Pure: no GPU, no Jinja2, nothing stored.

Semantics follow Kernel Tuner's `tune_kernel` for the common case (autogen.core.kernel_family,
docs/tune_kernel.md): every tunable parameter becomes `#define name value` before the source,
with the block dimensions (`block_size_x/y/z`, or `block_size_names`) and `kernel_tuner 1`;
the grid in each dimension is the problem size divided (rounding up) by the product of that
dimension's divisors, `block_size_x/y/z` by default; a restriction is a Python expression over
the parameters (or a callable on their dict) that must hold.
"""

from __future__ import annotations

import functools
import math
import operator
import re
from dataclasses import dataclass
from typing import Callable, Mapping

from autogen.core.dtypes import DTYPES
from autogen.core.space import Param, Space
from autogen.errors import UsageError

# The problem's dimensions, as autogen names them (lookup(..., size_x=N), --size-x N).
SIZE_NAMES = ("size_x", "size_y", "size_z")
DEFAULT_BLOCK_NAMES = ("block_size_x", "block_size_y", "block_size_z")
DEFAULT_BLOCK = (256, 1, 1)  # Kernel Tuner's thread block where no parameter names one
# What an expression (a restriction, a grid divisor, a shape in an argument rule) may call.
_FUNCTIONS = {"min": min, "max": max, "abs": abs, "int": int, "float": float, "round": round,
              "ceil": math.ceil, "floor": math.floor, "log2": math.log2, "sqrt": math.sqrt}
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Argument:
    """One kernel argument: an array or a scalar of an autogen dtype. `output`: the kernel
    writes it (its answer is compared, it is poisoned with NaN before each check). `shape`
    (expressions in size_x/y/z) and `value` (a scalar's expression) are set where the argument
    is made by rule (the CLI's --args) rather than given as data."""

    name: str
    dtype: str
    array: bool
    output: bool = False
    shape: tuple[str, ...] = ()
    value: str = ""

    @property
    def c_decl(self) -> str:
        c_type = DTYPES[self.dtype].c_type
        return f"{'const ' if self.array and not self.output else ''}{c_type}{'*' if self.array else ''} {self.name}"


@functools.lru_cache(maxsize=1024)
def _compiled(expression: str):
    return compile(expression, "<expression>", "eval")


def evaluate(expression: str, names: Mapping[str, object], what: str):
    """The value of a Python expression over `names` (parameters, sizes) and a few math
    functions; UsageError naming `what` and the expression when it does not evaluate."""
    try:
        return eval(_compiled(expression), {"__builtins__": {}, **_FUNCTIONS}, dict(names))
    except Exception as exc:
        raise UsageError(f"{what} {expression!r} does not evaluate: {type(exc).__name__}: {exc}") from None


def _abbreviations(names: tuple[str, ...]) -> dict[str, str]:
    """Each parameter's prefix in kernel names: its words' initials (block_size_x: bsx), the
    whole name where two would share one or one would start another (which could make two
    points one kernel name)."""
    short = {n: "".join(word[0] for word in n.split("_") if word) or n for n in names}
    clash = {n for n in names for m in names if n != m and short[m].startswith(short[n])}
    return {n: (n.replace("_", "") if n in clash else short[n]) for n in names}


def tunable_space(tune_params: Mapping[str, object], restrictions=None) -> Space:
    """The Space of `tune_params` ({name: [values]}, ints or strings) under `restrictions` (a
    list of expressions that must all hold, or a callable on the parameter dict)."""
    if not isinstance(tune_params, Mapping) or not tune_params:
        raise UsageError("tune_params must be a non-empty dict of parameter name -> list of values")
    params = []
    abbrevs = _abbreviations(tuple(tune_params))
    for name, values in tune_params.items():
        if not isinstance(name, str) or not IDENTIFIER.fullmatch(name):
            raise UsageError(f"tunable parameter name {name!r} is not a C identifier")
        values = tuple(values) if isinstance(values, (list, tuple, range)) else None
        if not values:
            raise UsageError(f"tunable parameter {name} needs a non-empty list of values")
        for value in values:
            ok = (isinstance(value, int) and not isinstance(value, bool) and value >= 0) or \
                 (isinstance(value, str) and IDENTIFIER.fullmatch(value))
            if not ok:
                raise UsageError(f"tunable parameter {name} has value {value!r}: autogen takes integers >= 0 and "
                                 "identifiers (each value becomes part of the kernel's name)")
        params.append(Param(name, tuple(int(v) if isinstance(v, int) else v for v in values), abbrevs[name]))
    return Space(tuple(params), restriction_constraints(restrictions, tuple(tune_params)))


def restriction_constraints(restrictions, names: tuple[str, ...]) -> tuple[Callable, ...]:
    """Space constraints (None when a point passes, else why not) from Kernel Tuner's forms."""
    if restrictions is None:
        return ()
    if callable(restrictions):
        def holds(params, rule=restrictions):
            return None if rule(dict(params)) else "the restrictions callable returns False"
        return (holds,)
    if isinstance(restrictions, str) or not all(isinstance(r, str) for r in restrictions):
        raise UsageError("restrictions must be a list of expression strings or a callable on the parameter dict")
    for rule in restrictions:
        _check_expression(rule, names, "restriction")
    return tuple(functools.partial(_restriction_holds, rule) for rule in restrictions)


def _restriction_holds(rule: str, params) -> str | None:
    return None if evaluate(rule, params, "restriction") else f"restriction {rule!r} does not hold"


def _check_expression(expression: str, names: tuple[str, ...], what: str) -> None:
    try:
        code = _compiled(expression)
    except SyntaxError as exc:
        raise UsageError(f"{what} {expression!r} is not a Python expression: {exc.msg}") from None
    unknown = sorted(set(code.co_names) - set(names) - set(_FUNCTIONS))
    if unknown:
        raise UsageError(f"{what} {expression!r} names {', '.join(unknown)}, which is not a tunable parameter")


def grid_divisors(grid_div_x, grid_div_y, grid_div_z, block_size_names, names: tuple[str, ...]) -> tuple:
    """Each dimension's divisors: a list of expressions (their product divides the size), a
    callable on the parameter dict, or None for the dimension's block size name when it is a
    tunable parameter (else 1), as Kernel Tuner defaults."""
    divisors = []
    for given, block_name in zip((grid_div_x, grid_div_y, grid_div_z), block_size_names):
        if given is None:
            given = (block_name,) if block_name in names else ()
        elif isinstance(given, str):
            given = (given,)
        if not callable(given):
            given = tuple(given)
            for expression in given:
                if not isinstance(expression, str):
                    raise UsageError(f"a grid divisor must be an expression string, not {expression!r}")
                _check_expression(expression, names, "grid divisor")
        divisors.append(given)
    return tuple(divisors)


def block_names(block_size_names) -> tuple[str, str, str]:
    if block_size_names is None:
        return DEFAULT_BLOCK_NAMES
    names = tuple(block_size_names)
    if not 1 <= len(names) <= 3 or not all(isinstance(n, str) and IDENTIFIER.fullmatch(n) for n in names):
        raise UsageError(f"block_size_names must be 1 to 3 identifiers, got {block_size_names!r}")
    return names + DEFAULT_BLOCK_NAMES[len(names):]


def thread_block(params: Mapping, names: tuple[str, str, str]) -> tuple[int, int, int]:
    return tuple(int(params.get(name, default)) for name, default in zip(names, DEFAULT_BLOCK))


def grid_of(sizes: tuple[int, ...], params: Mapping, divisors: tuple) -> tuple[int, int, int]:
    """Blocks per dimension: ceil(size / product of the divisors); 1 past the problem's dims."""
    grid = []
    for axis, size in enumerate(tuple(sizes) + (1,) * (3 - len(sizes))):
        grid.append(max(1, math.ceil(size / divisor_of(divisors, axis, params))))
    return tuple(grid)


def divisor_of(divisors: tuple, axis: int, params: Mapping) -> int:
    """The product of dimension `axis`'s divisors (each an integer, as Kernel Tuner takes them)
    for these parameters; UsageError where it is not a positive integer."""
    given = divisors[axis]
    divisor = given(dict(params)) if callable(given) else math.prod(
        int(evaluate(e, params, "grid divisor")) for e in given)
    if not divisor or divisor <= 0 or int(divisor) != divisor:
        raise UsageError(f"the grid divisor of dimension {'xyz'[axis]} is {divisor!r} for {dict(params)}")
    return int(divisor)


def problem_sizes(problem_size) -> tuple[int, ...]:
    """Kernel Tuner's problem_size for the common case: an int or a tuple of 1 to 3 ints."""
    sizes = tuple(problem_size) if isinstance(problem_size, (tuple, list)) else (problem_size,)
    try:
        ints = tuple(operator.index(s) for s in sizes if not isinstance(s, bool))
    except TypeError:
        ints = ()
    if not 1 <= len(sizes) <= 3 or len(ints) != len(sizes) or min(ints) < 1:
        raise UsageError(f"problem_size must be an int >= 1 or a tuple of 1 to 3 of them, got {problem_size!r} "
                         "(autogen takes no string or callable problem sizes)")
    return ints


def defines(params: Mapping, block: tuple[int, int, int], names: tuple[str, str, str]) -> dict[str, object]:
    """What Kernel Tuner defines before a variant's source: the block dimensions, every tunable
    parameter and kernel_tuner. Not grid_size_x/y/z: one autogen variant serves every problem
    size, so the grid is not compiled in (read gridDim in the kernel)."""
    found = dict(zip(names, block))
    found.update(params)
    found["kernel_tuner"] = 1
    return found


def prepared_source(source: str, kernel_name: str, symbol: str, values: Mapping[str, object]) -> str:
    """The variant's source: the #defines, the kernel renamed to its procedural name `symbol`
    (a #define of the name, as Kernel Tuner renames it per variant), `#line 1` so compiler
    messages name the user's lines, the source wrapped in extern "C" where it has none (as
    Kernel Tuner's CUDA backends do), then every name #undef'd so that variants rendered into
    one file (autogen export) do not see each other's values."""
    lines = [f"#define {name} {value}" for name, value in values.items()]
    lines.append(f"#define {kernel_name} {symbol}")
    body = f"#line 1\n{source}" if 'extern "C"' in source else f'extern "C" {{\n#line 1\n{source}\n}}'
    undefs = "\n".join(f"#undef {name}" for name in (*values, kernel_name))
    return "\n".join(lines) + "\n" + body + ("" if body.endswith("\n") else "\n") + undefs + "\n"


def parameter_names(source: str, kernel_name: str, count: int) -> tuple[str, ...]:
    """The kernel's parameter names as its signature states them (`__global__ void name(float*
    c, ...)`), where the source holds one with `count` parameters; else arg0, arg1, ..."""
    match = re.search(rf"__global__[^;{{(]*\b{re.escape(kernel_name)}\s*\(([^)]*)\)", source)
    if match:
        found = [re.findall(r"[A-Za-z_][A-Za-z0-9_]*", p.split("=")[0])[-1:] for p in match.group(1).split(",")]
        names = tuple(n[0] for n in found if n)
        if len(names) == count and len(set(names)) == count and not set(names) & set(SIZE_NAMES):
            return names
    return tuple(f"arg{i}" for i in range(count))


_RULE = re.compile(r"(?P<out>out:)?(?P<dtype>[a-z0-9]+)(?:\[(?P<shape>[^\]]*)\]|=(?P<value>.+))$")


def parse_argument_rule(text: str, dims: int) -> tuple[Argument, ...]:
    """The CLI's rule for making arguments, one item per kernel argument, separated by spaces:
    `float32[size_x]` an input array of that shape (random uniform in [0, 1) for floats, random
    integers in [0, 100) for integers), `out:float32[size_y,size_x]` an output array (poisoned
    with NaN, or -1 for integers, before each run), `int32=size_x` a scalar (an expression in
    the sizes). Shapes are expressions in size_x, size_y, size_z (those the problem has)."""
    sizes = SIZE_NAMES[:dims]
    arguments = []
    for index, item in enumerate(text.split()):
        match = _RULE.fullmatch(item)
        if match is None or match.group("dtype") not in DTYPES or match.group("dtype") == "bfloat16":
            raise UsageError(f"argument {index} {item!r} is not DTYPE[SHAPE], out:DTYPE[SHAPE] or DTYPE=VALUE "
                             f"(DTYPE one of {', '.join(d for d in DTYPES if d != 'bfloat16')})")
        shape = tuple(s.strip() for s in (match.group("shape") or "").split(",") if s.strip())
        for expression in shape + ((match.group("value"),) if match.group("value") else ()):
            _check_expression(expression, sizes, f"argument {index}'s")
        if match.group("value") and match.group("out"):
            raise UsageError(f"argument {index} {item!r}: a scalar cannot be an output")
        arguments.append(Argument(f"arg{index}", match.group("dtype"), match.group("value") is None,
                                  bool(match.group("out")), shape, match.group("value") or ""))
    if not arguments:
        raise UsageError("the argument rule names no argument")
    return tuple(arguments)
