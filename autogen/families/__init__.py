"""The family registry: adding a family is one line here plus its module and template."""

from __future__ import annotations

from ..errors import UsageError
from .base import Family, Launch, Peer, Step
from .reduce import Reduce
from .sgemv import Sgemv
from .softmax import Softmax

FAMILIES: dict[str, Family] = {family.name: family for family in (Sgemv(), Reduce(), Softmax())}


def get_family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise UsageError(f"unknown family {name!r}; known: {', '.join(sorted(FAMILIES))}") from None


def register(family: Family) -> Family:
    """Add a family (used by the one line per family above, and by test-only families)."""
    FAMILIES[family.name] = family
    return family


__all__ = ["FAMILIES", "Family", "Launch", "Peer", "Step", "get_family", "register"]
