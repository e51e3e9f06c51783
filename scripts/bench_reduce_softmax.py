"""The reduce and softmax benchmark: tune each problem, winner vs its peer in the same run, cold
cache, medians. reduce is compared with cupy.sum, softmax with torch.softmax (reported as
unavailable where PyTorch is not importable). Writes bench_reduce_softmax.json and prints a table.

Targets on an H100: reduce >= 1.0x cupy.sum at 2^28 and >= 1.2x at 2^20; softmax >= 1.0x torch
on every fp32 shape and >= 1.3x on every fp16 shape.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

PROBLEMS = [
    ("reduce", "float32", {"n": 2**20}),
    ("reduce", "float32", {"n": 2**24}),
    ("reduce", "float32", {"n": 2**28}),
    ("reduce", "float16", {"n": 2**28}),
    *[("softmax", dtype, {"rows": rows, "cols": cols})
      for dtype in ("float32", "float16")
      for rows, cols in ((16384, 1024), (4096, 4096), (32768, 128), (1024, 32768))],
]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON, the database and logs")
    parser.add_argument("--trials", type=int, default=60, help="variants measured per problem (default 60)")
    parser.add_argument("--timeout", type=float, help="stop each problem's search after this many seconds")
    parser.add_argument("--only", choices=["reduce", "softmax"], help="benchmark one family only")
    return parser.parse_args(argv)


def row_text(doc: dict) -> str:
    problem = doc["problem"]
    shape = "x".join(str(v) for v in problem["shape"].values())
    label = f"{problem['family']} {problem['dtype'].replace('float', 'f')} {shape}"
    w = doc["winner"]
    if w is None:
        return f"{label:<26} {doc.get('no_winner', 'no variant passed validation')}"
    peer_us = w.get("peer_time_us")
    peer = f"{peer_us:>9.2f}" if peer_us else f"{'n/a':>9}"
    speedup = f"{w['speedup_vs_peer']:>7.2f}" if w.get("speedup_vs_peer") else f"{'n/a':>7}"
    pct = f"{w['pct_of_floor']:>6.1f}" if w.get("pct_of_floor") is not None else f"{'-':>6}"
    return f"{label:<26} {w['time_us']:>9.2f} {peer} {speedup} {w['gb_per_s']:>7.0f} {pct}  {w['kernel']}"


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    from autogen.core.registry import get_family
    from autogen.report import tune_summary
    from autogen.search.tuner import TuneOptions, tune

    db_url = f"sqlite:///{args.out / 'bench_reduce_softmax.db'}"
    rows = []
    for family_name, dtype, dims in PROBLEMS:
        if args.only and family_name != args.only:
            continue
        family = get_family(family_name)
        problem = family.problem(dtype, **dims)
        started = time.monotonic()
        result = tune(problem, TuneOptions(trials=args.trials, timeout_s=args.timeout, db_url=db_url))
        doc = tune_summary(result)
        doc["peer_available"] = bool(doc["winner"] and doc["winner"].get("peer"))
        doc["bench_wall_s"] = round(time.monotonic() - started, 1)
        rows.append(doc)
        # Written after every problem: a run cut short keeps what it measured.
        (args.out / "bench_reduce_softmax.json").write_text(json.dumps({"problems": rows}, indent=2))
        print(row_text(doc), file=sys.stderr, flush=True)

    print(f"\n{'problem':<26} {'us':>9} {'peer us':>9} {'speedup':>7} {'GB/s':>7} {'%copy':>6}  kernel")
    for doc in rows:
        print(row_text(doc))
    missing = sorted({d["problem"]["family"] for d in rows if d["winner"] and not d["peer_available"]})
    if missing:
        print(f"peer unavailable for: {', '.join(missing)} (softmax needs PyTorch with CUDA)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
