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


FIRST_TIMING = r"""
import json, sys
from autogen.core.registry import get_family
from autogen.core.render import render
from autogen.gpu.compile import compile_cubin
from autogen.gpu.evaluator import Evaluate, Evaluator, WorkSpec

family = get_family("sgemv")
type(family).peer_imports = ("torch",)  # this process's sgemv: a peer imported as the torch families' are
problem = family.problem("float32", m=16384, n=1024)
evaluator = Evaluator(WorkSpec.of(problem))
config = family.default_config(problem)
name = family.kernel_name(problem.dtype, config, problem.traits)
cubin = compile_cubin(render(family, problem.dtype, config), evaluator.device.arch, sys.argv[1])
first = evaluator.serve(Evaluate(name, cubin, config.as_dict()))  # starts the import, then measures
waited = evaluator.spent_s.get("peer_imports", 0.0)
again = evaluator.serve(Evaluate(name, cubin, config.as_dict()))
median = lambda outcome: sorted(outcome.samples_us)[len(outcome.samples_us) // 2]
print(json.dumps({"first": median(first), "again": median(again), "waited": waited,
                  "statuses": [first.status, again.status]}))
"""


@pytest.mark.gpu
def test_a_variant_measured_while_the_peer_imports_is_timed_after_the_import(tmp_path):
    """PyTorch's import, running on the worker's thread while the first variants were timed, made
    them measure several times their time (docs/internals.md): timing waits for it."""
    import json
    import subprocess

    from conftest import checkout_env, gpu_unavailable_reason

    if gpu_unavailable_reason():
        pytest.skip(gpu_unavailable_reason())
    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, "-c", FIRST_TIMING, str(tmp_path / "kernels")], env=checkout_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["statuses"] == ["ok", "ok"]
    assert result["waited"] > 0.2  # the import was still running when the first variant was timed
    assert result["first"] < 1.05 * result["again"], result  # timed during the import, it was over this
