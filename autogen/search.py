"""The Optuna side of tuning: one categorical per parameter, samplers, resume and warm start.

Our database is the single source of truth: a study lives in memory and is rebuilt from the
stored trials of the same problem, so running the same command again continues where it stopped.
"""

from __future__ import annotations

import logging

import optuna
from optuna.distributions import CategoricalDistribution

from .errors import UsageError
from .space import Space

SAMPLERS = ("tpe", "random", "exhaustive")
# Told to Optuna for rejected or failed variants: worse than any real time, still finite.
PENALTY_US = 1e9

optuna.logging.set_verbosity(logging.WARNING)


def distributions(space: Space) -> dict[str, CategoricalDistribution]:
    return {p.name: CategoricalDistribution(p.choices) for p in space.params}


def make_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    if name == "tpe":
        # multivariate: parameters interact (vector width x threads per row);
        # constant_liar: several trials are in flight while the compile pool works ahead.
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True,
                                          n_startup_trials=10)
    if name in ("random", "exhaustive"):
        # exhaustive enqueues every valid point first (see create_study); random serves the rest
        return optuna.samplers.RandomSampler(seed=seed)
    raise UsageError(f"unknown sampler {name!r}; choose one of {', '.join(SAMPLERS)}")


def create_study(space: Space, sampler: str, seed: int | None, measured: dict[str, tuple[dict, float]],
                 seeds: list[dict], exhaustive_points: list[dict]) -> optuna.Study:
    """A study that already knows `measured` (kernel name -> (params, value)) and will try
    `seeds` (warm start) and then `exhaustive_points` before asking its sampler."""
    study = optuna.create_study(direction="minimize", sampler=make_sampler(sampler, seed))
    dists = distributions(space)
    for params, value in measured.values():
        study.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=value))
    known = {_key(params) for params, _ in measured.values()}
    for params in seeds + exhaustive_points:
        if _key(params) not in known:
            study.enqueue_trial(params)
            known.add(_key(params))
    return study


def _key(params: dict) -> tuple:
    return tuple(sorted(params.items()))
