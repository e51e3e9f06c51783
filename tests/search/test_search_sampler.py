"""FixedSpaceTPESampler: TPE never proposes a point the search would skip, while it has others."""

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
