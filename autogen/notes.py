"""Notes autogen prints once per process on stderr: things it could not do and did without."""

from __future__ import annotations

import sys
import threading

_said: set = set()
_lock = threading.Lock()


def note_once(key: object, message: str) -> bool:
    """Print ``autogen: note: message`` on stderr the first time ``key`` is seen; True if printed."""
    with _lock:
        if key in _said:
            return False
        _said.add(key)
    print(f"autogen: note: {message}", file=sys.stderr, flush=True)
    return True


def forget() -> None:
    """Let every note be said again (tests)."""
    with _lock:
        _said.clear()
