"""FixedSpaceTPESampler: TPE never proposes a point the search would skip, while it has others."""

from __future__ import annotations

import numpy as np
import optuna
from optuna.distributions import CategoricalDistribution

from autogen.search.optuna_internals import REDRAWS, FixedSpaceTPESampler

SPACE = {"a": CategoricalDistribution([1, 2, 4, 8]), "b": CategoricalDistribution(["x", "y", "z"])}


def objective(params: dict) -> float:
    # Best at a=8, b="x": the region TPE converges to, and the one the skip takes away.
    return (8 - params["a"]) + (0 if params["b"] == "x" else 3)


def proposals(sampler, skip, asks: int) -> list[dict]:
    """The points a study with `sampler` (its skip set to `skip`) proposes in `asks` asks, each told
    the objective's value."""
    sampler.skip = skip
    study = optuna.create_study(sampler=sampler)
    proposed = []
    for _ in range(asks):
        trial = study.ask(SPACE)
        proposed.append(trial.params)
        study.tell(trial, objective(trial.params))
    return proposed


def run(skip) -> list[dict]:
    sampler = FixedSpaceTPESampler(SPACE, seed=1, multivariate=True, n_startup_trials=4)
    return proposals(sampler, skip, 30)[4:]  # after the random start-up trials


def test_skipped_points_are_never_proposed_while_others_remain():
    skipped = lambda params: params["b"] == "x"  # noqa: E731
    assert all(p["b"] != "x" for p in run(skipped))
    assert any(p["b"] == "x" for p in run(None))  # without the skip TPE goes there


def test_when_every_point_is_skipped_tpe_still_proposes():
    assert len(run(lambda params: True)) == 26


class ComputeEveryBatch(FixedSpaceTPESampler):
    """The straightforward form, for comparison: the acquisition of every batch before its
    candidates are judged, and every trial's parameters converted on every ask (Optuna's own)."""

    _get_internal_repr = optuna.samplers.TPESampler._get_internal_repr

    def _compute_acquisition_func(self, samples, mpe_below, mpe_above):
        values = optuna.samplers.TPESampler._compute_acquisition_func(self, samples, mpe_below, mpe_above)
        names = list(self._fixed_space)
        for _ in range(REDRAWS):
            skipped = np.array([self.skip({n: self._fixed_space[n].to_external_repr(samples[n][i]) for n in names})
                                for i in range(len(values))], dtype=bool)
            if not skipped.all():
                return np.where(skipped, -np.inf, values)
            fresh = mpe_below.sample(self._rng.rng, len(values))
            for n in names:
                samples[n][:] = fresh[n]
            values = optuna.samplers.TPESampler._compute_acquisition_func(self, samples, mpe_below, mpe_above)
        return values


def proposals_and_acquisitions(sampler_class, monkeypatch) -> tuple[list[dict], int]:
    """Proposals of a seeded search where one point in 12 is measured (most candidate batches all
    skipped), and how many acquisitions TPE computed."""
    computed = []
    original = optuna.samplers.TPESampler._compute_acquisition_func

    def counting(self, samples, below, above):
        computed.append(1)
        return original(self, samples, below, above)

    monkeypatch.setattr(optuna.samplers.TPESampler, "_compute_acquisition_func", counting)
    sampler = sampler_class(SPACE, seed=3, multivariate=True, n_startup_trials=4, n_ei_candidates=2)
    proposed = proposals(sampler, lambda params: not (params["a"] == 2 and params["b"] == "z"), 40)
    return proposed, len(computed)


def test_the_sampler_s_shortcuts_leave_tpe_s_proposals_as_they_were(monkeypatch):
    # No acquisition for a batch all skipped, and finished trials converted once: the same proposals.
    proposed, computed = proposals_and_acquisitions(FixedSpaceTPESampler, monkeypatch)
    reference, reference_computed = proposals_and_acquisitions(ComputeEveryBatch, monkeypatch)
    assert proposed == reference
    assert computed < reference_computed
