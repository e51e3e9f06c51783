"""Search spaces: named parameters with finite choices, and constraints between them.

Every parameter set that reaches a template passes through Space.check first, so nothing read
from a command line or a database can inject code into a kernel source.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping

from .errors import InvalidConfigError
from .problem import Config

# A constraint returns None when the parameters are compatible, else the reason they are not.
Constraint = Callable[[Mapping[str, int | str]], "str | None"]


@dataclass(frozen=True)
class Param:
    name: str
    choices: tuple[int | str, ...]
    abbrev: str  # prefix in the procedural kernel name: "tpr" -> "tpr4"
    help: str = ""


@dataclass(frozen=True)
class Space:
    params: tuple[Param, ...]
    constraints: tuple[Constraint, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def violations(self, params: Mapping[str, int | str]) -> list[str]:
        """Every reason `params` is not a valid point (empty list: valid)."""
        problems = []
        unknown = sorted(set(params) - set(self.names))
        if unknown:
            problems.append(f"unknown parameter(s) {', '.join(unknown)}")
        for p in self.params:
            if p.name not in params:
                problems.append(f"missing parameter {p.name}")
            elif not _is_choice(params[p.name], p.choices):
                problems.append(f"{p.name}={params[p.name]!r} is not one of {list(p.choices)}")
        if problems:
            return problems  # constraints assume complete, well-typed params
        return [reason for c in self.constraints if (reason := c(params))]

    def check(self, params: Mapping[str, int | str]) -> Config:
        """Return the Config for valid params in space order; raise InvalidConfigError otherwise."""
        problems = self.violations(params)
        if problems:
            raise InvalidConfigError("invalid config: " + "; ".join(problems))
        return Config(tuple((p.name, params[p.name]) for p in self.params))

    def enumerate(self) -> Iterator[Config]:
        """Every valid point, in a stable order."""
        for values in itertools.product(*(p.choices for p in self.params)):
            params = dict(zip(self.names, values))
            if not self.violations(params):
                yield Config(tuple(params.items()))

    def size(self) -> int:
        return sum(1 for _ in self.enumerate())


def _is_choice(value: object, choices: tuple) -> bool:
    # bool is an int subclass; True must not pass for 1. Types must match exactly.
    return any(type(value) is type(c) and value == c for c in choices)
