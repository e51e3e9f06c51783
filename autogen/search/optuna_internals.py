"""Every use autogen makes of Optuna's private interfaces, fenced in this one module.

Optuna promises nothing about names that begin with an underscore. pyproject.toml bounds optuna
to the releases this fence was checked on (below the next minor release), and
tests/search/test_optuna_internals.py fails when any touch-point below moves or changes its
signature, so an upgrade is a decision: run that test on the new release, adapt this module, raise
the bound. No other module of autogen names a private of Optuna (the same test scans them).

The touch-points, and why each is needed:

1. ``optuna.storages._rdb.models`` (StudyModel.find_or_raise_by_id, TrialModel, TrialValueModel and
   its value_to_stored_repr, TrialParamModel, TrialUserAttributeModel): add_trials writes a worker's
   measured variants as the rows Optuna's add_trial writes, in one transaction of a few statements.
   Optuna has no public batch insert, and its add_trial takes a transaction per trial that held the
   search loop's claims up (see add_trials).
2. ``optuna.storages._rdb.storage._create_scoped_session`` over ``RDBStorage.scoped_session``: that
   transaction is Optuna's own (its sessions, commit, rollback, StorageInternalError on a database
   error), so a batch fails as Optuna's add_trial would.
3. ``TPESampler._compute_acquisition_func(samples, mpe_below, mpe_above)``: FixedSpaceTPESampler
   ranks last the candidates the search would skip, so an ask (a TPE fit) is not spent on a point
   that is not measured, and keeps the proposal of each group of batches all skipped for the
   search to tell without an ask (``unasked``). TPE has no public hook between drawing candidates
   and choosing one.
4. ``TPESampler._rng.rng``: the sampler's seeded random state; redrawn candidates come from it, so
   a seeded search stays reproducible.
5. ``_ParzenEstimator.sample(rng, size)`` (the ``mpe_below`` TPE passes to 3): draws the fresh
   candidates from the same model, a group of batches a call.
6. ``TPESampler._sample``'s order: it hands one ``samples`` dict to _compute_acquisition_func and
   then to _compare, so candidates redrawn into its arrays are the ones compared.
7. ``TPESampler._get_internal_repr(trials, search_space, study)``: every ask (a TPE fit) converts
   the parameters of every trial so far to their internal form, twice, in Optuna's Python loop, a
   cost that grows with the trials (docs/internals.md, "The search").
   FixedSpaceTPESampler keeps each finished trial's converted row (a finished trial's parameters
   never change) and converts only the new ones, through this same method, so the arrays are
   Optuna's own, row for row.
8. Not a name but a behaviour: a shared study on an RDBStorage is read through Optuna's
   _CachedStorage, while add_trials writes to the RDBStorage beneath it; the cache must still
   read the trials it did not write.

9. ``TPESampler._gamma``: the split of the finished trials into TPE's good and bad groups, a
   callable of their count that ``_sample`` calls before each ask (Optuna's ``gamma`` argument sets
   it, deprecated since 4.9). FixedSpaceTPESampler holds the good group to the trials measured, so
   the rejected points (told very slow) never make it up (``_below_count``).

Replaced by public interfaces, hence no longer touched: ``Study._storage`` and ``Study._study_id``
(autogen.search.studies keeps the storages it opens and asks their get_study_id_from_name),
``_CachedStorage._backend`` (the shared RDBStorage is autogen.search.studies.storage's), and
``FrozenTrial._trial_id`` (a trial's number is unique in its study).
"""

from __future__ import annotations

import json
from typing import Callable

import numpy as np
import optuna
from optuna.distributions import (CategoricalDistribution, check_distribution_compatibility, distribution_to_json,
                                  json_to_distribution)
from optuna.trial import TrialState
from sqlalchemy import func, insert, select, text

# Optuna's ORM models (``_rdb.models``) are imported where used, as Optuna itself imports them
# lazily: the storage that needs them opens on a background thread (studies.open_storage_soon),
# off the search's start.


def add_trials(rdb: optuna.storages.RDBStorage, study_id: int, templates: list, check_params: bool = True) -> None:
    """Add finished trials (optuna.trial.create_trial templates: params, values, user attrs) to
    an RDB study in one transaction of a few statements, the rows Optuna's add_trial writes.

    Optuna's RDBStorage.create_new_trial takes a transaction and ~35 ORM statements per trial
    of seven parameters (each parameter is read back and checked against the study's earlier
    ones). Here the study row is locked as Optuna locks it for a new trial (SQLite: the write
    lock of BEGIN IMMEDIATE; PostgreSQL: SELECT ... FOR UPDATE), so each trial's number is the
    count of the study's trials before it, as Optuna's count_past_trials gives; the trials go in
    one INSERT returning their ids, the rows below them (value, params, user attributes) in one
    executemany per table. The parameters' distributions are compared with the study's stored
    ones before the lock (``check_params``; ValueError when they differ, as Optuna raises), which
    a caller writing the same space again skips."""
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    for template in templates:
        if template.state != TrialState.COMPLETE or template.values is None or len(template.values) != 1:
            raise ValueError("add_trials writes finished single-objective trials only")
        if template.system_attrs or template.intermediate_values:
            raise ValueError("add_trials writes no system attributes or intermediate values")
    with _create_scoped_session(rdb.scoped_session) as session:
        if session.get_bind().dialect.name == "postgresql":
            # Every worker of the problem queues for the study's row lock, which PostgreSQL frees
            # only once the commit is on disk: this transaction does not wait for the disk. The
            # study is a copy of autogen's tables (the source of truth), and the trials a server
            # crash may lose are added again by the next worker to open it (add_known).
            session.execute(text("SELECT set_config('synchronous_commit', 'off', true)"))
        if check_params:  # before the lock: a study's distributions are fixed by its first trials
            _check_distributions(session, study_id, templates)
        # Every worker of the problem queues here: what follows, up to the commit, is kept short.
        models.StudyModel.find_or_raise_by_id(study_id, session, for_update=True)
        templates = _new_kernels(session, study_id, templates)
        if not templates:
            return
        past = session.scalar(select(func.count(models.TrialModel.trial_id))
                              .where(models.TrialModel.study_id == study_id))
        # One INSERT for the batch, its ids returned in the rows' order (numbers past, past + 1, ...).
        trials = models.TrialModel.__table__
        ids = session.scalars(
            insert(trials).returning(trials.c.trial_id, sort_by_parameter_order=True),
            [{"study_id": study_id, "number": past + i, "state": template.state,
              "datetime_start": template.datetime_start, "datetime_complete": template.datetime_complete}
             for i, template in enumerate(templates)]).all()
        values, params, attrs = [], [], []
        for trial_id, template in zip(ids, templates):
            value, value_type = models.TrialValueModel.value_to_stored_repr(template.value)
            values.append({"trial_id": trial_id, "objective": 0, "value": value, "value_type": value_type})
            for name, param in template.params.items():
                distribution = template.distributions[name]
                params.append({"trial_id": trial_id, "param_name": name,
                               "param_value": distribution.to_internal_repr(param),
                               "distribution_json": distribution_to_json(distribution)})
            attrs.extend({"trial_id": trial_id, "key": key, "value_json": json.dumps(attr)}
                         for key, attr in template.user_attrs.items())
        for model, batch in ((models.TrialValueModel, values), (models.TrialParamModel, params),
                             (models.TrialUserAttributeModel, attrs)):
            if batch:  # one executemany per table
                session.execute(insert(model.__table__), batch)


def _check_distributions(session, study_id: int, templates: list) -> None:
    """ValueError (Optuna's) where a template's parameter distribution differs from the one the
    study's trials store for that parameter."""
    from optuna.storages._rdb import models

    names = sorted({name for t in templates for name in t.params})
    stored = session.execute(
        select(models.TrialParamModel.param_name, func.min(models.TrialParamModel.distribution_json))
        .join(models.TrialModel, models.TrialParamModel.trial_id == models.TrialModel.trial_id)
        .where(models.TrialModel.study_id == study_id, models.TrialParamModel.param_name.in_(names))
        .group_by(models.TrialParamModel.param_name)).all()
    previous = {name: json_to_distribution(text) for name, text in stored}
    for template in templates:
        for name, distribution in template.distributions.items():
            if name in previous:
                check_distribution_compatibility(previous[name], distribution)


def _new_kernels(session, study_id: int, templates: list) -> list:
    """The templates whose variant (user attribute "kernel") the study does not hold yet. Two
    workers may add one variant: its measurer, whose write waits for its batch, and a worker that
    started meanwhile and found it in autogen's tables (SharedStudy.add_known). Read under the
    study's lock, so whichever comes second adds nothing."""
    from optuna.storages._rdb import models

    names = {json.dumps(t.user_attrs["kernel"]) for t in templates if "kernel" in t.user_attrs}
    if not names:
        return templates
    held = set(session.scalars(
        select(models.TrialUserAttributeModel.value_json)
        .join(models.TrialModel, models.TrialUserAttributeModel.trial_id == models.TrialModel.trial_id)
        .where(models.TrialModel.study_id == study_id, models.TrialUserAttributeModel.key == "kernel",
               models.TrialUserAttributeModel.value_json.in_(names))))
    return [t for t in templates if "kernel" not in t.user_attrs or json.dumps(t.user_attrs["kernel"]) not in held]


class FixedSpaceTPESampler(optuna.samplers.TPESampler):
    """TPE over a search space known in advance. Every trial of an autogen study has the same
    distributions (one categorical per parameter), so the intersection of the trials' spaces
    that TPE infers before each ask is always that space; computing it compared every trial's
    distributions on every ask (a third of the tuner's host time at 300 asks)."""

    def __init__(self, space: dict[str, CategoricalDistribution], penalty: float | None = None, **kwargs):
        super().__init__(**kwargs)
        self._gamma = self._below_count  # touch-point 9 (Optuna's gamma argument is deprecated)
        self._fixed_space = dict(space)
        # A trial told at least this value stands for a point the search rejected (invalid or pruned
        # for the shape: studies.PENALTY_US). Such a trial is never one of TPE's good ("below")
        # trials: while fewer points are measured than TPE's split would take (a search's start),
        # the good group holds the measured ones alone, where it would otherwise fill up with
        # rejected points, all equally bad, and draw on among them (docs/internals.md, "The search").
        self.penalty = penalty
        self._measured = 0  # finished trials below the penalty, counted before each ask
        # (study name, trial number) -> the finished trial's parameters in their internal form.
        self._internal_rows: dict[tuple[str, int], tuple] = {}
        # Set by the search: whether it would not measure a point (SearchLoop._would_skip).
        # Such a proposal costs a whole ask (a TPE fit).
        self.skip: Callable[[dict], bool] | None = None
        # The proposals of groups of batches all skipped during an ask, for the search to tell.
        self.unasked: list[dict] = []
        # A candidate's internal row -> its parameters as the search names them.
        self._external_rows: dict[tuple, dict] = {}
        self._verdicts: dict[tuple, bool] = {}  # this ask's judgements, by internal row

    def infer_relative_search_space(self, study, trial) -> dict:
        # Called before each ask's split of the trials into good and bad (TPE's gamma, below).
        if self.penalty is not None:
            finished = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            self._measured = sum(1 for t in finished if t.value is not None and t.value < self.penalty)
        return dict(self._fixed_space)

    def _below_count(self, finished: int) -> int:
        """TPE's good trials of `finished`: Optuna's default split, min(ceil(0.1 n), 25), held to
        the trials measured where a penalty is set."""
        count = min(int(np.ceil(0.1 * finished)), 25)
        return count if self.penalty is None else min(count, self._measured)

    def _get_internal_repr(self, trials, search_space, study) -> dict[str, np.ndarray]:
        """Optuna's arrays of the trials' parameters in their internal form (a trial without all
        of them left out), each finished trial converted once per search rather than on every ask."""
        names = list(search_space)
        if names != list(self._fixed_space):
            return super()._get_internal_repr(trials, search_space, study)
        rows = []
        for trial in trials:
            key = (study.study_name, trial.number)
            row = self._internal_rows.get(key)
            if row is None:
                converted = super()._get_internal_repr([trial], search_space, study)
                if len(converted[names[0]]) == 0:
                    continue  # not all of the space's parameters: left out, as Optuna leaves it
                row = tuple(converted[name][0].item() for name in names)
                if trial.state.is_finished():
                    self._internal_rows[key] = row
            rows.append(row)
        return {name: np.asarray([row[i] for row in rows]) for i, name in enumerate(names)}

    def _compute_acquisition_func(self, samples, mpe_below, mpe_above):
        """TPE's acquisition of its candidates, with the ones the search would skip ranked last,
        so that TPE proposes its best candidate the search will measure. Where all are skipped,
        fresh batches are drawn from the same model (into the same arrays, which TPE then
        compares). REDRAWS + 1 batches all skipped are what one ask used to cost before the search
        rejected its proposal (the best of the last batch) and told TPE it was very slow; that
        proposal is now kept in `unasked` for the search to tell without an ask (SearchLoop), and
        the drawing goes on, up to GROUPS_PER_ASK such groups; the last group's proposal is
        returned, to be rejected as an ask. The acquisition (two log densities over every
        candidate, free of side effects) is computed only for a batch that is proposed."""
        names = [name for name in self._fixed_space if name in samples]
        if self.skip is None or not samples or len(names) != len(self._fixed_space):
            # not this sampler's whole space (a univariate fallback): leave it
            return super()._compute_acquisition_func(samples, mpe_below, mpe_above)
        count = len(samples[names[0]])
        self._verdicts = {}  # the search's state holds still during an ask: a point is judged once
        batches = self._batches({name: samples[name].copy() for name in names}, mpe_below, count)
        for group in range(GROUPS_PER_ASK):
            for _ in range(REDRAWS + 1):
                batch = next(batches)
                for name in names:
                    samples[name][:] = batch[name]
                skipped = self._skipped(samples, names)
                if not skipped.all():
                    return np.where(skipped, -np.inf, super()._compute_acquisition_func(samples, mpe_below, mpe_above))
            values = super()._compute_acquisition_func(samples, mpe_below, mpe_above)
            if group == GROUPS_PER_ASK - 1:
                return values
            best = int(np.argmax(values))
            self.unasked.append(self._external(tuple(samples[name][best].item() for name in names)))
        raise AssertionError("unreachable: the last group returns")

    def _batches(self, first: dict[str, np.ndarray], mpe_below, count: int):
        """TPE's own batch of `count` candidates, then fresh batches from the same model, drawn
        REDRAWS + 1 at a time (one call of the Parzen sampler for a group)."""
        yield first
        while True:
            fresh = mpe_below.sample(self._rng.rng, count * (REDRAWS + 1))
            for i in range(REDRAWS + 1):
                yield {name: values[i * count:(i + 1) * count] for name, values in fresh.items()}

    def _skipped(self, samples: dict[str, np.ndarray], names: list[str]) -> np.ndarray:
        """Whether the search would skip each candidate."""
        rows = zip(*(samples[name].tolist() for name in names))
        return np.fromiter((self._verdict(row) for row in rows), dtype=bool, count=len(samples[names[0]]))

    def _verdict(self, row: tuple) -> bool:
        verdict = self._verdicts.get(row)
        if verdict is None:
            verdict = self._verdicts[row] = self.skip(self._external(row))
        return verdict

    def _external(self, row: tuple) -> dict:
        """A candidate's parameters as the search names them, from its internal row (converted
        once per search: batches repeat points)."""
        params = self._external_rows.get(row)
        if params is None:
            params = {name: distribution.to_external_repr(value)
                      for (name, distribution), value in zip(self._fixed_space.items(), row)}
            self._external_rows[row] = params
        return params


# Fresh candidate batches TPE draws when every candidate is one the search would skip, before the
# group's proposal is one the search rejects; and such groups an ask may draw.
REDRAWS = 8
GROUPS_PER_ASK = 16
