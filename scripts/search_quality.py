"""How many evaluations each search strategy needs to get within 2% of the exhaustive best.

On the GPU, for each shape: an exhaustive search measures every variant of the sgemv space
(pruned ones excepted); then random search, TPE and TPE with warm start (from the tuned grid in
--grid-db) run for several seeds, each stopping once it has measured a variant within 2% of the
exhaustive best. A strategy's count is judged on the exhaustive table (the variant it found must
be within 2% there), so timing noise in the short runs does not decide it. Also: the same shape
tuned twice with different seeds, both winners re-timed interleaved (target: within 2%).

Usage: python3 scripts/search_quality.py --out DIR [--grid-db URL] [--seeds 3]
Writes search_quality_<gpu>.json, and replay recordings (test assets) of the exhaustive tables.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import benchlib

SHAPES = [(8192, 16)]
# Databases go here, not to --out: only a few files come back from the GPU machine.
SCRATCH = Path(tempfile.mkdtemp(prefix="autogen-search-quality-"))
TOLERANCE = 1.02


def evaluations_to_target(trials, table: dict[str, float], target_us: float) -> int | None:
    """1-based position of the first measured variant whose exhaustive time is within target."""
    measured = [t for t in trials if t.status != "rejected"]
    for position, trial in enumerate(measured, 1):
        if trial.kernel_name in table and table[trial.kernel_name] <= target_us:
            return position
    return None


def run_strategy(problem, mode: str, seed: int, out: Path, grid_db: str | None, budget: int, stop_at: float):
    from tuning_db import TuningDB
    from autogen.search.tuner import TuneOptions, tune

    path = SCRATCH / f"sq_{problem.shape_key.replace(',', '_').replace('=', '')}_{mode}_{seed}.db"
    path.unlink(missing_ok=True)
    if mode == "tpe_warm" and grid_db:
        shutil.copy(grid_db.removeprefix("sqlite:///"), path)
    url = f"sqlite:///{path}"
    sampler = "random" if mode == "random" else "tpe"
    result = tune(problem, TuneOptions(trials=budget, sampler=sampler, seed=seed, db_url=url,
                                       warm_start=(mode == "tpe_warm"), stop_at_us=stop_at, top_k=1),
                  progress=lambda _line: None)
    trials = TuningDB(url).trials(result.device, problem.family, problem.dtype, problem.shape_key, "cold")
    return trials


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--grid-db", help="database with the tuned grid (for warm starts)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--skip-repeatability", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    from tuning_db import TuningDB
    from autogen.core.registry import get_family
    from autogen.testing.replay import record
    from autogen.search.tuner import TuneOptions, tune

    family = get_family("sgemv")
    report = {"shapes": []}
    for m, n in SHAPES:
        problem = family.problem(m=m, n=n)
        exhaustive_url = f"sqlite:///{SCRATCH / f'exhaustive_{m}x{n}.db'}"
        result = tune(problem, TuneOptions(trials=100000, sampler="exhaustive", db_url=exhaustive_url),
                      progress=lambda _line: None)
        db = TuningDB(exhaustive_url)
        table = {t.kernel_name: t.time_us for t in db.trials(result.device, "sgemv", "float32",
                                                              problem.shape_key, "cold") if t.status == "ok"}
        evaluated = result.measured + result.failed
        best = min(table.values())
        record(db, result.device, problem, args.out / f"replay_sgemv_{m}x{n}.json")
        # The target is to get there within a quarter of exhaustive's evaluations: stop each run there.
        budget = math.ceil(evaluated / 4)
        print(f"exhaustive {m}x{n}: {evaluated} evaluations, best {best:.3f} us, {result.wall_s:.0f} s",
              flush=True)
        rows = {}
        for mode in ("random", "tpe", "tpe_warm"):
            counts = []
            for seed in range(args.seeds):
                trials = run_strategy(problem, mode, seed, args.out, args.grid_db, budget, TOLERANCE * best)
                counts.append(evaluations_to_target(trials, table, TOLERANCE * best))
                print(f"  {mode} seed {seed}: {counts[-1]} evaluations to 2%", flush=True)
                (args.out / "search_quality.partial.json").write_text(json.dumps({"mode": mode, "counts": counts}))
            reached = [c for c in counts if c is not None]
            rows[mode] = {"evaluations": counts,
                          "mean": round(statistics.mean(reached), 1) if reached else None,
                          "all_reached": len(reached) == len(counts)}
        report["shapes"].append({"shape": f"{m}x{n}", "exhaustive_evaluations": evaluated,
                                 "exhaustive_best_us": round(best, 4), "winner": result.winner.trial.kernel_name,
                                 "budget_per_run": budget, "strategies": rows,
                                 "quarter_of_exhaustive": evaluated / 4})
    report["repeatability"] = None if args.skip_repeatability else repeatability(args.out)
    benchlib.write_results(args.out, "search_quality", result.device.name if report["shapes"] else None, report)
    strategies = ("random", "tpe", "tpe_warm")
    print(benchlib.table(("shape", "exhaustive", "best us", *(f"{k} mean [runs]" for k in strategies), "N/4"),
                         ((s["shape"], s["exhaustive_evaluations"], s["exhaustive_best_us"],
                           *(f"{s['strategies'][k]['mean']} {s['strategies'][k]['evaluations']}" for k in strategies),
                           f"{s['quarter_of_exhaustive']:.0f}") for s in report["shapes"])))
    r = report["repeatability"]
    if r:
        print(f"same shape tuned twice ({r['shape']}): {r['first']} {r['first_us']} us vs {r['second']} "
          f"{r['second_us']} us -> {r['difference_pct']}% apart")
    return 0


def repeatability(out: Path) -> dict:
    """Tune 16384x16 twice from scratch with different seeds; re-time both winners interleaved."""
    from autogen.gpu.compile import compile_cubin
    from autogen.core.registry import get_family
    from autogen.core.render import render
    from autogen.search.tuner import TuneOptions, tune
    from autogen.gpu.evaluator import Evaluator, WorkSpec

    family = get_family("sgemv")
    problem = family.problem(m=16384, n=16)
    winners = []
    for seed in (11, 12):
        url = f"sqlite:///{SCRATCH / f'repeat_{seed}.db'}"
        winners.append(tune(problem, TuneOptions(seed=seed, db_url=url), progress=lambda _l: None).winner.trial)
    evaluator = Evaluator(WorkSpec("sgemv", "float32", problem.dims))
    candidates = {}
    for trial in winners:
        config = family.space.check(trial.params)
        candidates[trial.kernel_name] = (compile_cubin(render(family, "float32", config), evaluator.device.arch),
                                         config.as_dict())
    samples = evaluator.retime([(k, c, p) for k, (c, p) in candidates.items()], 9)
    first, second = (statistics.median(samples[t.kernel_name]) for t in winners)
    return {"shape": problem.shape_key, "first": winners[0].kernel_name, "first_us": round(first, 4),
            "second": winners[1].kernel_name, "second_us": round(second, 4),
            "difference_pct": round(100 * abs(first - second) / min(first, second), 2)}


if __name__ == "__main__":
    sys.exit(main())
