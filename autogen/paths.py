"""Where autogen keeps its files, and the one way it writes them.

Every cache lives under cache_root(): $XDG_CACHE_HOME/autogen (default ~/.cache/autogen). The
kernel binaries may be moved elsewhere with $AUTOGEN_CACHE_DIR. Files are written whole or not at
all (write to a temporary file beside the target, then rename), so a reader, another process or a
crash never sees half a file, and a rename never follows a symlink at the target.
"""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "autogen"


def kernel_cache_dir() -> Path:
    """Compiled kernels, keyed by source, options, architecture and NVRTC version."""
    configured = os.environ.get("AUTOGEN_CACHE_DIR")
    return Path(configured) if configured else cache_root() / "kernels"


@functools.lru_cache(maxsize=1)
def templates_dir() -> Path:
    """The folder holding the *.cu.j2 templates (found once: every render asks for it).

    In an installed wheel they sit in autogen/templates (pyproject maps the top-level templates/
    there); in a source checkout they sit beside the autogen package.
    """
    here = Path(__file__).resolve().parent
    for candidate in (here / "templates", here.parent / "templates"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"autogen templates not found next to {here}")


def installed_file(package: str) -> str | None:
    """The file of an installed top-level package (its __init__.py), located without importing
    it; None where it is not installed."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None else None


def file_state(path: str | None) -> list | None:
    """Where `path` leads now and what is there (real path, inode, size, time): an install,
    an upgrade or a re-pointed symlink changes it; None where nothing is."""
    if not path:
        return None
    try:
        found = os.stat(path)
    except OSError:
        return None
    return [os.path.realpath(path), found.st_ino, found.st_size, found.st_mtime_ns]


def write_atomically(path: Path, data: bytes | str, mode: int = 0o644) -> Path:
    """Replace `path` with `data` in one step; the folder is created if missing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data.encode() if isinstance(data, str) else data)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path
