"""Random search over the points a search would measure.

Optuna's RandomSampler draws each parameter on its own, over the whole product of the choices.
Much of that product is invalid or pruned for a given shape, and the search rejects such a point
only after a whole ask and tell through Optuna: a large part of a trial's host time in a simulated
search (docs/distributed.md, "Random search drawing whole points"). This sampler
draws whole points itself, by rejection against the search's own test (the `skip` hook
FixedSpaceTPESampler has too), and hands Optuna the first one the search would measure: the same
uniform choice among those points, one ask per trial.
"""

from __future__ import annotations

import random
from typing import Callable

import optuna
from optuna.distributions import CategoricalDistribution

# Whole points drawn per ask before the sampler gives up and lets Optuna draw one (a spent or
# nearly spent space: the search's idle-ask limit then ends it).
MAX_DRAWS = 1000


class FixedSpaceRandomSampler(optuna.samplers.RandomSampler):
    """Uniform over the points of a fixed categorical space that `skip` (set by the search:
    SearchLoop._would_skip) lets through; without `skip`, Optuna's RandomSampler."""

    def __init__(self, space: dict[str, CategoricalDistribution], seed: int | None = None):
        super().__init__(seed=seed)
        self._fixed_space = dict(space)
        self._draws = random.Random(seed)
        self.skip: Callable[[dict], bool] | None = None

    def infer_relative_search_space(self, study, trial) -> dict:
        return dict(self._fixed_space) if self.skip is not None else {}

    def sample_relative(self, study, trial, search_space: dict) -> dict:
        return draw_measurable(search_space, self.skip, self._draws.choice)


def draw_measurable(search_space: dict[str, CategoricalDistribution], skip: Callable[[dict], bool] | None,
                    choose: Callable[[tuple], object]) -> dict:
    """A whole point of `search_space`, uniform among those `skip` lets through (drawn by
    rejection, each choice by `choose`); {} without `skip` or after MAX_DRAWS draws, where Optuna
    then draws one as it would."""
    if not search_space or skip is None:
        return {}
    for _ in range(MAX_DRAWS):
        point = {name: choose(dist.choices) for name, dist in search_space.items()}
        if not skip(point):
            return point
    return {}


def draw_near(known: list[dict], search_space: dict, skip, rng, draws: int = 1000) -> dict:
    """A point the search would measure (`skip` lets it through), one or two parameters away from a
    random one of `known` (the search's seeds); {} when none is found in `draws` tries."""
    names = list(search_space)
    for _ in range(draws if skip is not None else 0):
        point = dict(known[rng.randint(len(known))])
        for _ in range(1 + rng.randint(2)):
            name = names[rng.randint(len(names))]
            choices = search_space[name].choices
            point[name] = choices[rng.randint(len(choices))]
        if not skip(point):
            return point
    return {}
