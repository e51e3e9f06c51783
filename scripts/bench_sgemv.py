"""The sgemv benchmark of the README: tune each shape, winner vs cuBLAS in the same run, cold.

Also times `autogen tune sgemv --m 16384 --n 16` end to end from a cold start (empty kernel
cache, empty database) as a user would run it. Writes bench_sgemv.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPES = [(16384, 16), (16384, 32), (16384, 128), (16384, 1024), (4096, 4096)]


def cold_cli_run(out: Path, m: int, n: int, extra: list[str]) -> dict:
    """The main command as a new user runs it: fresh process, empty kernel cache and database."""
    with tempfile.TemporaryDirectory() as scratch:
        env = dict(os.environ, AUTOGEN_CACHE_DIR=f"{scratch}/kernels", AUTOGEN_DB=f"sqlite:///{scratch}/t.db")
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "autogen", "tune", "sgemv", "--m", str(m), "--n", str(n),
                               "--json", *extra], env=env, capture_output=True, text=True)
        wall = time.monotonic() - started
        (out / f"cli_tune_{m}x{n}.stderr.log").write_text(done.stderr)
        # Second run of the same command: warm kernel cache, resumed study.
        started = time.monotonic()
        again = subprocess.run([sys.executable, "-m", "autogen", "tune", "sgemv", "--m", str(m), "--n", str(n),
                                "--json", *extra], env=env, capture_output=True, text=True)
        warm = time.monotonic() - started
    return {"exit_code": done.returncode, "wall_s": round(wall, 2), "warm_exit_code": again.returncode,
            "warm_wall_s": round(warm, 2), "result": json.loads(done.stdout) if done.returncode == 0 else None}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--db", help="tuning database to use (shapes already tuned there are resumed)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    from autogen.core.registry import get_family
    from autogen.report import tune_summary
    from autogen.search.tuner import TuneOptions, tune

    report = {"cli_cold_start": cold_cli_run(args.out, 16384, 16, [])}
    db_url = args.db or f"sqlite:///{args.out / 'bench_tuning.db'}"
    family = get_family("sgemv")
    rows = []
    for m, n in SHAPES:
        result = tune(family.problem(m=m, n=n), TuneOptions(trials=args.trials, db_url=db_url))
        rows.append(tune_summary(result))
    report["shapes"] = rows
    (args.out / "bench_sgemv.json").write_text(json.dumps(report, indent=2))

    print(f"\ncold-start `autogen tune sgemv --m 16384 --n 16`: {report['cli_cold_start']['wall_s']} s "
          f"(again, warm: {report['cli_cold_start']['warm_wall_s']} s)")
    print(f"{'shape':>14} {'kernel':<46} {'us':>8} {'cuBLAS us':>9} {'speedup':>7} {'GB/s':>7} {'%copy':>6}")
    for doc in rows:
        w = doc["winner"] or {}
        shape = "x".join(str(v) for v in doc["problem"]["shape"].values())
        print(f"{shape:>14} {w.get('kernel', '-'):<46} {w.get('time_us', 0):>8.3f} "
              f"{w.get('peer_time_us') or 0:>9.3f} {w.get('speedup_vs_peer') or 0:>7.2f} "
              f"{w.get('gb_per_s', 0):>7.0f} {w.get('pct_of_floor') or 0:>6.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
