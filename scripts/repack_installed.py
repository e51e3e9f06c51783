"""Repack installed distributions as wheels, for an install where no package index can be reached.

Usage: python3 scripts/repack_installed.py OUT_DIR REQUIREMENT [REQUIREMENT ...]

Walks the requirements (extras and environment markers honoured) through the distributions this
interpreter has installed and writes each one reached as a wheel of the files its RECORD lists:
the files pip installed from the index, so `pip install --no-index --find-links OUT_DIR ...` in a
fresh virtual environment lays out what an install from the index would. The GPU machine has no
network (scripts/driver_only_install.sh uses this there); a missing distribution is an error.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import sys
import zipfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.tags import sys_tags
from packaging.utils import canonicalize_name


def reached(roots: list[str]) -> dict[str, metadata.Distribution]:
    """Every installed distribution the requirements reach, by canonical name."""
    found: dict[str, metadata.Distribution] = {}
    pending = [(Requirement(text), "") for text in roots]
    seen: set[tuple[str, str]] = set()
    while pending:
        requirement, extra = pending.pop()
        if requirement.marker and not requirement.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(requirement.name)
        for wanted in requirement.extras or {""}:
            if (name, wanted) in seen:
                continue
            seen.add((name, wanted))
            dist = found.get(name) or metadata.distribution(requirement.name)
            found[name] = dist
            pending += [(Requirement(text), wanted) for text in dist.requires or ()]
    return found


# Written by the installer, not shipped in a wheel (RECORD is written anew below). A vendored
# package's own dist-info (setuptools/_vendor/...) is deeper and is kept as it is.
INSTALL_TIME_FILES = ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json")


def wheel_tag(dist: metadata.Distribution) -> str:
    """The wheel's tag this interpreter accepts (a py2.py3 wheel lists py2 first)."""
    text = dist.read_text("WHEEL") or ""
    tags = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Tag:")]
    supported = {str(tag) for tag in sys_tags()}
    return next((tag for tag in tags if tag in supported), "py3-none-any")


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def repack(dist: metadata.Distribution, out: Path) -> Path:
    name = canonicalize_name(dist.metadata["Name"]).replace("-", "_")
    path = out / f"{name}-{dist.version}-{wheel_tag(dist)}.whl"
    record_name = None
    rows = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as wheel:
        for file in dist.files or ():
            posix = file.as_posix()
            if posix.startswith("..") or "__pycache__" in posix:  # scripts are made anew; bytecode too
                continue
            folder, _, base = posix.partition("/")
            if folder.endswith(".dist-info") and base in INSTALL_TIME_FILES:  # the install writes these
                if base == "RECORD":
                    record_name = posix
                continue
            data = Path(file.locate()).read_bytes()
            wheel.writestr(posix, data)
            rows.append((posix, record_hash(data), str(len(data))))
        if record_name is None:
            raise SystemExit(f"{dist.metadata['Name']} has no RECORD: cannot repack it")
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows(rows + [(record_name, "", "")])
        wheel.writestr(record_name, text.getvalue())
    return path


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for dist in reached(argv[1:]).values():
        print(repack(dist, out).name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
