"""Frozen value objects: what to compute (Problem) and how (Config)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, TypeVar


T = TypeVar("T")


@dataclass(frozen=True)
class Problem:
    """One family at one dtype and shape, e.g. sgemv float32 m=16384 n=16."""

    family: str
    dtype: str
    # Ordered (name, value) pairs: the family's sizes (int), then its traits (str), e.g.
    # (("n", 1 << 28), ("bins", 256), ("distribution", "skewed")).
    dims: tuple[tuple[str, int | str], ...]

    def __hash__(self) -> int:
        # Problems key the dispatcher's cache on every call: hash once, not per lookup.
        try:
            return self._hash
        except AttributeError:
            value = hash((self.family, self.dtype, self.dims))
            object.__setattr__(self, "_hash", value)
            return value

    def __reduce__(self):
        # String hashes differ between processes: never carry the cached one across a pickle.
        return (Problem, (self.family, self.dtype, self.dims))

    @property
    def shape(self) -> dict[str, int | str]:
        return dict(self.dims)

    @property
    def sizes(self) -> tuple[tuple[str, int], ...]:
        """The integer dimensions only (traits left out)."""
        return tuple((name, value) for name, value in self.dims if not isinstance(value, str))

    @property
    def traits(self) -> tuple[tuple[str, str], ...]:
        """The categorical attributes only, e.g. (("distribution", "skewed"),)."""
        return tuple((name, value) for name, value in self.dims if isinstance(value, str))

    @property
    def shape_key(self) -> str:
        """Canonical text form, used as the database key: "m=16384,n=16"."""
        return ",".join(f"{name}={size}" for name, size in self.dims)

    def __getitem__(self, dim: str):
        for name, value in self.dims:
            if name == dim:
                return value
        raise KeyError(dim)

    def __str__(self) -> str:
        return f"{self.family} {self.dtype} {self.shape_key}"


def parse_shape_key(shape_key: str) -> tuple[tuple[str, int | str], ...]:
    """Inverse of Problem.shape_key; raises ValueError on anything malformed. Sizes are ASCII
    digits, traits are identifiers."""
    dims = []
    for part in shape_key.split(","):
        name, _, value = part.partition("=")
        if not name.isidentifier() or not name.isascii() or not value.isascii():
            raise ValueError(f"malformed shape key {shape_key!r}")
        if value.isdigit():
            dims.append((name, int(value)))
        elif value.isidentifier():
            dims.append((name, value))
        else:
            raise ValueError(f"malformed shape key {shape_key!r}")
    return tuple(dims)


def shape_distance(a: Problem, b: Problem) -> float:
    """How far apart two shapes are: the Euclidean distance of their log2 sizes; infinite when
    their traits differ (a kernel tuned for skewed data is no neighbour of a uniform problem)."""
    if a.traits != b.traits or len(a.sizes) != len(b.sizes):
        return math.inf
    return math.sqrt(sum(math.log2(x / y) ** 2 for (_, x), (_, y) in zip(a.sizes, b.sizes)))


def nearest(query: Problem, items: Iterable[T], problem_of: Callable[[T], Problem | None],
            tie: Callable[[T], tuple] = lambda item: ()) -> list[T]:
    """`items` nearest first: the one ordering the dispatcher, the warm start and the exported C
    table share. Ties go to the smaller shape key, then to `tie`; items whose problem is None
    (malformed) or whose traits differ are left out."""
    ranked = []
    for item in items:
        other = problem_of(item)
        if other is None:
            continue
        distance = shape_distance(query, other)
        if math.isfinite(distance):
            ranked.append(((distance, other.shape_key) + tuple(tie(item)), item))
    ranked.sort(key=lambda pair: pair[0])
    return [item for _key, item in ranked]


@dataclass(frozen=True)
class Config:
    """One point of a family's search space. Build it through Space.check, never by hand."""

    params: tuple[tuple[str, int | str], ...]

    @classmethod
    def of(cls, params: Mapping[str, int | str]) -> "Config":
        return cls(tuple(params.items()))

    def as_dict(self) -> dict[str, int | str]:
        return dict(self.params)

    def __getitem__(self, name: str) -> int | str:
        return self.as_dict()[name]


def problem_of_record(family: str, dtype: str, shape_key: object) -> Problem | None:
    """The Problem a stored row names, or None when its shape key is malformed (a bad row is
    skipped by whoever reads it, never a traceback)."""
    if not isinstance(shape_key, str):
        return None
    try:
        return Problem(family, dtype, parse_shape_key(shape_key))
    except ValueError:
        return None
