"""FixedSpaceTPESampler: TPE never proposes a point the search would skip, while it has others; while
TPE starts, its points are ones the search would measure, near the seeds."""

from __future__ import annotations

import optuna
from optuna.distributions import CategoricalDistribution

from autogen.search.optuna_internals import FixedSpaceTPESampler

SPACE = {"a": CategoricalDistribution([1, 2, 4, 8]), "b": CategoricalDistribution(["x", "y", "z"])}


def objective(params: dict) -> float:
    # Best at a=8, b="x": the region TPE converges to, and the one the skip takes away.
    return (8 - params["a"]) + (0 if params["b"] == "x" else 3)


def run(skip) -> list[dict]:
    sampler = FixedSpaceTPESampler(SPACE, seed=1, multivariate=True, n_startup_trials=4)
    sampler.skip = skip
    study = optuna.create_study(sampler=sampler)
    proposals = []
    for _ in range(30):
        trial = study.ask(SPACE)
        proposals.append(trial.params)
        study.tell(trial, objective(trial.params))
    return proposals[4:]  # after the random start-up trials


def test_skipped_points_are_never_proposed_while_others_remain():
    skipped = lambda params: params["b"] == "x"  # noqa: E731
    assert all(p["b"] != "x" for p in run(skipped))
    assert any(p["b"] == "x" for p in run(None))  # without the skip TPE goes there


def test_when_every_point_is_skipped_tpe_still_proposes():
    assert len(run(lambda params: True)) == 26


def test_while_tpe_starts_its_points_are_measurable_and_near_the_seeds():
    # Nothing finished (as while a search's first variants compile): TPE is starting, where Optuna
    # would draw each parameter on its own. Every point is one the search would measure, one or
    # two parameters from a seed.
    space = {name: CategoricalDistribution(list(range(6))) for name in "abcd"}
    skipped = lambda params: params["a"] == params["b"] or params["c"] == 5  # noqa: E731
    seed = {"a": 0, "b": 1, "c": 2, "d": 3}
    for seeds in ([seed], []):
        sampler = FixedSpaceTPESampler(space, seed=1, multivariate=True, n_startup_trials=10)
        sampler.skip = skipped
        study = optuna.create_study(sampler=sampler)
        for s in seeds:
            study.enqueue_trial(s)
        asked = [study.ask(space).params for _ in range(40)][len(seeds):]
        assert not any(skipped(p) for p in asked)
        near = [sum(p[name] != seed[name] for name in space) <= 2 for p in asked]
        assert all(near) if seeds else not all(near)  # without seeds: uniform among the measurable
