"""A GPU worker rehearses its problem's checks while it waits for its first variant
(autogen.gpu.measure.rehearse_checks, Evaluator.prepare): every family's checks can be rehearsed,
and after the rehearsal the first real check compiles nothing more."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from autogen.core.registry import all_families
from autogen.gpu.measure import rehearse_checks
from conftest import checkout_env

# Small problems of every built-in family (the rehearsal's work is the checks' own, whatever the size).
SMALL_DIMS = 64


def _small_problem(family):
    dims = {name: min(size, SMALL_DIMS) if isinstance(size, int) else size
            for name, size in (family.example_dims or {d: SMALL_DIMS for d in family.dims}).items()}
    return family.problem(None, **dims)


@pytest.mark.parametrize("name", sorted(all_families(include_plugins=False)))
def test_every_family_s_checks_can_be_rehearsed_without_a_kernel(name):
    family = all_families(include_plugins=False)[name]
    problem = _small_problem(family)
    made: list = []
    make_inputs = family.make_inputs

    def counted(*args, **kwargs):
        made.append(args)
        return make_inputs(*args, **kwargs)

    family.make_inputs = counted  # an instance attribute: this test's family object only
    try:
        rehearse_checks(family, problem, np, np.random.default_rng(0))
    finally:
        del family.make_inputs
    assert len(made) == len(family.validation_cases(problem))  # every case rehearsed, none raised


FIRST_CHECK = r"""
import json, os, sys
from autogen.core.registry import get_family
from autogen.core.render import render
from autogen.gpu.compile import compile_cubin
from autogen.gpu.evaluator import Evaluator, Serve, WorkSpec

family = get_family(sys.argv[1])
rehearsed_problem, checked_problem = (family.problem(sys.argv[2], **json.loads(dims)) for dims in sys.argv[3:5])
evaluator = Evaluator(WorkSpec.of(rehearsed_problem))
cache = os.environ["CUPY_CACHE_DIR"]
count = lambda: sum(len(files) for _root, _dirs, files in os.walk(cache))
before = count()
evaluator.prepare()
rehearsed = count()
if checked_problem != rehearsed_problem:  # a kept worker taking up another problem
    evaluator.serve(Serve(WorkSpec.of(checked_problem)))
config = family.default_config(checked_problem)
name = family.kernel_name(checked_problem.dtype, config, checked_problem.traits)
source = render(family, checked_problem.dtype, config, traits=checked_problem.traits)
outcome = evaluator.evaluate(name, compile_cubin(source, evaluator.device.arch, sys.argv[5]), config.as_dict())
print(json.dumps({"before": before, "rehearsed": rehearsed, "after": count(), "status": outcome.status,
                  "reason": outcome.reason}))
"""


@pytest.mark.gpu
@pytest.mark.parametrize("family, dtype, rehearsed, checked", [
    ("sgemv", "float32", {"m": 4096, "n": 128}, {"m": 4096, "n": 128}),
    # A problem checked on the host is rehearsed on the device all the same: the worker kept for
    # a later, larger problem of the family has compiled its checks.
    ("sgemv", "float32", {"m": 64, "n": 16}, {"m": 16384, "n": 1024}),
    ("softmax", "float16", {"rows": 32, "cols": 128256}, {"rows": 32, "cols": 128256}),
])
def test_after_the_rehearsal_the_first_check_compiles_nothing(tmp_path, family, dtype, rehearsed, checked):
    env = {**checkout_env(), "CUPY_CACHE_DIR": str(tmp_path / "cupy")}
    done = subprocess.run([sys.executable, "-c", FIRST_CHECK, family, dtype, json.dumps(rehearsed), json.dumps(checked),
                           str(tmp_path / "kernels")], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert counts["status"] == "ok", counts["reason"]
    assert counts["rehearsed"] > counts["before"]  # the rehearsal compiled the checks' kernels...
    assert counts["after"] == counts["rehearsed"]  # ...so the first real check compiled none
