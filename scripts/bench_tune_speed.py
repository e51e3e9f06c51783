"""Wall time of `autogen tune` as a process: cold (empty kernel cache, ceilings cache and
database), then the same command again (warm), with the phase breakdown the tuner reports, and
the winner's quality against the exhaustive best (both re-timed interleaved in one evaluator).

    python3 scripts/bench_tune_speed.py --out DIR [--family sgemv --dims "--m 16384 --n 16"]
        [--cupy-cold] [--no-quality] [--also "reduce:--n 16777216" ...]

--cupy-cold also empties CuPy's own kernel cache (CUPY_CACHE_DIR) for the cold run, which adds
the NVRTC compiles of CuPy's elementwise kernels used by validation. Writes DIR/tune_speed_<gpu>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import table, write_results

ROOT = Path(__file__).resolve().parent.parent


def run_tune(family: str, dims: list[str], env: dict, extra: list[str] = ()) -> dict:
    command = [sys.executable, "-m", "autogen", "tune", family, *dims, "--json", *extra]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    document = json.loads(done.stdout)
    return {"gpu": document.get("gpu"), "process_wall_s": round(wall, 3), "tuner_wall_s": document.get("wall_s"),
            "phases_s": document.get("phases_s"), "winner": (document.get("winner") or {}).get("kernel"),
            "time_us": (document.get("winner") or {}).get("time_us"), "stderr_tail": done.stderr[-1500:]}


def isolated_env(base: Path, cupy_cold: bool) -> dict:
    env = dict(os.environ)
    env["XDG_CACHE_HOME"] = str(base / "xdg")  # ceilings.json and the default database
    env["AUTOGEN_CACHE_DIR"] = str(base / "kernels")
    env["AUTOGEN_DB"] = f"sqlite:///{base / 'tuning.db'}"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    if cupy_cold:
        env["CUPY_CACHE_DIR"] = str(base / "cupy")
    return env


def quality(family_name: str, dims: list[str], env: dict, winner_db: str, base: Path) -> dict:
    """The tuned winner against the exhaustive best, re-timed interleaved in one evaluator."""
    exhaustive_db = f"sqlite:///{base / 'exhaustive.db'}"
    started = time.perf_counter()
    run_tune(family_name, dims, {**env, "AUTOGEN_DB": exhaustive_db},
             ["--sampler", "exhaustive", "--trials", "100000"])
    exhaustive_s = time.perf_counter() - started
    code = f"""
import json, statistics, sys
from tuning_db import TuningDB
from autogen.cli.main import build_parser
from autogen.cli.options import problems_from_args
from autogen.core.registry import get_family
from autogen.core.render import render
from autogen.gpu.compile import compile_cubin
from autogen.gpu.evaluator import Evaluator, WorkSpec
args = build_parser(get_family({family_name!r})).parse_args(["tune", {family_name!r}, *{dims!r}])
family = get_family({family_name!r})
(problem,) = problems_from_args(args, family)
evaluator = Evaluator(WorkSpec.of(problem))
picks = {{}}
for label, url in (("tuned", {winner_db!r}), ("exhaustive", {exhaustive_db!r})):
    w = TuningDB(url).winner(evaluator.device, problem.family, problem.dtype, problem.shape_key)
    picks[label] = w.trial
names = {{label: t.kernel_name for label, t in picks.items()}}
candidates = []
for label, t in picks.items():
    config = family.space.check(t.params)
    if t.kernel_name not in [c[0] for c in candidates]:
        candidates.append((t.kernel_name, compile_cubin(render(family, problem.dtype, config, traits=problem.traits),
                                                        evaluator.device.arch), config.as_dict()))
samples = evaluator.retime(candidates, 15)
med = {{label: statistics.median(samples[name]) for label, name in names.items()}}
print(json.dumps({{"tuned": names["tuned"], "exhaustive_best": names["exhaustive"], "tuned_us": med["tuned"],
                  "exhaustive_us": med["exhaustive"], "gap_pct": round(100 * (med["tuned"] / med["exhaustive"] - 1), 2)}}))
"""
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        return {"error": done.stderr[-2000:]}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["exhaustive_search_s"] = round(exhaustive_s, 1)
    return result


def import_time() -> dict:
    """Seconds to import what `autogen tune` imports before any GPU work (median of 3)."""
    samples = []
    for _ in range(3):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import autogen.cli.commands, autogen.search.tuner, cupy"], check=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
        samples.append(time.perf_counter() - started)
    optuna = []
    for _ in range(3):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import optuna"], check=True)
        optuna.append(time.perf_counter() - started)
    return {"autogen_tuner_and_cupy_s": round(statistics.median(samples), 3),
            "optuna_alone_s": round(statistics.median(optuna), 3)}


def bench_one(family: str, dims: list[str], cupy_cold: bool, with_quality: bool) -> dict:
    base = Path(tempfile.mkdtemp(prefix="autogen-speed-"))
    env = isolated_env(base, cupy_cold)
    cold = run_tune(family, dims, env)
    warm = run_tune(family, dims, env)
    warm_again = run_tune(family, dims, env)
    row = {"command": f"autogen tune {family} {' '.join(dims)}", "cold": cold, "warm": warm,
           "warm_again": warm_again}
    if with_quality:
        row["quality"] = quality(family, dims, env, env["AUTOGEN_DB"], base)
    return row


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--family", default="sgemv")
    parser.add_argument("--dims", default="--m 16384 --n 16")
    parser.add_argument("--also", action="append", default=[], metavar="FAMILY:DIMS",
                        help='another command to time, e.g. "reduce:--n 16777216" (no quality check)')
    parser.add_argument("--cupy-cold", action="store_true", help="also empty CuPy's kernel cache")
    parser.add_argument("--no-quality", action="store_true", help="skip the exhaustive comparison")
    parser.add_argument("--root", type=Path, help="the autogen checkout to time (default: this one), "
                                                   "e.g. a checkout of main for the 'before' figures")
    args = parser.parse_args()
    if args.root:
        global ROOT
        ROOT = args.root.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"imports": import_time(),
              "runs": [bench_one(args.family, shlex.split(args.dims), args.cupy_cold, not args.no_quality)]}
    for extra in args.also:
        family, dims = extra.split(":", 1)
        report["runs"].append(bench_one(family, shlex.split(dims), args.cupy_cold, False))
    write_results(args.out, "tune_speed", report["runs"][0]["cold"]["gpu"], report)
    print(f"imports: {report['imports']}")
    print(table(("command", "run", "process s", "tuner s", "winner", "us", "phases s"),
                ((run["command"], label, f"{run[label]['process_wall_s']:.2f}", run[label]["tuner_wall_s"],
                  run[label]["winner"], run[label]["time_us"], run[label]["phases_s"])
                 for run in report["runs"] for label in ("cold", "warm", "warm_again"))))
    for run in report["runs"]:
        if "quality" in run:
            print(f"{run['command']}: quality {run['quality']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
