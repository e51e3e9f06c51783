"""What a family's Python call looks like to PyTorch: stated once by each family, as
`op_signature`, and turned here into torch.library schemas. Needs no torch (CI checks the schemas
without it); autogen.torch.ops registers them where torch is importable.

A family's call `autogen.<api>(first, ...)` takes tensors and scalars in order, then its outputs
by keyword (y=, out=, ...); each output's shape follows from the operands (the fake kernel's
shape inference) and may be read by the kernel when a scalar is not zero (hgemv's y under beta).
Each family becomes two ops:

  autogen::<op>(operands..., Tensor? <read output>=None) -> outputs     functional: new outputs
  autogen::<op>_out(operands..., *, Tensor(a!) <output>...) -> ()        writes the given outputs

<op> is the family's api, else its symbol (mykernels.axpy -> mykernels_axpy).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable

from autogen.core.dtypes import DTYPES
from autogen.errors import FamilyError

REQUIRED = inspect.Parameter.empty
# Scalar kinds and their schema types: "number" is torch's Scalar (an int or a float).
SCALAR_TYPES = {"float": "float", "int": "int", "bool": "bool", "str": "str", "number": "Scalar"}


@dataclass(frozen=True)
class Tensor:
    """A tensor operand of the call."""

    name: str


@dataclass(frozen=True)
class TensorList:
    """A list of tensor operands of the call (torch's Tensor[]): concat's inputs."""

    name: str


@dataclass(frozen=True)
class Scalar:
    """A scalar operand: kind is one of SCALAR_TYPES; default REQUIRED when it must be given;
    optional: None is accepted (and is then the default)."""

    name: str
    kind: str
    default: object = REQUIRED
    optional: bool = False


@dataclass(frozen=True)
class Output:
    """An output, passed to the call by keyword `name`. shape: a function of operands named by
    its parameters (lambda A, x: (A.shape[0],)) giving the output's shape; dtype: the name of a
    tensor operand whose dtype it has, or an autogen dtype name. read_when: the scalar under
    which the kernel reads the output's old value when it is not zero (beta), or None."""

    name: str
    shape: Callable[..., tuple]
    dtype: str | Callable[..., str]  # or a function of operands giving one (cumsum's acc_dtype)
    read_when: str | None = None

    def shape_of(self, values: dict) -> tuple:
        wanted = inspect.signature(self.shape).parameters
        return tuple(self.shape(**{name: values[name] for name in wanted}))

    def dtype_of(self, values: dict) -> str:
        """A tensor operand's name or an autogen dtype name, for these operand values."""
        if not callable(self.dtype):
            return self.dtype
        return self.dtype(**{name: values[name] for name in inspect.signature(self.dtype).parameters})


@dataclass(frozen=True)
class OpSignature:
    """A family's call as PyTorch sees it: operands in call order (the first a Tensor or a
    TensorList: it names the device and the stream), then outputs."""

    operands: tuple
    outputs: tuple
    _names: tuple = field(init=False, repr=False, compare=False, default=())

    def __post_init__(self):
        object.__setattr__(self, "_names", tuple(p.name for p in self.operands))

    @property
    def read_outputs(self) -> tuple:
        return tuple(o for o in self.outputs if o.read_when is not None)

    def functional_names(self) -> tuple:
        return self._names + tuple(o.name for o in self.read_outputs)

    def out_names(self) -> tuple:
        return self._names + tuple(o.name for o in self.outputs)


def op_name(family) -> str:
    return family.api or family.symbol


def functional_schema(signature: OpSignature) -> str:
    """`(Tensor A, Tensor x, float alpha=1.0, ...) -> Tensor` of the functional op."""
    arguments = [_operand(p) for p in signature.operands]
    arguments += [f"Tensor? {o.name}=None" for o in signature.read_outputs]
    results = "Tensor" if len(signature.outputs) == 1 else "(" + ", ".join("Tensor" for _ in signature.outputs) + ")"
    return f"({', '.join(arguments)}) -> {results}"


def out_schema(signature: OpSignature) -> str:
    """`(Tensor A, ..., *, Tensor(a!) y) -> ()` of the op writing into given outputs."""
    arguments = [_operand(p) for p in signature.operands]
    outputs = [f"Tensor({_alias(i)}!) {o.name}" for i, o in enumerate(signature.outputs)]
    return f"({', '.join(arguments + ['*'] + outputs)}) -> ()"


def _alias(index: int) -> str:
    return "abcdefghijklmnopqrstuvwxyz"[index]


def _operand(parameter) -> str:
    if isinstance(parameter, Tensor):
        return f"Tensor {parameter.name}"
    if isinstance(parameter, TensorList):
        return f"Tensor[] {parameter.name}"
    kind = SCALAR_TYPES[parameter.kind] + ("?" if parameter.optional else "")
    default = None if parameter.optional and parameter.default is REQUIRED else parameter.default
    if default is REQUIRED:
        return f"{kind} {parameter.name}"
    return f"{kind} {parameter.name}={_schema_literal(default)}"


def _schema_literal(value) -> str:
    if value is None or isinstance(value, bool):
        return str(value)
    if isinstance(value, str):
        return '"' + value + '"'
    return repr(value)


def bind_arguments(names: tuple, defaults: dict, args: tuple, kwargs: dict) -> dict:
    """The op's arguments by name, as torch passes them (positional, then keyword), defaults filled."""
    values = dict(zip(names, args))
    values.update(kwargs)
    for name in names:
        if name not in values:
            values[name] = defaults.get(name)
    return values


def defaults_of(signature: OpSignature) -> dict:
    found = {p.name: (None if p.default is REQUIRED else p.default)
             for p in signature.operands if isinstance(p, Scalar)}
    found.update({o.name: None for o in signature.read_outputs})
    return found


def check_signature(family, where: str) -> OpSignature:
    """The family's op_signature, checked: one FamilyError line starting with `where` (the
    family, as the registry describes it) otherwise."""
    signature = family.op_signature
    if not isinstance(signature, OpSignature):
        raise FamilyError(f"{where}: op_signature must be an autogen.core.signature.OpSignature")
    if not signature.operands or not isinstance(signature.operands[0], (Tensor, TensorList)):
        raise FamilyError(f"{where}: op_signature's first operand must be a Tensor or a TensorList")
    if not signature.outputs:
        raise FamilyError(f"{where}: op_signature names no output")
    names = signature.out_names()
    if len(set(names)) != len(names) or not all(isinstance(n, str) and n.isidentifier() for n in names):
        raise FamilyError(f"{where}: op_signature's names must be distinct identifiers, got {', '.join(map(str, names))}")
    tensors = {p.name for p in signature.operands if isinstance(p, (Tensor, TensorList))}
    scalars = {p.name for p in signature.operands if isinstance(p, Scalar)}
    for parameter in signature.operands:
        if isinstance(parameter, Scalar) and parameter.kind not in SCALAR_TYPES:
            raise FamilyError(f"{where}: scalar {parameter.name!r} has kind {parameter.kind!r}; "
                              f"one of {', '.join(SCALAR_TYPES)}")
        if not isinstance(parameter, (Tensor, TensorList, Scalar)):
            raise FamilyError(f"{where}: op_signature operands are Tensor, TensorList or Scalar, not {type(parameter).__name__}")
    for output in signature.outputs:
        if not callable(output.dtype) and output.dtype not in tensors and output.dtype not in DTYPES:
            raise FamilyError(f"{where}: output {output.name!r} has dtype {output.dtype!r}: a tensor operand's "
                              "name or an autogen dtype")
        if output.read_when is not None and output.read_when not in scalars:
            raise FamilyError(f"{where}: output {output.name!r} is read when {output.read_when!r}, not a scalar")
        unknown = [n for f in (output.shape, output.dtype) if callable(f)
                   for n in inspect.signature(f).parameters if n not in tensors | scalars]
        if unknown:
            raise FamilyError(f"{where}: the shape of output {output.name!r} uses {', '.join(unknown)}, "
                              "not operands of the call")
    return signature
