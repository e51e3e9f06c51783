"""Stored trials and winners as today's family reads them.

A row is well formed when tuning_db can turn it into a record; it is usable here only when its
params are a point of today's space (completed by Param.added_with_default) and name the kernel
it is stored under: the name is derived from the params (Family.kernel_name), so a row whose two
disagree, or whose params an older or newer autogen's space held, cannot be resumed, re-timed,
served or exported. Readers skip such rows and say how many they skipped, once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autogen.core.problem import problem_of_record
from autogen.errors import AutogenError

if TYPE_CHECKING:
    from tuning_db.records import TrialRecord, WinnerRecord


def unusable_reason(family, dtype: str, traits: tuple, trial: TrialRecord) -> str | None:
    """Why today's ``family`` cannot use the stored ``trial`` of a problem with ``dtype`` and
    ``traits``; None where it can."""
    params = trial.params
    if not isinstance(params, dict):
        return "its params are not a mapping"
    problems = family.space.violations(params)
    if problems:
        return "its params are outside today's space: " + "; ".join(problems)
    try:
        name = family.kernel_name(dtype, family.space.check(params), traits)
    except AutogenError as exc:
        return str(exc)
    if name != trial.kernel_name:
        return f"it is stored as {trial.kernel_name!r} but its params name {name!r}"
    return None


def usable_trials(family, problem, trials: list[TrialRecord]) -> tuple[list[TrialRecord], int]:
    """(the trials of ``problem`` today's family can use, in order; how many were skipped)."""
    kept = [t for t in trials if unusable_reason(family, problem.dtype, problem.traits, t) is None]
    return kept, len(trials) - len(kept)


def skipped_note(count: int) -> str:
    return f"skipped {count} stored trial{'s' if count != 1 else ''} outside today's space " \
           "(params not in the family's space, or naming another kernel than the stored name)"


def winner_unusable_reason(family, winner: WinnerRecord) -> str | None:
    """unusable_reason for a stored winner, its problem read from its own row; None where its
    shape key cannot be read or its dtype is not the family's (the checks of whoever serves or
    exports it name those)."""
    problem = problem_of_record(winner.trial.family, winner.trial.dtype, winner.trial.shape_key)
    if problem is None or problem.dtype not in family.dtypes:
        return None
    return unusable_reason(family, problem.dtype, problem.traits, winner.trial)


def skipped_winners_note(count: int) -> str:
    return f"skipped {count} stored winner{'s' if count != 1 else ''} outside today's space " \
           "(params not in the family's space, or naming another kernel than the stored name)"
