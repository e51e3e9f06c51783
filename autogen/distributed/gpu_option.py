"""`--gpus`: which GPUs of this machine a tune runs on."""

from __future__ import annotations

from autogen.errors import UsageError


def parse_gpus(text: str | None) -> tuple[int, ...] | str | None:
    """`--gpus`: "all", or device ordinals "0,1,3" (each once); None when not given."""
    if text is None:
        return None
    if text.strip() == "all":
        return "all"
    items = [item.strip() for item in text.split(",")]
    if not items or any(not item.isdigit() or not item.isascii() for item in items):
        raise UsageError(f"--gpus expects 'all' or device numbers separated by commas, like 0,1; got {text!r}")
    ordinals = tuple(int(item) for item in items)
    if len(set(ordinals)) != len(ordinals):
        raise UsageError(f"--gpus names a GPU twice: {text!r}")
    return ordinals


def resolve_gpus(gpus, count: int) -> tuple[int, ...] | None:
    """Ordinals to use, given how many GPUs this process sees."""
    if gpus is None:
        return None
    if gpus == "all":
        return tuple(range(count))
    missing = [g for g in gpus if g >= count]
    if missing:
        raise UsageError(f"--gpus {','.join(map(str, gpus))}: this machine has {count} GPU(s), numbered 0 to {count - 1}")
    return tuple(gpus)
