"""Where a search starts: what earlier runs of the same problem measured (resume), and which
points to try first (warm start: the winners of the nearest tuned shapes, then the default)."""

from __future__ import annotations

from dataclasses import dataclass

from tuning_db import TuningDB
from tuning_db.records import DeviceIdentity, TrialRecord

from autogen.catalog.pretuned import pretuned_db, untuned_shipped
from autogen.catalog.stored import usable_trials
from autogen.core.dtypes import DTYPES
from autogen.core.family import Family
from autogen.core.problem import nearest, Problem, problem_of_record
from autogen.search.studies import PENALTY_US

NEAREST_SEEDS = 3  # winners of the nearest tuned shapes tried before the sampler's own picks


@dataclass
class StartingPoint:
    stored: dict[str, TrialRecord]  # kernel name -> trial already in the database (this problem)
    measured: dict[str, tuple[dict, float]]  # the same as Optuna values: kernel -> (params, value)
    seeds: list[dict]  # parameter sets to try first, in order
    skipped: int = 0  # stored trials of this problem today's family cannot use (autogen.catalog.stored)


def starting_point(db: TuningDB, device: DeviceIdentity, family: Family, problem: Problem,
                   cache_mode: str, warm_start: bool) -> StartingPoint:
    # Trials whose params no longer fit the space (an older or newer autogen), or name another
    # kernel than their own, are neither resumed nor told to Optuna: such a point is measured again.
    trials, skipped = usable_trials(family, problem, db.trials(device, problem.family, problem.dtype,
                                                               problem.shape_key, cache_mode))
    stored = {t.kernel_name: t for t in trials}
    measured = {name: (family.space.complete(t.params), t.time_us if t.status == "ok" else PENALTY_US)
                for name, t in stored.items()}
    return StartingPoint(stored, measured, seeds(db, device, family, problem, warm_start), skipped)


def seeds(db: TuningDB, device: DeviceIdentity, family: Family, problem: Problem, warm_start: bool) -> list[dict]:
    """Tried first: the winners of this shape in a sibling dtype (same storage width: float16
    for bfloat16 and back), then of the nearest tuned shapes on this GPU (nearest first; the
    user's database, and autogen's shipped catalog for what the database has not tuned, this
    shape included), then the family's seed configs (its default, the baseline every search
    measures, first)."""
    default = []
    for config in family.seed_configs(problem):
        if config.as_dict() not in default:
            default.append(config.as_dict())
    if not warm_start:
        return default
    winners = db.winners(family=problem.family, gpu_name=device.name,
                         compute_capability=device.compute_capability, dtype=problem.dtype)
    others = [w for w in winners if w.trial.shape_key != problem.shape_key]
    others += _shipped_winners(problem, device, winners)
    ordered = nearest(problem, others, lambda w: problem_of_record(w.trial.family, w.trial.dtype, w.trial.shape_key))
    ordered = _same_shape_in_siblings(db, device, family, problem) + ordered
    valid = []
    for w in ordered:
        if len(valid) == NEAREST_SEEDS:
            break
        stored = family.space.stored_point(w.trial.params)
        if stored is None:
            continue
        params = family.seed_from(problem, stored)
        if not family.space.violations(params) and params not in valid:
            valid.append(params)
    return valid + [params for params in default if params not in valid]


def _shipped_winners(problem: Problem, device: DeviceIdentity, tuned: list) -> list:
    """The shipped catalog's winners of this family and dtype on this GPU for the problems the
    user's database has not tuned (`tuned`: its winners), this shape included: its own trials in
    the database are resumed, but the catalog's winner for it is the best prior a new user has
    (without it a search from an empty database ended behind the exhaustive best:
    docs/history/sessions.md, fifth session). None where autogen ships no catalog or $AUTOGEN_NO_PRETUNED is set."""
    return untuned_shipped(pretuned_db(), tuned, family=problem.family, gpu_name=device.name,
                           compute_capability=device.compute_capability, dtype=problem.dtype)


def _same_shape_in_siblings(db: TuningDB, device: DeviceIdentity, family: Family, problem: Problem) -> list:
    """Winners of this very shape in the family's other dtypes of the same storage width: the
    same loads and the same amount of work (hgemv configs re-timed in both dtypes rank alike:
    docs/families/hgemv.md, "Defaults")."""
    width = DTYPES[problem.dtype].itemsize
    siblings = [d for d in family.dtypes if d != problem.dtype and DTYPES[d].itemsize == width]
    return [w for d in siblings
            for w in db.winners(family=problem.family, gpu_name=device.name,
                                compute_capability=device.compute_capability, dtype=d)
            if w.trial.shape_key == problem.shape_key]
