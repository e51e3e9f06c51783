"""The package's layers, held: which part of autogen may import which, how deep the imports run,
how long a module may grow, and that no core module names a family (design: docs/architecture.md).

Read from the sources with ast (nothing is imported), so it runs anywhere in a second."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
PACKAGE = ROOT / "autogen"

BASE = {"autogen.errors", "autogen.paths", "autogen.notes", "autogen.report", "autogen._version"}
# The package's faces: what a user imports (autogen, autogen.family, python -m autogen). They
# may import any part; no part imports them.
FACES = {"autogen", "autogen.family", "autogen.__main__"}
# part -> the parts it may import (besides itself and the base modules)
ALLOWED = {
    "base": set(),
    "core": set(),
    "gpu": {"core"},
    "catalog": {"core"},
    "families": {"core", "gpu"},
    "testing": {"core", "gpu", "catalog"},
    "search": {"core", "gpu", "catalog"},
    "distributed": {"core", "gpu", "catalog", "search"},
    "runtime": {"core", "gpu", "catalog"},
    "export": {"core", "gpu", "catalog"},
    "torch": {"core", "gpu", "catalog", "runtime"},
    "cli": {"core", "gpu", "catalog", "search", "distributed", "runtime", "export", "torch"},
}
MAX_LEVELS = 8
MAX_LINES = 450
# Libraries whose import costs a fast path (the CLI's help and warm answer, the dispatcher's first
# call) real time: a function-level import of an autogen module is there to keep one of these off
# its importer's path, or it goes to the top of the file.
HEAVY = {"cupy", "optuna", "jinja2", "sqlalchemy", "alembic", "tuning_db", "torch", "numpy", "tqdm"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def part_of(module: str) -> str:
    if module in BASE:
        return "base"
    if module in FACES:
        return "face"
    return module.split(".")[1]


def imported(module: str, top_level_only: bool) -> set[str]:
    """The autogen modules `module` imports (at its top level, or anywhere in it)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{module}: relative import (autogen's imports are absolute)"
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if candidate in MODULES else node.module)
    return {name for name in found if name in MODULES and name != module}


def external_top_level(module: str) -> set[str]:
    """The top-level packages outside autogen that `module` imports at its top level."""
    found = set()
    for node in ast.parse(MODULES[module].read_text()).body:
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module.split(".")[0])
    return found - {"autogen"}


@functools.lru_cache(maxsize=None)
def heavy_on_import(module: str) -> frozenset[str]:
    """The heavy libraries importing `module` brings (its top-level imports, transitively)."""
    heavy = external_top_level(module) & HEAVY
    for target in imported(module, top_level_only=True):
        heavy |= heavy_on_import(target)
    return frozenset(heavy)


def lazy_imports(module: str):
    """(line, target) for each autogen module imported inside a function of `module` (imports
    under `if TYPE_CHECKING:` name types only and are not counted)."""
    tree = ast.parse(MODULES[module].read_text())
    type_only = {id(n) for block in tree.body if isinstance(block, ast.If)
                 and getattr(block.test, "id", "") == "TYPE_CHECKING" for n in ast.walk(block)}
    top = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        if id(node) in top or id(node) in type_only or not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                 else [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in MODULES else node.module
                       for alias in node.names])
        for name in sorted(set(names)):
            if name in MODULES:
                yield node.lineno, name


def test_a_lazy_import_keeps_a_heavy_library_off_its_importers_path():
    needless = [f"{module}:{line} imports {target} inside a function; it brings no heavy library "
                f"{module} does not already import: move it to the top"
                for module in MODULES for line, target in lazy_imports(module)
                if not heavy_on_import(target) - heavy_on_import(module)
                and module not in closure(target)]  # a cycle (the target imports this module) may stay
    assert not needless, "\n".join(needless)


@functools.lru_cache(maxsize=None)
def closure(module: str) -> frozenset[str]:
    """`module` and every autogen module its top-level imports bring, transitively."""
    found = {module}
    for target in imported(module, top_level_only=True):
        found |= closure(target)
    return frozenset(found)


def test_every_part_imports_only_the_parts_below_it():
    upward = []
    for module in MODULES:
        part = part_of(module)
        if part == "face":
            continue
        for target in imported(module, top_level_only=False):
            other = part_of(target)
            if other == "face":
                upward.append(f"{module} imports the package face {target}")
            elif other not in ("base", part) and other not in ALLOWED[part]:
                upward.append(f"{module} ({part}) imports {target} ({other})")
    assert not upward, "\n".join(upward)


def test_no_module_outside_the_families_names_a_family():
    # The registry finds built-in families by importing the package's modules at run time.
    named = [f"{module} imports {target}" for module in MODULES if part_of(module) != "families"
             for target in imported(module, top_level_only=False) if target.startswith("autogen.families.")]
    assert not named, "\n".join(named)


def test_imports_run_at_most_eight_levels_deep():
    graph = {module: imported(module, top_level_only=True) for module in MODULES}

    @functools.lru_cache(maxsize=None)
    def levels(module: str) -> int:
        return 1 + max((levels(target) for target in graph[module]), default=0)

    deepest = max(MODULES, key=levels)
    chain = [deepest]
    while graph[chain[-1]]:
        chain.append(max(graph[chain[-1]], key=levels))
    assert levels(deepest) <= MAX_LEVELS, " -> ".join(chain)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_is_longer_than_it_can_be_read(module):
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{module} has {lines} lines (at most {MAX_LINES})"


def test_every_part_is_a_package_with_a_docstring():
    for part in ALLOWED:
        if part == "base":
            continue
        init = PACKAGE / part / "__init__.py"
        if part == "torch" and not init.exists():
            continue
        assert ast.get_docstring(ast.parse(init.read_text())), f"autogen/{part}/__init__.py says what the part is"
