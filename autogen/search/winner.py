"""The end of a search: the peer and the roofline measured in the same run, the best few
variants re-timed interleaved, and the winner chosen by a deterministic rule and stored."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Callable

from tuning_db import TuningDB
from tuning_db.records import TrialRecord, WinnerRecord

from autogen._version import __version__
from autogen.catalog.stored import unusable_reason, usable_trials
from autogen.core.render import render

# Two re-timed variants whose medians differ by less than this (or than half the best one's
# spread) are a tie: the simpler name wins. The interleaved re-timing tells apart medians this
# close; at the memory limit a whole search's finalists lie within a wider rule's tie, which then
# chose by name over a faster variant (docs/history/sessions.md, thirteenth session, "The tie rule").
TIE_FRACTION = 0.002


@dataclass
class Finish:
    winner: WinnerRecord | None
    finalists: list[TrialRecord]
    copy_gbs: float | None
    fp32_tflops: float | None
    no_winner: str = ""  # why there is none, where winner is None


def trial_from_outcome(outcome, base: dict) -> TrialRecord:
    """The trial an evaluation makes (search and refresh alike): the median and spread of its
    samples where it passed, else why it failed, with its error where that is a number."""
    if outcome.status == "ok":
        return TrialRecord(status="ok", time_us=statistics.median(outcome.samples_us), samples_us=outcome.samples_us,
                           spread_us=max(outcome.samples_us) - min(outcome.samples_us), error=outcome.error, **base)
    return TrialRecord(status="failed", reason=outcome.reason, error=_finite(outcome.error), **base)


def _finite(value):
    return value if value is not None and value == value and abs(value) != float("inf") else None


def measure_ceilings(evaluator, progress: Callable[[str], None]) -> tuple[float | None, float | None]:
    """The copy bandwidth (GB/s) and FP32 peak (TFLOP/s) measured now, for the roofline; (None,
    None), said in one line, where they cannot be: the winner is still stored."""
    try:
        ceilings = evaluator.ceilings()
    except Exception as exc:
        progress(f"the roofline could not be measured: {exc}")
        return None, None
    return ceilings.copy_gbs, ceilings.fp32_tflops


def no_winner_reason(failed: int) -> str:
    """Why a search ended without a winner: every variant it measured failed validation, or it
    measured none (its time limit ran out before the first variant was compiled and checked)."""
    if failed:
        return f"no variant passed validation ({failed} failed)"
    return "no variant was measured: the time limit ran out before the first one was checked"


def finish(family, problem, options, db: TuningDB, device, backend, nothing_new: bool,
           progress: Callable[[str], None]) -> Finish:
    evaluator = backend.evaluator
    copy_gbs, fp32_tflops = measure_ceilings(evaluator, progress)
    stored, unusable = _stored_winner(family, db, device, problem, options.cache_mode)
    if nothing_new and stored is not None:
        # A resumed search that measured nothing has nothing to decide: the stored winner stands.
        progress("nothing new was measured: the stored winner stands (no re-timing)")
        return Finish(stored, [stored.trial], copy_gbs, fp32_tflops)
    peer = None
    try:
        peer = evaluator.time_peer()
    except Exception as exc:
        progress(f"peer could not be timed: {exc}")
    # Rows today's space cannot render (autogen.catalog.stored) are neither re-timed nor proposed.
    trials, _skipped = usable_trials(family, problem, db.trials(device, problem.family, problem.dtype,
                                                                problem.shape_key, options.cache_mode))
    ok = sorted((t for t in trials if t.status == "ok"), key=lambda t: t.time_us)
    if not ok:
        why = no_winner_reason(sum(1 for t in trials if t.status == "failed"))
        progress(f"{why}; nothing stored as winner")
        return Finish(None, [], copy_gbs, fp32_tflops, why)
    best = ok[: options.top_k]
    # The stored winner (another run's, maybe) is re-timed side by side with ours: set_winner
    # replaces it only on that evidence, or on the stored figures beyond its spread.
    stored_trial = next((t for t in ok if stored and t.kernel_name == stored.trial.kernel_name), None)
    if stored_trial is not None and stored_trial not in best:
        best.append(stored_trial)
    finalists = retime(family, problem, options, db, device, backend, best, progress)
    retimed = finalists is not best  # retime hands back its input when it did not re-time
    winner, margin = pick_winner(finalists)
    peer_name, peer_time = (peer[0], statistics.median(peer[1])) if peer else ("", None)
    kept = db.set_winner(device, winner, peer_name=peer_name, peer_time_us=peer_time, margin=margin,
                         autogen_version=__version__, force=unusable,
                         retimed_against=stored.trial.kernel_name if retimed and stored_trial is not None else None)
    if kept.trial.kernel_name != winner.kernel_name:
        progress(f"kept the stored winner {kept.trial.kernel_name} ({kept.trial.time_us:.2f} us): "
                 f"{winner.kernel_name} is not faster beyond its spread")
    return Finish(kept, finalists, copy_gbs, fp32_tflops)


def _stored_winner(family, db: TuningDB, device, problem, cache_mode: str) -> tuple[WinnerRecord | None, bool]:
    """(the winner stored for this problem and cache mode, None where none, or only a bad row;
    whether a stored winner is there that today's family cannot use, which a new one replaces
    whatever its stored time)."""
    found = db.winners(family=problem.family, gpu_name=device.name, compute_capability=device.compute_capability,
                       dtype=problem.dtype, shape_key=problem.shape_key, cache_mode=cache_mode)
    if not found:
        return None, False
    if unusable_reason(family, problem.dtype, problem.traits, found[0].trial) is not None:
        return None, True
    return found[0], False


def retime(family, problem, options, db: TuningDB, device, backend, best: list[TrialRecord],
           progress: Callable[[str], None]) -> list[TrialRecord]:
    """The candidates' graphs replayed in turn, round after round, so drift hits all alike; the
    new samples replace the search's in the database."""
    if len(best) < 2:
        return best
    candidates = []
    for trial in best:
        config = family.space.check(trial.params)
        source = render(family, problem.dtype, config, traits=problem.traits)
        cubin = backend.compile(source, device.arch, family.compiler_options).result()
        candidates.append((trial.kernel_name, cubin, trial.params))
    try:
        samples = backend.evaluator.retime(candidates, options.retime_rounds,
                                           timeout_s=10 * options.eval_timeout_s)
    except Exception as exc:
        progress(f"interleaved re-timing failed ({exc}); keeping the search timings")
        return best
    return [db.record_trial(device, _with_samples(trial, samples[trial.kernel_name])) for trial in best]


def pick_winner(finalists: list[TrialRecord]) -> tuple[TrialRecord, float | None]:
    """Lowest median wins; variants within TIE_FRACTION (or within their spread) of it tie, and a
    tie goes to the lexicographically smallest kernel name, so the choice is deterministic."""
    ranked = sorted(finalists, key=lambda t: (t.time_us, t.kernel_name))
    best = ranked[0]
    tolerance = max(TIE_FRACTION * best.time_us, (best.spread_us or 0.0) / 2)
    tied = [t for t in ranked if t.time_us - best.time_us <= tolerance]
    chosen = min(tied, key=lambda t: t.kernel_name)
    others = [t for t in ranked if t is not chosen]
    margin = (others[0].time_us - chosen.time_us) / chosen.time_us if others else None
    return chosen, margin


def _with_samples(trial: TrialRecord, samples: tuple[float, ...]) -> TrialRecord:
    return replace(trial, samples_us=samples, time_us=statistics.median(samples),
                   spread_us=max(samples) - min(samples))
