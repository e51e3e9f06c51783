"""The family registry: adding a family is one line here plus its module and template."""

from __future__ import annotations

from ..errors import UsageError
from .base import Family, Launch, Peer
from .sgemv import Sgemv

FAMILIES: dict[str, Family] = {family.name: family for family in (Sgemv(),)}


def get_family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise UsageError(f"unknown family {name!r}; known: {', '.join(sorted(FAMILIES))}") from None


__all__ = ["FAMILIES", "Family", "Launch", "Peer", "get_family"]
