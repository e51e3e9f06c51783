"""The peer's library is imported while the search measures (autogen.gpu.evaluator), not after it."""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap

import pytest

from autogen.core.registry import all_families, get_family
from autogen.gpu.evaluator import import_in_background


def test_a_module_is_imported_on_a_thread_of_its_own(tmp_path, monkeypatch):
    (tmp_path / "slow_peer_library.py").write_text(textwrap.dedent("""
        import threading
        IMPORTED_ON = threading.current_thread().name
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "slow_peer_library", raising=False)
    thread = import_in_background(("slow_peer_library",))
    thread.join(timeout=30)
    assert not thread.is_alive() and thread.daemon
    assert sys.modules["slow_peer_library"].IMPORTED_ON == "autogen-peer-imports"


def test_a_missing_module_is_left_to_the_peer_and_nothing_is_started_without_modules():
    thread = import_in_background(("no_such_module_for_autogen_peers", "json"))
    thread.join(timeout=30)
    assert not thread.is_alive()  # it ended quietly; the peer's own import reports the error
    assert import_in_background(()) is None


def _code_of(function) -> str:
    """A function's code without its docstring (which may name torch as the peer it is not)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    body = tree.body[0].body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        tree.body[0].body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


@pytest.mark.parametrize("name", all_families())
def test_a_family_whose_peer_uses_torch_says_so(name):
    family = get_family(name)
    assert ("torch" in _code_of(type(family).peer)) == ("torch" in family.peer_imports)
