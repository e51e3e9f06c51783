"""FixedSpaceTPESampler: TPE never proposes a point the search would skip, while it has others."""

from __future__ import annotations

import numpy as np
import optuna
from optuna.distributions import CategoricalDistribution

from types import SimpleNamespace

from autogen.search.loop import PENALTY_US, SearchLoop
from autogen.search.optuna_internals import GROUPS_PER_ASK, REDRAWS, FixedSpaceTPESampler

SPACE = {"a": CategoricalDistribution([1, 2, 4, 8]), "b": CategoricalDistribution(["x", "y", "z"])}


def objective(params: dict) -> float:
    # Best at a=8, b="x": the region TPE converges to, and the one the skip takes away.
    return (8 - params["a"]) + (0 if params["b"] == "x" else 3)


def proposals(sampler, skip, asks: int) -> list[dict]:
    """The points a study with `sampler` (its skip set to `skip`) proposes in `asks` asks, each told
    the objective's value, and those it proposed without an ask ({"unasked": point}), told as very
    slow, as the search tells a point it rejects."""
    sampler.skip = skip
    study = optuna.create_study(sampler=sampler)
    proposed = []
    for _ in range(asks):
        trial = study.ask(SPACE)
        proposed.append(trial.params)
        for params in sampler.unasked:
            proposed.append({"unasked": params})
            study.add_trial(optuna.trial.create_trial(params=params, distributions=SPACE, value=100.0))
        sampler.unasked = []
        study.tell(trial, objective(trial.params))
    return proposed


def run(skip) -> list[dict]:
    sampler = FixedSpaceTPESampler(SPACE, seed=1, multivariate=True, n_startup_trials=4)
    asked = [p for p in proposals(sampler, skip, 30) if "unasked" not in p]
    return asked[4:]  # after the random start-up trials


def test_skipped_points_are_never_proposed_while_others_remain():
    skipped = lambda params: params["b"] == "x"  # noqa: E731
    assert all(p["b"] != "x" for p in run(skipped))
    assert any(p["b"] == "x" for p in run(None))  # without the skip TPE goes there


def test_when_every_point_is_skipped_tpe_still_proposes():
    assert len(run(lambda params: True)) == 26


class ComputeEveryBatch(FixedSpaceTPESampler):
    """The straightforward form, for comparison: the acquisition of every batch before its
    candidates are judged (each candidate, every time), and every trial's parameters converted on
    every ask (Optuna's own). The batches come as the sampler draws them: TPE's own, then REDRAWS + 1
    at a time from the same model."""

    _get_internal_repr = optuna.samplers.TPESampler._get_internal_repr

    def _compute_acquisition_func(self, samples, mpe_below, mpe_above):
        names = list(self._fixed_space)
        count = len(samples[names[0]])
        fresh, used = None, REDRAWS + 1
        for group in range(GROUPS_PER_ASK):
            for redraw in range(REDRAWS + 1):
                if group or redraw:  # every batch after TPE's own is drawn afresh
                    if used == REDRAWS + 1:
                        fresh, used = mpe_below.sample(self._rng.rng, count * (REDRAWS + 1)), 0
                    for n in names:
                        samples[n][:] = fresh[n][used * count:(used + 1) * count]
                    used += 1
                values = optuna.samplers.TPESampler._compute_acquisition_func(self, samples, mpe_below, mpe_above)
                skipped = np.array([self.skip({n: self._fixed_space[n].to_external_repr(samples[n][i]) for n in names})
                                    for i in range(count)], dtype=bool)
                if not skipped.all():
                    return np.where(skipped, -np.inf, values)
            if group == GROUPS_PER_ASK - 1:
                return values
            best = int(np.argmax(values))
            self.unasked.append({n: self._fixed_space[n].to_external_repr(samples[n][best]) for n in names})


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
    # No acquisition for a batch all skipped, each point judged once an ask, finished trials
    # converted once: the same proposals, unasked ones included.
    proposed, computed = proposals_and_acquisitions(FixedSpaceTPESampler, monkeypatch)
    reference, reference_computed = proposals_and_acquisitions(ComputeEveryBatch, monkeypatch)
    assert proposed == reference
    assert computed < reference_computed


def test_groups_of_batches_all_skipped_are_proposed_without_an_ask():
    """Where one point in 12 is measured, most of TPE's groups of batches are all skipped: each
    group's best is kept for the search to tell (not proposed by an ask), and the asks still
    propose only measured points while the draws find them."""
    sampler = FixedSpaceTPESampler(SPACE, seed=3, multivariate=True, n_startup_trials=4, n_ei_candidates=2)
    measured = lambda params: params["a"] == 2 and params["b"] == "z"  # noqa: E731
    unasked = []
    sampler.skip = lambda params: not measured(params)
    study = optuna.create_study(sampler=sampler)
    for number in range(20):
        trial = study.ask(SPACE)
        if number >= 4:  # past the random start-up trials
            assert measured(trial.params) or len(sampler.unasked) == GROUPS_PER_ASK - 1
        unasked += sampler.unasked
        for params in sampler.unasked:
            study.add_trial(optuna.trial.create_trial(params=params, distributions=SPACE, value=100.0))
        sampler.unasked = []
        study.tell(trial, objective(trial.params))
    assert unasked and not any(measured(p) for p in unasked)


def test_the_search_tells_the_unasked_proposals_as_their_asks_would_have_been():
    sampler = FixedSpaceTPESampler(SPACE, seed=0)
    study = optuna.create_study(sampler=sampler)
    invalid, measured, in_flight = {"a": 1, "b": "x"}, {"a": 2, "b": "y"}, {"a": 4, "b": "z"}
    sampler.unasked = [invalid, measured, in_flight]
    names = {"a2y": measured, "a4z": in_flight}
    search = SimpleNamespace(
        local=study, dists=SPACE, idle_asks=0, counts=SimpleNamespace(rejected=0, reused=0),
        stored={"a2y": SimpleNamespace(time_us=5.0, status="ok")},
        _judged=lambda p: None if p == invalid else ("config", next(k for k, v in names.items() if v == p)))
    SearchLoop._tell_unasked(search)
    told = [(t.params, t.value) for t in study.trials]
    assert told == [(invalid, PENALTY_US), (measured, 5.0)]  # the one in flight is told with its measurement
    assert (search.counts.rejected, search.counts.reused, search.idle_asks) == (1, 1, 3)
    assert sampler.unasked == []
