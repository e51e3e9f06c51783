"""Writing an export's files into --out: all or nothing, each atomically, never over files
autogen did not write (the folder's MANIFEST lists what it wrote, with hashes)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from autogen.errors import UsageError
from autogen.paths import write_atomically

# Lists what an export wrote into --out, with hashes: a later export may replace those files.
MANIFEST = ".autogen-export.json"
MAX_MANIFEST_BYTES = 1 << 20


def write_files(files: dict[str, str | bytes], out: Path, force: bool = False) -> tuple[Path, ...]:
    """Write every file into `out`, or nothing: all checks run before the first write. Each file
    is replaced atomically (a rename never follows a symlink at the target). A folder holding
    files autogen did not write is refused unless `force` (see _refuse_what_autogen_did_not_write);
    what was written is listed, with hashes, in the folder's MANIFEST."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a folder")
    root = out.resolve()  # "a/../b" is b: no folder "a" is made on the way
    for name in files:
        if Path(name).name != name or name == MANIFEST:
            raise UsageError(f"refusing to write {name!r}: export file names are plain names")
        target = root / name
        if target.is_symlink() and not target.resolve().is_relative_to(root):
            raise UsageError(f"refusing to write {out / name}: it is a symlink to {target.resolve()}, outside --out")
        if target.is_dir() and not target.is_symlink():
            raise UsageError(f"cannot write {out / name}: a folder is in the way")
    written_before = _manifest(root)
    if not force:
        _refuse_what_autogen_did_not_write(root, out, files, written_before)
    try:
        root.mkdir(parents=True, exist_ok=True)
        paths = tuple(write_atomically(root / name, text) for name, text in files.items())
        kept = {name: digest for name, digest in written_before.items()
                if name not in files and _digest(root / name) == digest}  # an earlier export's, unchanged
        listed = {**kept, **{name: _digest_text(text) for name, text in files.items()}}
        write_atomically(root / MANIFEST, json.dumps({"format": 1, "files": dict(sorted(listed.items()))},
                                                     indent=1) + "\n")
        return paths
    except OSError as exc:
        raise UsageError(f"cannot write the export into {out}: {exc.strerror or exc}") from None


def _refuse_what_autogen_did_not_write(root: Path, out: Path, files: dict[str, str | bytes],
                                       written_before: dict[str, str]) -> None:
    """UsageError unless every file the export would replace was written by an earlier export and
    is unchanged since (by its hash in the MANIFEST). A non-empty folder with no MANIFEST is
    another project's (`--out .` in a project root): refused whole. Beside an earlier export,
    files it did not name (a build's outputs) are left as they are."""
    if not root.is_dir():
        return
    present = sorted(p.name for p in root.iterdir() if p.name != MANIFEST)
    if not written_before:
        foreign = present
    else:
        foreign = [name for name in files if (root / name).is_symlink()
                   or ((root / name).exists() and _digest(root / name) != written_before.get(name))]
    if foreign:
        shown = ", ".join(foreign[:4]) + (f" and {len(foreign) - 4} more" if len(foreign) > 4 else "")
        what = "holds files autogen did not write" if not written_before else "holds files changed since autogen wrote them"
        raise UsageError(f"--out {out} {what} ({shown}); export into a new or empty folder, or pass --force "
                         "to replace autogen's file names there")


def _manifest(root: Path) -> dict[str, str]:
    """{file name: sha256} of what an earlier export wrote into `root`; {} when there is none
    or it cannot be read (the folder is then treated as not autogen's)."""
    path = root / MANIFEST
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_MANIFEST_BYTES:
            return {}
        listed = json.loads(path.read_bytes()).get("files")
    except (OSError, ValueError, AttributeError):
        return {}
    if not isinstance(listed, dict):
        return {}
    return {name: digest for name, digest in listed.items()
            if isinstance(name, str) and Path(name).name == name and isinstance(digest, str)}


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() and not path.is_symlink() else None
    except OSError:
        return None


def _digest_text(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()
