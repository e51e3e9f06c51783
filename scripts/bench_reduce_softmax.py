"""The reduce and softmax benchmark: tune each problem, winner vs its peer in the same run, cold
cache, medians. reduce is compared with cupy.sum, softmax with torch.softmax (reported as
unavailable where PyTorch is not importable). Writes reduce_softmax_<gpu>.json and prints a
table.

Targets on an H100: reduce >= 1.0x cupy.sum at 2^28 and >= 1.2x at 2^20; softmax >= 1.0x torch
on every fp32 shape and >= 1.3x on every fp16 shape.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchlib import (WINNER_HEADER, Budget, render_table, shape_text, table, tune_each, winner_cells,
                      write_results)

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


def row_cells(doc: dict) -> tuple:
    problem = doc["problem"]
    return (problem["family"], problem["dtype"].replace("float", "f"), shape_text(doc), *winner_cells(doc))


HEADER = ("family", "dtype", "shape", *WINNER_HEADER)


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    from autogen.core.registry import get_family

    db_url = f"sqlite:///{args.out / 'bench_reduce_softmax.db'}"
    problems = [get_family(name).problem(dtype, **dims) for name, dtype, dims in PROBLEMS
                if not args.only or name == args.only]
    rows = []
    options = {"trials": args.trials, "db_url": db_url}
    for _problem, _result, doc in tune_each(problems, options, Budget(timeout_s=args.timeout)):
        doc["peer_available"] = bool(doc["winner"] and doc["winner"].get("peer"))
        rows.append(doc)
        write_results(args.out, "reduce_softmax", rows[0]["gpu"], {"problems": rows})
        print(render_table([row_cells(doc)]), file=sys.stderr, flush=True)

    print()
    print(table(HEADER, map(row_cells, rows)))
    missing = sorted({d["problem"]["family"] for d in rows if d["winner"] and not d["peer_available"]})
    if missing:
        print(f"peer unavailable for: {', '.join(missing)} (softmax needs PyTorch with CUDA)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
