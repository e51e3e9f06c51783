"""Frozen value objects: what to compute (Problem) and how (Config)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

# dtype names users type, mapped to the short tag used in kernel names.
DTYPE_TAGS = {"float32": "f32", "float16": "f16"}


@dataclass(frozen=True)
class Problem:
    """One family at one dtype and shape, e.g. sgemv float32 m=16384 n=16."""

    family: str
    dtype: str
    dims: tuple[tuple[str, int], ...]  # ordered (name, size) pairs, the family's dimension order

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
    def shape(self) -> dict[str, int]:
        return dict(self.dims)

    @property
    def shape_key(self) -> str:
        """Canonical text form, used as the database key: "m=16384,n=16"."""
        return ",".join(f"{name}={size}" for name, size in self.dims)

    def __getitem__(self, dim: str) -> int:
        return self.shape[dim]

    def __str__(self) -> str:
        return f"{self.family} {self.dtype} {self.shape_key}"


def parse_shape_key(shape_key: str) -> tuple[tuple[str, int], ...]:
    """Inverse of Problem.shape_key; raises ValueError on anything malformed."""
    dims = []
    for part in shape_key.split(","):
        name, _, size = part.partition("=")
        if not name.isidentifier() or not size.isdigit():
            raise ValueError(f"malformed shape key {shape_key!r}")
        dims.append((name, int(size)))
    return tuple(dims)


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
