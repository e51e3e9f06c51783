"""A built-in family is one module and one templates folder under its name, short enough to read:
what several families share lives in a private autogen/families/_*.py, never in another family's
module (issue 35: no module over 450 lines; a new family = one module + one templates folder)."""

from __future__ import annotations

import ast
from pathlib import Path

import autogen
from autogen.core.registry import BUILTIN_PACKAGE, all_families
from autogen.paths import templates_dir

PACKAGE = Path(autogen.__file__).resolve().parent
FAMILIES = PACKAGE / "families"
BUILTINS = {name: family for name, family in all_families(include_plugins=False).items()
            if family.module.startswith(BUILTIN_PACKAGE + ".")}


def test_each_built_in_family_is_its_module_and_its_templates_folder():
    for name, family in BUILTINS.items():
        assert family.module == f"{BUILTIN_PACKAGE}.{name}"
        assert (templates_dir() / name / "kernel.cu.j2").is_file(), name


def test_no_family_module_imports_another_familys_module():
    for path in FAMILIES.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(BUILTIN_PACKAGE + "."):
                imported = node.module.rsplit(".", 1)[1]
                assert imported not in BUILTINS, f"{path.name} imports the family module {node.module}"
