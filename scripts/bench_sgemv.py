"""The sgemv benchmark of the README: tune each shape, winner vs cuBLAS in the same run, cold.

Also times `autogen tune sgemv --m 16384 --n 16` end to end from a cold start (empty kernel
cache, empty database) as a user would run it. Writes sgemv_<gpu>.json and prints a table.
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

from benchlib import WINNER_HEADER, shape_text, table, tune_each, winner_cells, write_results

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

    report = {"cli_cold_start": cold_cli_run(args.out, 16384, 16, [])}
    db_url = args.db or f"sqlite:///{args.out / 'bench_tuning.db'}"
    family = get_family("sgemv")
    report["shapes"] = rows = []
    for _problem, _result, summary in tune_each([family.problem(m=m, n=n) for m, n in SHAPES],
                                                {"trials": args.trials, "db_url": db_url}):
        rows.append(summary)
        write_results(args.out, "sgemv", rows[0]["gpu"], report)

    print(f"\ncold-start `autogen tune sgemv --m 16384 --n 16`: {report['cli_cold_start']['wall_s']} s "
          f"(again, warm: {report['cli_cold_start']['warm_wall_s']} s)")
    print(table(("shape", *WINNER_HEADER), ((shape_text(doc), *winner_cells(doc)) for doc in rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
