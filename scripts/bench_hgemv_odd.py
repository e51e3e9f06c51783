"""hgemv on rows that do not start on a 16-byte boundary (n % 8 != 0) and on batches up to 8
(issue 33 point 3): the read-only-path and tensor-core configs as they were (row_align=scalar:
such rows are read element by element) against their row_align=peeled forms (each row's head
element by element, the rest in 16-byte packs) and their split_k forms (a cluster of 2, 4 or 8
blocks per block of row tiles, where the family's reject_reason lets the search time them), all validated on fresh inputs, then re-timed
interleaved with torch (cuBLAS) on the same cold input sets (scripts/ab_variants.py's harness).

  python3 scripts/bench_hgemv_odd.py --out DIR [--budget 300] [--dtypes float16,bfloat16]

Targets: for n % 8 != 0 at batches 1-4, >= 1.1x torch and >= 80% of the weights floor (A's bytes
over the copy bandwidth of the same run); >= 1.15x torch at batch 8. Writes DIR/hgemv_odd_<gpu>.json
as it goes (a problem measured is never lost) and prints a table last.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ab_variants import ab_problem
from benchlib import num, table, write_results

SHAPES = [(3000, 4099), (11008, 4097), (4096, 11007), (5120, 5121), (1000, 4103)]
BATCHES = [1, 2, 3, 4, 8]
EXTRA = [("bfloat16", 5120, 5120, 8)]  # aligned: the batch-8 figure of the issue

ONE_VECTOR = [dict(threads_per_row=32, pack_width=8, warps_per_block=4, rows_per_group=1, unroll=4),
              dict(threads_per_row=128, pack_width=8, warps_per_block=4, rows_per_group=2, unroll=2),
              dict(threads_per_row=256, pack_width=8, warps_per_block=8, rows_per_group=2, unroll=2,
                   reduce="smem")]
TENSOR_CORES = [dict(threads_per_row=256, warps_per_block=8, rows_per_group=1, unroll=4),
                dict(threads_per_row=256, warps_per_block=8, rows_per_group=1, unroll=2),
                dict(threads_per_row=256, warps_per_block=8, rows_per_group=2, unroll=2),
                dict(threads_per_row=128, warps_per_block=8, rows_per_group=2, unroll=2),
                dict(threads_per_row=128, warps_per_block=4, rows_per_group=2, unroll=2)]


SPLITS = (2, 4, 8)


def candidate_params(batch: int, n: int) -> list[tuple[str, dict]]:
    """(before/after/split, params) for one batch: the scalar forms the search had, the peeled
    ones, and the tensor-core ones of one row group per block split over 2, 4 and 8 blocks (rows
    peeled where n % 8 != 0)."""
    from autogen.families.hgemv import batch_tile_for

    tile = batch_tile_for(batch)
    rows = []
    for mma in TENSOR_CORES:
        base = dict(mma, x_path="mma", pack_width=8, batch_tile=tile)
        rows += [("before", dict(base, row_align="scalar")), ("after", dict(base, row_align="peeled"))]
        if mma["threads_per_row"] == 32 * mma["warps_per_block"]:
            rows += [("split", dict(base, row_align="peeled" if n % 8 else "scalar", split_k=split))
                     for split in SPLITS]
    if batch == 1:
        for params in ONE_VECTOR:
            rows += [("before", dict(params, x_path="ldg", row_align="scalar")),
                     ("after", dict(params, x_path="smem", row_align="peeled"))]
    return rows


def summarize(family, problem, row: dict, tags: dict) -> dict:
    floor = family.weight_bytes(problem) / (row["copy_gbs"] * 1e9) * 1e6
    out = {"problem": row["problem"], "gpu": row["gpu"], "copy_gbs": row["copy_gbs"],
           "weights_floor_us": round(floor, 3), "peer": row.get("peer"), "peer_us": row.get("peer_us"),
           "failed": row["failed"], "medians_us": row["medians_us"]}
    for side in ("before", "after", "split"):
        timed = {name: us for name, us in row["medians_us"].items() if tags[name] == side}
        if not timed:
            continue
        name = min(timed, key=timed.get)
        us = timed[name]
        out[side] = {"kernel": name, "us": us, "pct_of_weights_floor": round(100 * floor / us, 1),
                     "speedup_vs_peer": round(row["peer_us"] / us, 3) if row.get("peer_us") else None}
    return out


def side_cells(side: dict) -> tuple:
    return (num(side.get("us"), ".2f"), num(side.get("speedup_vs_peer"), ".2f"),
            num(side.get("pct_of_weights_floor"), ".1f"))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget", type=float, default=300.0, help="no new problem starts after this many seconds")
    parser.add_argument("--dtypes", default="float16,bfloat16")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    from autogen.core.registry import get_family

    family = get_family("hgemv")
    todo = [(d, m, n, b) for b in BATCHES for d in args.dtypes.split(",") for m, n in SHAPES] + EXTRA
    todo.sort(key=lambda p: (p[3] not in (1, 3, 8), p[0] != "float16"))  # the figures first
    started, rows = time.monotonic(), []
    for dtype, m, n, batch in todo:
        if time.monotonic() - started > args.budget:
            print(f"budget spent: {dtype} {m}x{n}x{batch} and later problems not measured")
            break
        problem = family.problem(dtype, m=m, n=n, batch=batch)
        tags, configs = {}, []
        for side, params in candidate_params(batch, n):
            config = family.space.check({**family.default_params, **params})
            if side == "split" and family.reject_reason(problem, config):
                continue  # the search would not time it here (row blocks fill the GPU, or too few chunks)
            tags[family.kernel_name(dtype, config)] = side
            configs.append(config)
        row = ab_problem(family, problem, configs, args.rounds)
        rows.append(summarize(family, problem, row, tags))
        write_results(args.out, "hgemv_odd", rows[0]["gpu"], {"problems": rows})
        r = rows[-1]
        print(f"{dtype:>8} {m:>6}x{n:<6}x{batch}  torch {r['peer_us']:8.2f} us  "
              + "  ".join(f"{side} {r[side]['us']:8.2f} us {r[side]['speedup_vs_peer']:.2f}x "
                          f"{r[side]['pct_of_weights_floor']:5.1f}%" for side in ("before", "after", "split") if side in r)
              + (f"  FAILED {len(r['failed'])}" if r["failed"] else ""), flush=True)

    gpu = rows[0]["gpu"] if rows else None
    write_results(args.out, "hgemv_odd", gpu, {"wall_s": round(time.monotonic() - started, 1), "problems": rows})
    print(f"\nhgemv, n % 8 != 0, on {gpu}, cold, kernel and torch in the same process")
    sides = ("before", "after", "split")
    print(table(("problem", "torch us", *(f"{side} {what}" for side in sides for what in ("us", "x", "%fl")),
                 "split kernel"),
                ((r["problem"], num(r["peer_us"], ".2f"),
                  *(cell for side in sides for cell in side_cells(r.get(side, {}))), r.get("split", {}).get("kernel"))
                 for r in rows)))
    for r in rows:
        for name, reason in r["failed"].items():
            print(f"FAILED {r['problem']} {name}: {reason[:200]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
