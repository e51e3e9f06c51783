"""The hash of a variant's rendered source, remembered between commands.

The stale check of a stored winner (autogen.catalog.environment) compares the hash of its source as this
autogen renders it with the hash stored with its timing. Rendering takes Jinja2, whose import and
the template's loading were a noticeable share of `autogen tune` answered from the database
(docs/history/sessions.md, tenth session). The hash is a function of the rendering code and templates and of the variant,
so it is kept under a fingerprint of everything a rendering reads:
  * every autogen module (a family's template_vars and the shared pieces they call);
  * the family's own module and the Python files beside it (a user's family), and every template
    in the folders its templates are looked up in;
  * Jinja2's installed package (its version decides whitespace and filters);
  * and, in each variant's key, what else the family says its rendering reads
    (Family.rendering_inputs: a family made from source text, its text).
Any change to those gives another fingerprint; the memo keeps the last few fingerprints' hashes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
from pathlib import Path

from autogen.paths import cache_root, file_state, installed_file, write_atomically

MEMO_VERSION = 1


def rendered_source_hash(family, dtype: str, config, traits: tuple[tuple[str, str], ...]) -> str:
    """render.source_hash(render(family, dtype, config, traits=traits), family.compiler_options),
    from the memo where this rendering code and these templates have rendered it before."""
    fingerprint = rendering_fingerprint(family.module, tuple(str(folder) for folder in family.template_dirs()))
    options = [list(family.compiler_options)] if family.compiler_options else []  # none: the key as before
    text = family.rendering_inputs()  # a family made from source text: that text ("" keeps the key)
    extra = options + ([hashlib.sha256(text.encode()).hexdigest()] if text else [])
    key = hashlib.sha256(json.dumps([family.name, dtype, sorted(config.params), list(traits)] + extra,
                                    default=str).encode()).hexdigest()
    known = _read().get(fingerprint, {})
    if key in known:
        return known[key]
    from autogen.core.render import render, source_hash

    value = source_hash(render(family, dtype, config, traits=traits), family.compiler_options)
    _remember(fingerprint, key, value)
    return value


# Fingerprints kept in the memo: this autogen's families, a user's families, and a few recent
# versions of them (switching between checkouts), the newest last.
KEPT_FINGERPRINTS = 8


def rendering_fingerprint(module: str, template_folders: tuple[str, ...]) -> str:
    """The hash of everything a rendering of the family in `module` reads; the files' contents
    are read again only when one's size or time has changed (a long session may edit them)."""
    package = Path(__file__).resolve().parent.parent  # the whole autogen package
    files = sorted(package.rglob("*.py"))
    family_file = getattr(sys.modules.get(module), "__file__", None)
    if family_file:
        files += sorted(Path(family_file).resolve().parent.glob("*.py"))
    for folder in template_folders:
        files += sorted(Path(folder).rglob("*.j2"))
    states = tuple((str(path), found.st_size, found.st_mtime_ns) for path, found in ((p, p.stat()) for p in files))
    jinja2 = file_state(installed_file("jinja2"))  # located, not imported
    return _contents_hash(states, tuple(jinja2) if jinja2 else None)


@functools.lru_cache(maxsize=64)
def _contents_hash(states: tuple, jinja2_state: tuple | None) -> str:
    digest = hashlib.sha256(f"source-memo-{MEMO_VERSION}\0{jinja2_state!r}\0".encode())
    for path, _size, _time in states:
        digest.update(path.encode() + b"\0" + Path(path).read_bytes() + b"\0")
    return digest.hexdigest()


def _memo_path() -> Path:
    return cache_root() / "source_hashes.json"


def _read() -> dict:
    """fingerprint -> {variant key -> source hash}; {} where there is no usable memo."""
    try:
        memo = json.loads(_memo_path().read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(memo, dict) or memo.get("version") != MEMO_VERSION:
        return {}
    by_fingerprint = memo.get("by_fingerprint")
    if not isinstance(by_fingerprint, dict):
        return {}
    return {fingerprint: hashes for fingerprint, hashes in by_fingerprint.items() if isinstance(hashes, dict)}


def _remember(fingerprint: str, key: str, value: str) -> None:
    by_fingerprint = _read()
    hashes = {**by_fingerprint.pop(fingerprint, {}), key: value}
    kept = list(by_fingerprint.items())[-(KEPT_FINGERPRINTS - 1):] + [(fingerprint, hashes)]
    try:
        write_atomically(_memo_path(), json.dumps({"version": MEMO_VERSION, "by_fingerprint": dict(kept)}))
    except OSError:  # a cache that cannot be written is only slower
        pass
