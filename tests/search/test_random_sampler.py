"""FixedSpaceRandomSampler: uniform over the points the search would measure, one ask each."""

from __future__ import annotations

import collections

import optuna
from optuna.distributions import CategoricalDistribution

from autogen.search import random_sampler
from autogen.search.random_sampler import FixedSpaceRandomSampler

SPACE = {"a": CategoricalDistribution([1, 2, 4, 8]), "b": CategoricalDistribution(["x", "y", "z"])}


def proposals(skip, n: int = 600, seed: int = 5) -> list[dict]:
    sampler = FixedSpaceRandomSampler(SPACE, seed=seed)
    sampler.skip = skip
    study = optuna.create_study(sampler=sampler)
    asked = []
    for _ in range(n):
        trial = study.ask(SPACE)
        asked.append(trial.params)
        study.tell(trial, 1.0)
    return asked


def test_skipped_points_are_never_proposed_and_the_others_evenly():
    skip = lambda params: params["b"] == "x" or params["a"] == 8  # noqa: E731  (6 of 12 points left)
    asked = proposals(skip)
    assert not any(skip(p) for p in asked)
    counts = collections.Counter((p["a"], p["b"]) for p in asked)
    assert len(counts) == 6 and min(counts.values()) > 600 / 6 * 0.6  # every one, none starved


def test_a_seed_reproduces_the_proposals():
    skip = lambda params: params["a"] == 1  # noqa: E731
    assert proposals(skip, 50) == proposals(skip, 50)
    assert proposals(skip, 50) != proposals(skip, 50, seed=6)


def test_with_every_point_skipped_optuna_still_proposes(monkeypatch):
    monkeypatch.setattr(random_sampler, "MAX_DRAWS", 20)  # each ask gives up after 20 draws
    assert len(proposals(lambda params: True, 10)) == 10


def test_without_the_hook_it_is_optunas_random_sampler():
    sampler = FixedSpaceRandomSampler(SPACE, seed=1)
    study = optuna.create_study(sampler=sampler)
    assert sampler.infer_relative_search_space(study, None) == {}
    assert len(proposals(None, 20)) == 20
