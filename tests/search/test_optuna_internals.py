"""The fence around Optuna's private interfaces (autogen/search/optuna_internals.py).

Fails when a touch-point the fence uses moves, is renamed or changes its signature in the
installed Optuna, when a fenced function no longer works end to end, and when a module of autogen
outside the fence names a private of Optuna. Run it before raising the optuna bound in pyproject.
"""

from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path

import numpy as np
import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.samplers import TPESampler
from optuna.samplers._tpe.parzen_estimator import _ParzenEstimator
from optuna.storages._cached_storage import _CachedStorage
from optuna.storages._rdb import models
from optuna.storages._rdb.storage import _create_scoped_session

from autogen.search.optuna_internals import FixedSpaceTPESampler, add_trials

ROOT = Path(__file__).resolve().parent.parent.parent
FENCE = ROOT / "autogen" / "search" / "optuna_internals.py"
SPACE = {"a": CategoricalDistribution(list(range(64))), "b": CategoricalDistribution(["x", "y", "z"])}


def _parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def test_the_installed_optuna_is_within_the_bound_pyproject_states():
    """The fence is checked on the Optuna installed; pyproject's bound must admit it (and only
    releases the fence was checked on: raise it together with this module's run)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    from packaging.requirements import Requirement

    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (requirement,) = [Requirement(d) for d in dependencies if Requirement(d).name == "optuna"]
    assert any(spec.operator == "<" for spec in requirement.specifier), requirement
    assert requirement.specifier.contains(optuna.__version__), (str(requirement), optuna.__version__)


# -- each touch-point is where the fence expects it -----------------------------------------------

def test_the_rdb_session_and_models_add_trials_uses_are_there():
    assert _parameters(_create_scoped_session) == ["scoped_session", "ignore_integrity_error"]
    assert _parameters(models.StudyModel.find_or_raise_by_id) == ["study_id", "session", "for_update"]
    assert _parameters(models.TrialValueModel.value_to_stored_repr) == ["value"]
    assert models.TrialValueModel.value_to_stored_repr(1.5) == (1.5, models.TrialValueModel.TrialValueType.FINITE)


@pytest.mark.parametrize("model, written", [
    (models.TrialModel, {"trial_id", "study_id", "number", "state", "datetime_start", "datetime_complete"}),
    (models.TrialValueModel, {"trial_value_id", "trial_id", "objective", "value", "value_type"}),
    (models.TrialParamModel, {"param_id", "trial_id", "param_name", "param_value", "distribution_json"}),
    (models.TrialUserAttributeModel, {"trial_user_attribute_id", "trial_id", "key", "value_json"}),
])
def test_optuna_s_trial_tables_hold_exactly_the_columns_add_trials_writes(model, written):
    """A column Optuna adds (or renames) would be missing from add_trials' rows: it must be
    written as Optuna's add_trial writes it before the bound is raised."""
    assert set(model.__table__.columns.keys()) == written


def test_the_tpe_hooks_the_sampler_overrides_are_there():
    assert _parameters(TPESampler._compute_acquisition_func) == ["self", "samples", "mpe_below", "mpe_above"]
    assert _parameters(TPESampler._get_internal_repr) == ["self", "trials", "search_space", "study"]
    assert _parameters(_ParzenEstimator.sample) == ["self", "rng", "size"]
    assert isinstance(TPESampler(seed=0)._rng.rng, np.random.RandomState)
    # TPE draws its candidates with its _rng, scores them with the hook, then compares the
    # same arrays: candidates redrawn into them by the hook are the ones compared.
    source = inspect.getsource(TPESampler._sample)
    steps = ["samples_below = mpe_below.sample(self._rng.rng",
             "self._compute_acquisition_func(samples_below, mpe_below, mpe_above)",
             "_compare(samples_below, acq_func_vals)"]
    assert all(step in source for step in steps), source
    assert [source.index(step) for step in steps] == sorted(source.index(step) for step in steps)


def test_tpe_splits_its_trials_with_the_gamma_the_sampler_sets():
    # touch-point 9: _sample calls self._gamma with the count of finished trials (None: Optuna's default)
    assert TPESampler(seed=0)._gamma is None
    assert "self._gamma(n)" in inspect.getsource(TPESampler._sample)
    assert FixedSpaceTPESampler(SPACE, penalty=1e9, seed=0)._gamma.__name__ == "_below_count"


# -- the fenced functions, end to end -------------------------------------------------------------

def _template(a: int, value: float, kernel: str) -> optuna.trial.FrozenTrial:
    return optuna.trial.create_trial(params={"a": a, "b": "y"}, distributions=SPACE, value=value,
                                     user_attrs={"kernel": kernel})


def _rows(study: optuna.Study) -> list[tuple]:
    return [(t.number, t.state, t.params, t.values, t.user_attrs) for t in study.get_trials()]


def test_add_trials_writes_what_optuna_s_add_trial_writes(tmp_path):
    rdb = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'optuna.db'}")
    optuna.create_study(storage=rdb, study_name="batched")
    one = optuna.create_study(storage=rdb, study_name="one-by-one")
    templates = [_template(3, 2.5, "k3"), _template(5, float("inf"), "k5"), _template(7, 1.0, "k7")]
    for template in templates:
        one.add_trial(template)
    batched_id = rdb.get_study_id_from_name("batched")
    add_trials(rdb, batched_id, templates[:1])
    add_trials(rdb, batched_id, templates)  # k3 is in the study already: not added twice
    assert _rows(optuna.load_study(study_name="batched", storage=rdb)) == _rows(one)
    other = optuna.trial.create_trial(params={"a": 3}, distributions={"a": CategoricalDistribution([3, 4])},
                                      value=1.0, user_attrs={"kernel": "other"})
    with pytest.raises(ValueError):  # the choices differ from the study's: refused as Optuna does
        add_trials(rdb, batched_id, [other])


def test_a_shared_rdb_study_sits_on_optuna_s_cache_over_the_storage_autogen_opened(tmp_path):
    """autogen.search.studies writes with add_trials to the RDBStorage it opened, beside the
    study's cache: that cache must still read the storage's rows afresh."""
    rdb = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'optuna.db'}")
    study = optuna.create_study(storage=rdb, study_name="shared")
    assert isinstance(optuna.storages.get_storage(rdb), _CachedStorage)
    add_trials(rdb, rdb.get_study_id_from_name("shared"), [_template(1, 4.0, "k1")])
    assert [t.user_attrs["kernel"] for t in study.get_trials()] == ["k1"]


def _ask_once(skip) -> dict:
    """One TPE proposal after a few told trials, with ``skip`` as the search's judgement."""
    sampler = FixedSpaceTPESampler(SPACE, seed=3, multivariate=True, n_startup_trials=4)
    study = optuna.create_study(sampler=sampler)
    for a in range(4):
        study.add_trial(_template(a, float(a), f"k{a}"))
    sampler.skip = skip
    return study.ask(SPACE).params


def test_the_sampler_s_hook_judges_tpe_s_candidates_and_its_redraw_is_what_tpe_proposes(monkeypatch):
    batches: list[list[dict]] = []  # the points judged, batch by batch
    judge_batch = FixedSpaceTPESampler._skipped

    def recording(self, samples, names):
        batches.append([])
        return judge_batch(self, samples, names)

    def skip_the_first_batch(params: dict) -> bool:
        batches[-1].append(params)
        return len(batches) == 1  # TPE's own batch, all of it

    monkeypatch.setattr(FixedSpaceTPESampler, "_skipped", recording)
    proposal = _ask_once(skip_the_first_batch)
    assert len(batches) == 2 and all(batches)  # TPE's batch and one redrawn batch
    first = {json.dumps(p, sort_keys=True) for p in batches[0]}
    assert not any(json.dumps(p, sort_keys=True) in first for p in batches[1])  # each point judged once an ask
    assert proposal in batches[1]
    seeded = [_ask_once(lambda params: params["a"] % 2 == 0) for _ in range(2)]
    assert seeded[0] == seeded[1] and seeded[0]["a"] % 2 == 1  # reproducible with its seed, never skipped


def _study_with_rejected_points(penalty: float | None, measured: int, seed: int):
    """A study whose first 40 trials were rejected (told 1e9) at a < 8, then `measured` measured ones."""
    sampler = FixedSpaceTPESampler(SPACE, penalty=penalty, seed=seed, multivariate=True, n_startup_trials=10)
    study = optuna.create_study(sampler=sampler)
    for i in range(40):
        study.add_trial(_template(i % 8, 1e9, f"r{i}"))
    for i in range(measured):
        study.add_trial(_template(40 + i, 10.0 + i, f"m{i}"))
    return study, sampler


def test_rejected_points_are_never_tpe_s_good_trials():
    # Held to the measured trials: none, so TPE's good group is empty (and it still proposes, from
    # its prior, a point outside the rejected region); three, so those three make it up.
    for seed in range(5):
        study, sampler = _study_with_rejected_points(1e9, 0, seed)
        assert study.ask(SPACE).params["a"] >= 8
        assert sampler._below_count(40) == 0
    study, sampler = _study_with_rejected_points(1e9, 3, 0)
    study.ask(SPACE)
    assert sampler._below_count(43) == 3 and sampler._below_count(10) == 1
    # Without a penalty the split is Optuna's default: min(ceil(0.1 n), 25)
    study, sampler = _study_with_rejected_points(None, 0, 0)
    study.ask(SPACE)
    assert [sampler._below_count(n) for n in (1, 10, 11, 40, 300)] == [1, 1, 2, 4, 25]


# -- no module outside the fence names an Optuna private ------------------------------------------

def _optuna_privates() -> set[str]:
    """The underscored names of the Optuna objects autogen handles (their classes' and instances'),
    and the touch-points themselves (should Optuna drop one, a leftover use is still found)."""
    names = {"_storage", "_study_id", "_backend", "_trial_id", "_rng", "_compute_acquisition_func",
             "_create_scoped_session", "_rdb", "_sample", "_compare", "_CachedStorage", "_ParzenEstimator"}
    study = optuna.create_study(sampler=TPESampler(seed=0))
    trial = study.ask()
    objects = [study, trial, study.sampler, study._storage, optuna.storages.RDBStorage("sqlite:///:memory:"),
               optuna.trial.create_trial(params={}, distributions={}, value=1.0), CategoricalDistribution([1]),
               optuna.samplers.RandomSampler(), _CachedStorage, _ParzenEstimator, study.sampler._rng]
    for thing in objects:
        names |= set(dir(thing)) | set(getattr(thing, "__dict__", {}))
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _optuna_classes(tree: ast.Module) -> set[str]:
    """Local names bound to Optuna by the module's imports (`import optuna`, `from optuna.x import Y`)."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] == "optuna"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "optuna":
            bound |= {a.asname or a.name for a in node.names}
    return bound


def _root(node: ast.AST) -> str:
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else ""


def optuna_private_uses(source: str, privates: set[str]) -> list[str]:
    """Where ``source`` names a private of Optuna: a private module or name imported from Optuna,
    an Optuna private read off an object other than the module's own (``self`` of a class not
    derived from Optuna's), named as a string (getattr), or a method of an Optuna subclass that
    overrides a private one."""
    tree = ast.parse(source)
    optuna_names = _optuna_classes(tree)
    found = []
    own_selves = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            if any(_root(base) in optuna_names for base in node.bases):
                found += [f"line {m.lineno}: overrides {m.name}" for m in node.body
                          if isinstance(m, ast.FunctionDef) and m.name in privates]
            else:
                own_selves |= {id(n) for n in ast.walk(node)}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            names = [] if isinstance(node, ast.Import) else [a.name for a in node.names]
            if any(m.split(".")[0] == "optuna" for m in modules) and (
                    any(part.startswith("_") for m in modules for part in m.split(".")) or
                    any(n.startswith("_") for n in names)):
                found.append(f"line {node.lineno}: imports {ast.unparse(node)}")
        elif isinstance(node, ast.Attribute) and node.attr in privates:
            on_own_self = isinstance(node.value, ast.Name) and node.value.id == "self" and id(node) in own_selves
            if not on_own_self:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Constant) and node.value in privates:
            found.append(f"line {node.lineno}: {node.value!r}")
    return found


def test_the_scan_finds_the_uses_the_fence_took_in():
    privates = _optuna_privates()
    before = '''
import optuna
from optuna.storages._rdb.storage import _create_scoped_session
class Sampler(optuna.samplers.TPESampler):
    def _compute_acquisition_func(self, samples, below, above):
        return self._rng.rng
def write(study, trial):
    backend = getattr(study._storage, "_backend", None)
    return trial._trial_id
'''
    assert len(optuna_private_uses(before, privates)) == 6
    own = '''
class Worker:
    def _rng(self):
        return self._rng
'''
    assert optuna_private_uses(own, privates) == []


def test_no_module_outside_the_fence_names_an_optuna_private():
    privates = _optuna_privates()
    sources = sorted((ROOT / "autogen").rglob("*.py")) + sorted((ROOT / "scripts").rglob("*.py"))
    found = {str(path.relative_to(ROOT)): uses for path in sources if path != FENCE
             for uses in [optuna_private_uses(path.read_text(), privates)] if uses}
    assert found == {}
    assert optuna_private_uses(FENCE.read_text(), privates)  # the scan sees the fence's own uses


def test_the_sampler_converts_each_finished_trial_once_into_optuna_s_own_arrays():
    sampler = FixedSpaceTPESampler(SPACE, seed=0, multivariate=True, constant_liar=True)
    study = optuna.create_study(sampler=sampler)
    for a in (1, 2, 3, 4):
        study.add_trial(optuna.trial.create_trial(params={"a": a, "b": "y"}, distributions=SPACE, value=float(a)))
    study.add_trial(optuna.trial.create_trial(params={"a": 2}, distributions={"a": SPACE["a"]}, value=9.0))  # not all
    running = study.ask()  # constant liar: a running trial is read too, and never kept
    running.suggest_categorical("a", SPACE["a"].choices)
    running.suggest_categorical("b", SPACE["b"].choices)
    trials = study.get_trials(deepcopy=False)
    for _ in range(2):  # the second time from the kept rows
        ours = sampler._get_internal_repr(trials, dict(SPACE), study)
        optunas = TPESampler._get_internal_repr(sampler, trials, dict(SPACE), study)
        assert ours.keys() == optunas.keys()
        for name in ours:
            assert ours[name].dtype == optunas[name].dtype and np.array_equal(ours[name], optunas[name])
        assert len(ours["a"]) == 5  # four finished, the running one; the one without b left out
    assert len(sampler._internal_rows) == 4
