"""Tune the README's shapes and the pre-tuned grid on this GPU, then write the shipped catalog.

Usage (on the GPU machine): python3 scripts/make_pretuned.py --out DIR [--trials N] [--family sgemv|scan]
Writes DIR/pretuned_<gpu>.json (copy it to autogen/data/) and DIR/pretuned.db. --family scan tunes
the scan benchmark's shapes (SCAN_SHAPES) instead of the sgemv grid; merge its catalog into the
shipped one with scripts/catalog_from.py --keep.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from benchlib import tune_each

GRID_M = (1024, 4096, 16384)
GRID_N = (16, 32, 64, 128, 1024, 4096)
README_SHAPES = ((16384, 16), (16384, 32), (16384, 128), (16384, 1024), (4096, 4096))
# scan: (dtype, n, scan, acc_dtype), the benchmark's sizes (scripts/bench_scan.py) in both directions
SCAN_SHAPES = tuple((dtype, n, scan, "auto") for dtype in ("float32", "int32") for scan in ("inclusive", "exclusive")
                    for n in (2**24, 2**28, 1_000_003, 16_777_259, 123_456_791)) + tuple(
    (dtype, 2**24, "inclusive", acc) for dtype, acc in (("float16", "auto"), ("bfloat16", "auto"), ("int32", "int64")))
# --family gemm_bias_act: the benchmark's named shapes (scripts/bench_gemm_bias_act.py), every activation.
GEMM_BIAS_ACT = [dict(batch=b, m=m, n=n, k=k, act=act) for b, m, n, k in ((8, 1024, 1024, 1024), (64, 512, 512, 512))
                 for act in ("relu", "gelu", "none")]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--db", help="reuse an existing database (shapes already tuned are resumed)")
    parser.add_argument("--family", choices=("sgemv", "scan", "gemm_bias_act"), default="sgemv",
                        help="sgemv's grid (default), or scan's or gemm_bias_act's benchmark shapes")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    from tuning_db import TuningDB
    from autogen.core.registry import get_family
    from autogen.catalog.pretuned import dump_catalog

    db_url = args.db or f"sqlite:///{args.out / 'pretuned.db'}"
    family = get_family(args.family)
    if args.family == "scan":
        problems = [family.problem(dtype, n=n, scan=scan, acc_dtype=acc) for dtype, n, scan, acc in SCAN_SHAPES]
    elif args.family == "gemm_bias_act":
        problems = [family.problem(**dims) for dims in GEMM_BIAS_ACT]
    else:
        shapes = sorted(set(README_SHAPES) | {(m, n) for m in GRID_M for n in GRID_N})
        problems = [family.problem(m=m, n=n) for m, n in shapes]
    device = None
    for _problem, result, _summary in tune_each(problems, {"trials": args.trials, "db_url": db_url}):
        device = result.device
    slug = re.sub(r"[^a-z0-9]+", "_", device.name.lower()).strip("_")
    path = args.out / f"pretuned_{slug}.json"
    count = dump_catalog(TuningDB(db_url), device.name, path)
    print(f"wrote {count} winners to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
