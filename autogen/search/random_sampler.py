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
        if not search_space:
            return {}
        for _ in range(MAX_DRAWS):
            point = {name: self._draws.choice(dist.choices) for name, dist in search_space.items()}
            if not self.skip(point):
                return point
        return {}
