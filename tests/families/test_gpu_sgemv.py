"""sgemv on a real GPU: every variant of the space validates on awkward shapes; a short tune
stores a winner that validates again."""

from __future__ import annotations

import pytest

from autogen.gpu.compile import compile_many
from autogen.core.registry import get_family
from autogen.core.render import render

pytestmark = pytest.mark.gpu

SHAPES = [(16384, 16), (1000, 37), (3, 5), (1, 1)]


@pytest.fixture(scope="module")
def all_cubins():
    from autogen.gpu.device import device_identity

    family = get_family("sgemv")
    configs = {family.kernel_name("float32", c): c for c in family.space.enumerate()}
    sources = {name: render(family, "float32", c) for name, c in configs.items()}
    cubins = compile_many(sources, device_identity().arch)
    return configs, cubins


def test_every_variant_compiles_with_nvrtc(all_cubins):
    configs, cubins = all_cubins
    failures = {name: str(c) for name, c in cubins.items() if not isinstance(c, bytes)}
    assert not failures
    assert len(cubins) == len(configs) == get_family("sgemv").space.size()


@pytest.mark.parametrize("m,n", SHAPES)
def test_every_variant_validates(all_cubins, m, n):
    from autogen.gpu.evaluator import Evaluator, WorkSpec

    configs, cubins = all_cubins
    evaluator = Evaluator(WorkSpec("sgemv", "float32", (("m", m), ("n", n))))
    failures = []
    for name, config in configs.items():
        check = evaluator.check(name, cubins[name], config.as_dict())
        if not check.ok:
            failures.append(f"{name}: {check.reason}")
    assert not failures, f"{len(failures)} variants failed on {m}x{n}:\n" + "\n".join(failures[:20])


def test_validation_catches_a_wrong_kernel():
    # A kernel that skips the last row must fail validation (the poisoned output shows it).
    from autogen.gpu.compile import compile_cubin
    from autogen.gpu.device import device_identity
    from autogen.gpu.evaluator import Evaluator, WorkSpec

    family = get_family("sgemv")
    config = family.default_config()
    name = family.kernel_name("float32", config)
    broken = render(family, "float32", config).replace("row_live[r] = row < m;", "row_live[r] = row < m - 1;")
    cubin = compile_cubin(broken, device_identity().arch)
    evaluator = Evaluator(WorkSpec("sgemv", "float32", (("m", 1000), ("n", 37))))
    check = evaluator.check(name, cubin, config.as_dict())
    assert not check.ok and "NaN" in check.reason


def test_short_tune_stores_a_winner_that_validates(db_url):
    from tuning_db import TuningDB

    from autogen.gpu.compile import compile_cubin
    from autogen.search.tuner import TuneOptions, tune
    from autogen.gpu.evaluator import Evaluator, WorkSpec

    family = get_family("sgemv")
    problem = family.problem(m=4099, n=70)
    result = tune(problem, TuneOptions(trials=8, db_url=db_url, workers=4))
    assert result.winner is not None and result.measured >= 1
    stored = TuningDB(db_url).winner(result.device, "sgemv", "float32", problem.shape_key)
    assert stored is not None and stored.trial.kernel_name == result.winner.trial.kernel_name
    assert stored.peer_name and stored.peer_time_us > 0
    config = family.space.check(stored.trial.params)
    cubin = compile_cubin(render(family, "float32", config), result.device.arch)
    evaluator = Evaluator(WorkSpec("sgemv", "float32", problem.dims))
    assert evaluator.check(stored.trial.kernel_name, cubin, config.as_dict()).ok
