"""`autogen tune ... --refresh`: bring a stale winner up to date without searching again.

A winner is stale (autogen.catalog.environment) when it was measured with another driver, CUDA runtime,
NVRTC or autogen, or when its template renders other code now. Refreshing re-validates and
re-times the problem's best few stored trials (top_k, the stored winner among them) in the
running environment, each rendered by this autogen, stores those measurements (with this
environment and source hash), re-times the survivors interleaved and stores the winner through
the same rule as a search's finish: the stored winner was timed side by side, so the faster one
stands. `autogen tune` does this by itself when a completed search finds its winner stale.
"""

from __future__ import annotations

import statistics
from typing import Callable

from tuning_db import TuningDB
from tuning_db.records import TrialRecord

from autogen._version import __version__
from autogen.catalog.stored import usable_trials
from autogen.core.render import render, source_hash
from autogen.errors import InvalidConfigError
from autogen.gpu.compile import compile_options
from autogen.search.winner import _stored_winner, Finish, measure_ceilings, pick_winner, retime, trial_from_outcome


def refresh(family, problem, options, db: TuningDB, device, backend,
            progress: Callable[[str], None]) -> Finish:
    evaluator = backend.evaluator
    stored, unusable = _stored_winner(family, db, device, problem, options.cache_mode)
    trials, _skipped = usable_trials(family, problem, db.trials(device, problem.family, problem.dtype,
                                                                problem.shape_key, options.cache_mode))
    best = sorted((t for t in trials if t.status == "ok"), key=lambda t: t.time_us)[: options.top_k]
    if stored is not None and all(t.kernel_name != stored.trial.kernel_name for t in best):
        best.append(stored.trial)
    options_text = " ".join(compile_options(device.arch, family.compiler_options))
    measured: list[TrialRecord] = []
    for trial in best:
        try:
            config = family.space.check(trial.params)
        except InvalidConfigError as exc:
            progress(f"refresh: {trial.kernel_name} no longer fits the space ({exc}); skipped")
            continue
        source = render(family, problem.dtype, config, traits=problem.traits)
        name = family.kernel_name(problem.dtype, config, problem.traits)
        base = dict(family=problem.family, dtype=problem.dtype, shape_key=problem.shape_key, kernel_name=name,
                    params=config.as_dict(), source_hash=source_hash(source, family.compiler_options),
                    compile_options=options_text,
                    cache_mode=options.cache_mode)
        try:
            cubin = backend.compile(source, device.arch, family.compiler_options).result()
        except Exception as exc:
            record = TrialRecord(status="failed", reason=f"compile: {exc}", **base)
        else:
            record = trial_from_outcome(evaluator.evaluate(name, cubin, config.as_dict()), base)
        record = db.record_trial(device, record)  # a failed one withdraws a winner it was
        progress(f"refresh: {name}: " + (f"{record.time_us:.2f} us (was {trial.time_us:.2f} us)"
                                         if record.status == "ok" else f"FAILED {record.reason[:160]}"))
        if record.status == "ok":
            measured.append(record)
    copy_gbs, fp32_tflops = measure_ceilings(evaluator, progress)
    if not measured:
        progress("refresh: no stored variant passes here; nothing stored as winner")
        return Finish(None, [], copy_gbs, fp32_tflops, "no stored variant passed validation here")
    peer = None
    try:
        peer = evaluator.time_peer()
    except Exception as exc:
        progress(f"peer could not be timed: {exc}")
    finalists = retime(family, problem, options, db, device, backend, measured, progress)
    winner, margin = pick_winner(finalists)
    names = {t.kernel_name for t in finalists}
    side_by_side = stored.trial.kernel_name if stored is not None and stored.trial.kernel_name in names else None
    peer_name, peer_time = (peer[0], statistics.median(peer[1])) if peer else ("", None)
    kept = db.set_winner(device, winner, peer_name=peer_name, peer_time_us=peer_time, margin=margin,
                         autogen_version=__version__, retimed_against=side_by_side, force=unusable)
    progress(f"refresh: the winner is {kept.trial.kernel_name} ({kept.trial.time_us:.2f} us), measured here")
    return Finish(kept, finalists, copy_gbs, fp32_tflops)
