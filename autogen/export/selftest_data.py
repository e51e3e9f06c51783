"""The export self-test's data: the inputs and float64 references of the Python family, written
at export time beside the self-test, which replays each through every exported launcher and
compares (templates/export/selftest.cu.j2, `replay`). A family is stated once: its make_inputs,
validation_cases, reference, reference_magnitude and representable_error are the ones autogen
validates with. The shapes checked are the family's tail shapes (Family.export_tail_shapes) and
each tuned shape with the same shape one larger in every dimension; those whose data would not
fit MAX_CASE_BYTES per case (or MAX_DATA_BYTES in all) are left to the family's C++ hook. A
trait that is also a C parameter of the entry point (gelu's approximate) reaches every variant
as an argument, so each shape is checked with every value of it, the entry's own first.

The file (little-endian): MAGIC, u32 record count, then per record (one shape and case of one
entry point): u32 entry index, u32 dims count, i32 dims, u16 name length and the case name,
f64 tolerance, f64 rounding floor, u8 comparison (COMPARISONS), u32 argument count, then per C
parameter of the entry point: u8 kind (KIND_*); a scalar: 8 bytes (its C type's bytes, zero
padded); a buffer: u8 output, u8 element type (ELEMENT_TYPES), u32 element bytes, u64 offset
(elements before the data in its allocation), u64 count, the count elements; an output then
f64 norm of its magnitude and f64 reference[count]. The self-test checks the file's size and
CRC-32 (zlib's) against the values compiled into it before reading a byte of it.
"""

from __future__ import annotations

import itertools
import re
import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

from autogen.core.family import Family, MAX_DIM
from autogen.core.problem import Problem
from autogen.errors import UsageError

MAGIC = b"AGSTDAT1"
MAX_CASE_BYTES = 1 << 20  # one case of one shape: its buffers and references
MAX_DATA_BYTES = 24 << 20  # the whole file
COMPARISONS = {"l2": 0, "exact": 1, "exact_multiset": 2}
KIND_SCALAR, KIND_BUFFER = 0, 1
# How an output's elements are read back as doubles (bfloat16: the problem's uint16 bit patterns).
ELEMENT_TYPES = {"float32": 0, "float16": 1, "bfloat16": 2, "int32": 3, "uint32": 4, "float64": 5, "uint8": 6,
                 "int8": 7, "int16": 8, "uint16": 9, "int64": 10, "uint64": 11}
# Scalar C types a replayed launch can pass, as NumPy stores them.
SCALAR_TYPES = {"int": "<i4", "unsigned": "<u4", "unsigned int": "<u4", "float": "<f4", "double": "<f8",
                "long long": "<i8", "unsigned long long": "<u8", "size_t": "<u8"}


@dataclass(frozen=True)
class CParam:
    ctype: str  # "const float*", "int"
    name: str

    @property
    def pointer(self) -> bool:
        return self.ctype.endswith("*")


def c_param_list(c_params: str, family_name: str) -> tuple[CParam, ...]:
    """The (type, name) pairs of a C parameter list; UsageError naming one it cannot read."""
    params = []
    for part in c_params.split(","):
        match = re.fullmatch(r"\s*(.*?[\s*&])\s*([A-Za-z_]\w*)\s*", part)
        if not match:
            raise UsageError(f"{family_name}: cannot read the C parameter {part.strip()!r} of {c_params!r}")
        params.append(CParam(" ".join(match[1].replace("*", " * ").split()).replace(" *", "*"), match[2]))
    return tuple(params)


@dataclass
class EntryChecks:
    """The shapes one entry point's self-test checks: from the data file, or with its C++ hook."""

    data_shapes: list[tuple[int, ...]] = field(default_factory=list)
    hook_shapes: list[tuple[int, ...]] = field(default_factory=list)
    records: int = 0


@dataclass(frozen=True)
class SelftestData:
    blob: bytes
    checks: dict[str, EntryChecks]  # by entry symbol
    crc32: int

    @property
    def size(self) -> int:
        return len(self.blob)


def check_shapes(family: Family, entry) -> list[tuple[int, ...]]:
    """The family's tail shapes, then each tuned shape and the same plus one in every dimension
    (a tail for any tile or vector width), each valid for the family, smallest first."""
    shapes = {tuple(shape) for shape in family.export_tail_shapes()}
    for tuned in entry.shapes:
        shapes.add(tuned.dims)
        shapes.add(tuple(min(size + 1, MAX_DIM) for size in tuned.dims))
    valid = [s for s in shapes if _problem(family, entry, s) is not None]
    return sorted(valid, key=lambda s: (int(np.prod(s, dtype=np.float64)), s))


def _problem(family: Family, entry, shape: tuple[int, ...]) -> Problem | None:
    try:
        return family.problem(entry.dtype, **dict(zip(family.dims, shape)), **dict(entry.traits))
    except (UsageError, TypeError):
        return None  # a shape the family cannot compute (check_problem): not checked


def build(family: Family, entries) -> SelftestData:
    """The data of every entry point's checks, within MAX_CASE_BYTES per case and MAX_DATA_BYTES."""
    records, checks, total = [], {}, 0
    for index, entry in enumerate(entries):
        params = c_param_list(entry.c_params, family.name)
        found = checks[entry.symbol] = EntryChecks()
        for shape in check_shapes(family, entry):
            made = _shape_data(family, entry, index, shape, params, MAX_DATA_BYTES - total)
            if made is None:
                found.hook_shapes.append(shape)
                continue
            found.data_shapes.append(shape)
            found.records += len(made)
            records += made
            total += sum(map(len, made))
    blob = MAGIC + struct.pack("<I", len(records)) + b"".join(records)
    return SelftestData(blob, checks, zlib.crc32(blob))


def argument_traits(family: Family, params: tuple[CParam, ...]) -> list:
    """The family's traits that the kernel takes as an argument (a C parameter of that name)."""
    names = {param.name for param in params}
    return [trait for trait in family.traits if trait.name in names]


def _shape_problems(family: Family, entry, shape: tuple[int, ...], params: tuple[CParam, ...]) -> list[Problem]:
    """The entry point's problem at `shape`, then the same with each other combination of the
    values of its argument traits."""
    own = dict(entry.traits)
    traits = argument_traits(family, params)
    combos = itertools.product(*(trait.choices for trait in traits))
    problems = [_problem(family, entry, shape)]
    for values in combos:
        other = {**own, **dict(zip((trait.name for trait in traits), values))}
        if other != own:
            problems.append(family.problem(entry.dtype, **dict(zip(family.dims, shape)), **other))
    return problems


def _shape_data(family: Family, entry, index: int, shape: tuple[int, ...], params: tuple[CParam, ...],
                budget: int) -> list[bytes] | None:
    """The records of every problem of `shape` (_shape_problems), or None when one has none."""
    made: list[bytes] = []
    for problem in _shape_problems(family, entry, shape, params):
        records = _shape_records(family, problem, index, shape, params, budget - sum(map(len, made)),
                                 _entry_configs(entry))
        if records is None:
            return None
        made += records
    return made


def _estimated_bytes(family: Family, problem: Problem, case: dict) -> float:
    try:
        moved = family.bytes_moved(problem, case)
    except NotImplementedError:
        moved = 8 * float(np.prod([size for _name, size in problem.sizes], dtype=np.float64))
    return 2 * moved  # the buffers, and the references of the outputs among them


def _entry_configs(entry) -> tuple:
    """The configs an entry point may serve: its tuned shapes', or its default variant's."""
    configs = tuple(c for c in (getattr(tuned, "config", None) for tuned in entry.shapes) if c is not None)
    default = getattr(getattr(entry, "default", None), "config", None)
    return configs or ((default,) if default is not None else ())


def _shape_records(family: Family, problem: Problem, index: int, shape: tuple[int, ...],
                   params: tuple[CParam, ...], budget: int, configs: tuple = ()) -> list[bytes] | None:
    """The records of every validation case of `problem`, or None when one would be over
    MAX_CASE_BYTES, all of them over `budget`, or the family's comparison has no replay."""
    comparison = family.export_compare(problem, configs)
    cases = family.validation_cases(problem)
    if comparison not in COMPARISONS or any(_estimated_bytes(family, problem, c) > MAX_CASE_BYTES for c in cases):
        return None
    made = []
    for number, case in enumerate(cases):
        seed = zlib.crc32(f"{family.name}|{problem.dtype}|{problem.shape_key}|{number}".encode())
        try:
            record = case_record(family, problem, case, seed, index, shape, params, comparison)
        except NotImplementedError:  # a family without make_inputs or reference: nothing to ship
            return None
        if len(record) > MAX_CASE_BYTES:
            return None
        made.append(record)
    return made if sum(map(len, made)) <= budget else None


def case_record(family: Family, problem: Problem, case: dict, seed: int, index: int, shape: tuple[int, ...],
                params: tuple[CParam, ...], comparison: str) -> bytes:
    """One record: the case's inputs as make_inputs made them (outputs poisoned), the float64
    reference of each output, the norm of its magnitude, the tolerance and rounding floor."""
    inputs = family.make_inputs(problem, np, np.random.default_rng(seed), case)
    with np.errstate(all="ignore"):  # references may hold NaN on purpose (softmax's -inf rows)
        expected = family.reference(problem, inputs, np)
        magnitude = family.reference_magnitude(problem, inputs, np)
        floor = family.representable_error(problem, inputs, expected, magnitude, np) if comparison == "l2" else 0.0
    values = family.c_arguments(problem, inputs)
    traits = {trait.name: problem[trait.name] for trait in argument_traits(family, params)}
    name = _case_name({**traits, **case}).encode()
    parts = [struct.pack("<II", index, len(shape)), struct.pack(f"<{len(shape)}i", *shape),
             struct.pack("<H", len(name)), name,
             struct.pack("<ddBI", family.tolerance_for(problem), floor, COMPARISONS[comparison], len(params))]
    for param in params:
        if param.name not in values:
            raise UsageError(f"{family.name}: the C parameter {param.name!r} is no inputs entry or dimension; "
                             "give its value in Family.c_arguments")
        value = values[param.name]
        if not param.pointer:
            parts.append(_scalar(family, param, value))
            continue
        is_output = param.name in family.outputs
        parts.append(_buffer(family, problem, inputs, param, value, is_output))
        if is_output:
            parts.append(_reference(family, problem, inputs, param.name, expected, magnitude))
    return b"".join(parts)


def _case_name(case: dict) -> str:
    text = " ".join(f"{key}={value}" for key, value in case.items()) or "default"
    return "".join(c if c.isalnum() or c in " =.,_-+" else "_" for c in text)[:200]


def _scalar(family: Family, param: CParam, value) -> bytes:
    kind = SCALAR_TYPES.get(param.ctype)
    if kind is None or isinstance(value, np.ndarray) and value.size != 1:
        raise UsageError(f"{family.name}: the self-test cannot pass the C parameter {param.ctype} {param.name}")
    return struct.pack("<B", KIND_SCALAR) + np.asarray(value).astype(kind).tobytes().ljust(8, b"\0")


def _buffer(family: Family, problem: Problem, inputs: dict, param: CParam, array, is_output: bool) -> bytes:
    if not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
        raise UsageError(f"{family.name}: the C parameter {param.name} needs a contiguous array from make_inputs")
    offset = 0
    if array.base is not None and isinstance(array.base, np.ndarray):  # a view past an aligned start
        offset = (array.__array_interface__["data"][0] - array.base.__array_interface__["data"][0]) // array.itemsize
        offset = max(offset, 0)
    element = family.output_dtype(problem, inputs, param.name, np) if is_output else np.dtype(array.dtype).name
    if element not in ELEMENT_TYPES:
        raise UsageError(f"{family.name}: the self-test cannot compare an output of type {element} ({param.name})")
    return (struct.pack("<BBBIQQ", KIND_BUFFER, int(is_output), ELEMENT_TYPES[element], array.itemsize, offset,
                        array.size) + array.tobytes())


def _reference(family: Family, problem: Problem, inputs: dict, name: str, expected, magnitude) -> bytes:
    ref = np.asarray(expected[name] if isinstance(expected, dict) else expected, dtype=np.float64).ravel()
    scale = magnitude[name] if isinstance(magnitude, dict) else magnitude
    scale = ref if scale is None else np.asarray(scale, dtype=np.float64).ravel()
    if ref.size != inputs[name].size:
        raise UsageError(f"{family.name}: the reference of {name} has {ref.size} values for {inputs[name].size} outputs")
    norm = float(np.linalg.norm(np.where(np.isfinite(ref), scale, 0.0)))
    return struct.pack("<d", norm) + ref.tobytes()
