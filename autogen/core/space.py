"""Search spaces: named parameters with finite choices, and constraints between them.

Every parameter set that reaches a template passes through Space.check first, so nothing read
from a command line or a database can inject code into a kernel source.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping

from autogen.core.problem import Config
from autogen.errors import InvalidConfigError

# A constraint returns None when the parameters are compatible, else the reason they are not.
Constraint = Callable[[Mapping[str, int | str]], "str | None"]


@dataclass(frozen=True)
class Param:
    name: str
    choices: tuple[int | str, ...]
    abbrev: str  # prefix in the procedural kernel name: "tpr" -> "tpr4"
    help: str = ""
    # For a parameter added after a family's winners were stored: the choice that renders the code
    # those winners were measured with. A stored point lacking the parameter takes it (Space.complete),
    # and a point at this choice keeps the kernel name it had (the parameter is left out of it), so
    # the trials, winners and shipped catalog of the older autogen stay valid and servable.
    # None: the parameter is required (every parameter a family was born with).
    added_with_default: int | str | None = None

    def __post_init__(self):
        if self.added_with_default is not None and not _is_choice(self.added_with_default, self.choices):
            raise ValueError(f"{self.name}: added_with_default={self.added_with_default!r} "
                             f"is not one of {list(self.choices)}")

    def named_in_kernel(self, value: int | str) -> bool:
        """Whether `value` appears in the kernel name (not the added parameter's old behaviour)."""
        return self.added_with_default is None or value != self.added_with_default


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

    def complete(self, params: Mapping[str, int | str]) -> dict[str, int | str]:
        """`params` with each parameter added after it was stored set to the choice that renders
        the code it was measured with (Param.added_with_default); other gaps are left for
        violations to name."""
        filled = dict(params)
        for p in self.params:
            if p.name not in filled and p.added_with_default is not None:
                filled[p.name] = p.added_with_default
        return filled

    def stored_point(self, params: object) -> dict[str, int | str] | None:
        """A point read back from the database (a trial, a winner, a claim), completed; None when
        it is malformed or no longer fits the space (an older or newer autogen's)."""
        if not isinstance(params, Mapping):
            return None
        params = self.complete(params)
        return None if self._problems(params) else params

    def digest(self) -> str:
        """8 hex digits naming the parameters and their choices, in order (what Optuna's
        distributions of the space hold; the constraints are not in it)."""
        described = json.dumps([[p.name, list(p.choices)] for p in self.params])
        return hashlib.sha256(described.encode()).hexdigest()[:8]

    def violations(self, params: Mapping[str, int | str]) -> list[str]:
        """Every reason `params` is not a valid point (empty list: valid); a stored point from
        before a parameter was added is completed first (see complete)."""
        return self._problems(self.complete(params))

    def _problems(self, params: Mapping[str, int | str]) -> list[str]:
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
        params = self.complete(params)
        problems = self._problems(params)
        if problems:
            raise InvalidConfigError("invalid config: " + "; ".join(problems))
        return Config(tuple((p.name, params[p.name]) for p in self.params))

    def enumerate(self) -> Iterator[Config]:
        """Every valid point, in a stable order."""
        return iter(_valid_points(self))

    def size(self) -> int:
        return len(_valid_points(self))


@functools.lru_cache(maxsize=16)
def _valid_points(space: Space) -> tuple[Config, ...]:
    """Space.enumerate's points, found once per space: a large space's product holds hundreds of
    thousands of points. Each of them holds every parameter at one of its choices, so only the
    constraints can reject it (checking the choices again cost most of the enumeration)."""
    constraints = space.constraints
    choices = [[(p.name, choice) for choice in p.choices] for p in space.params]
    points = []
    for items in itertools.product(*choices):  # the points share their (name, choice) pairs
        params = dict(items)
        if not any(constraint(params) for constraint in constraints):
            points.append(Config(items))
    return tuple(points)


def _is_choice(value: object, choices: tuple) -> bool:
    # bool is an int subclass; True must not pass for 1. Types must match exactly.
    return any(type(value) is type(c) and value == c for c in choices)
