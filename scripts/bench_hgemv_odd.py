"""hgemv on rows that do not start on a 16-byte boundary (n % 8 != 0) and on batches up to 8
(issue 33 point 3). Per problem, in one process and on the same cold input sets: the tensor-core
forms (the configs that won or came second in earlier runs, each unsplit and split over a cluster of
2, each unbounded and register-bounded for 2 or 3 blocks per SM, where the space and the family's
reject_reason let the search time them; rows peeled, and on aligned rows also read whole, "scalar");
torch (cuBLAS); and a plain read of A's bytes with no arithmetic (the best of a few grids: what a
kernel that only read its weights would take, "read"). Each kernel is validated on fresh inputs,
then all re-timed interleaved (scripts/ab_variants.py's harness). For one vector also the
CUDA-core forms with x in shared memory and A requested first (load_schedule=early, "rows"); for
batches to 4 the rows in flight (row_align=peeled through the read-only path, "flight"); the
other x_path=smem forms lost to the tensor-core ones on every problem of this harness
(docs/history/families.md).

  python3 scripts/bench_hgemv_odd.py --out DIR [--budget 300] [--dtypes float16,bfloat16]
      [--shapes 3000x4099,1000x4103] [--batches 1,3,8]

Targets: for n % 8 != 0 at batches 1-4, >= 1.1x torch and >= 80% of the weights floor (A's bytes
over the copy bandwidth of the same run); >= 1.15x torch at batch 8. Writes DIR/hgemv_odd_<gpu>.json
as it goes (a problem measured is never lost) and prints a table last.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from ab_variants import ab_problem
from benchlib import num, table, write_results

SHAPES = [(3000, 4099), (11008, 4097), (4096, 11007), (5120, 5121), (1000, 4103)]
BATCHES = [1, 2, 3, 4, 8]
# The bfloat16 problems measured beside the float16 ones: the aligned batch-8 figure of the issue,
# and the smallest shape at both ends of the batches.
EXTRA = [("bfloat16", 5120, 5120, 8), ("bfloat16", 1000, 4103, 1), ("bfloat16", 1000, 4103, 8)]

# The tensor-core configs (each one row group per block, so each also split): those that won or
# came second on some problem of earlier runs of this harness (docs/history/families.md).
TENSOR_CORES = [dict(threads_per_row=256, warps_per_block=8, rows_per_group=1, unroll=4),
                dict(threads_per_row=256, warps_per_block=8, rows_per_group=1, unroll=2),
                dict(threads_per_row=256, warps_per_block=8, rows_per_group=2, unroll=2),
                dict(threads_per_row=128, warps_per_block=4, rows_per_group=2, unroll=2)]
# One vector: the CUDA-core forms with x in shared memory and A requested before it is staged
# (load_schedule=early), a warp or two a row, 4 packs a lane (8 and 16 lost to these: the history).
EARLY_ROWS = [dict(threads_per_row=tpr, warps_per_block=wpb, unroll=4) for tpr, wpb in ((32, 8), (64, 8), (32, 4))]
# Rows in flight (row_align=peeled through the read-only path, batch tiles 1 to 4): 2 to 8 warps a row,
# 1 to 4 row groups a block, 1 to 4 packs a lane per pass (fewer with more vectors: their x takes the
# registers).
IN_FLIGHT = ((64, 4), (64, 8), (128, 4), (128, 8), (256, 8))
IN_FLIGHT_UNROLLS = {1: (2, 4), 2: (1, 2, 4), 3: (1, 2), 4: (1, 2)}
# Rows a group (pack_width apart, sharing each load of x), where the weights in flight fit: the space
# leaves out the rest.
IN_FLIGHT_GROUPS = (1, 2, 4)
SIDES = ("peeled", "scalar", "rows", "flight")


def candidate_params(batch: int, n: int) -> list[tuple[str, dict]]:
    """(side, params) for one batch: each tensor-core config unsplit and split over 2 blocks, with
    no register bound and bounded for 2 and 3 blocks per SM, rows peeled (both ways on aligned rows);
    for one vector also EARLY_ROWS ("rows"); for batches to 4 IN_FLIGHT ("flight")."""
    from autogen.families.hgemv import batch_tile_for

    tile = batch_tile_for(batch)
    row_aligns = ("peeled",) if n % 8 else SIDES[:2]
    rows = [(row_align, dict(mma, x_path="mma", pack_width=8, batch_tile=tile, split_k=split, min_blocks=blocks,
                             row_align=row_align))
            for mma in TENSOR_CORES for split in (1, 2) for blocks in (1, 2, 3) for row_align in row_aligns]
    if batch == 1:
        rows += [("rows", dict(cuda_core, x_path="smem", pack_width=8, rows_per_group=1, load_schedule="early",
                               row_align="peeled"))
                 for cuda_core in EARLY_ROWS]
    flight_tile = batch_tile_for(batch, dict(x_path="ldg", row_align="peeled"))
    if flight_tile in IN_FLIGHT_UNROLLS:
        rows += [("flight", dict(threads_per_row=tpr, warps_per_block=wpb, unroll=unroll, x_path="ldg", pack_width=8,
                                 rows_per_group=group, batch_tile=flight_tile, row_align="peeled"))
                 for tpr, wpb in IN_FLIGHT for unroll in IN_FLIGHT_UNROLLS[flight_tile] for group in IN_FLIGHT_GROUPS]
    return rows


# A plain read of A's bytes, 16 bytes a load, UNROLL loads in flight per thread, each block a
# contiguous share; a result is stored only if impossible, so nothing but the reads is timed.
READ_KERNEL = r"""
template <int UNROLL>
__device__ void read_share(const uint4* __restrict__ p, long long words, unsigned int* sink)
{
    const long long per = (words + gridDim.x - 1) / gridDim.x;
    const long long lo = blockIdx.x * per, hi = min(words, lo + per);
    unsigned int acc = 0;
    long long i = lo + threadIdx.x;
    for (; i + (UNROLL - 1) * (long long)blockDim.x < hi; i += UNROLL * (long long)blockDim.x) {
        uint4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
            asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                         : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w) : "l"(p + i + u * blockDim.x));
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) acc ^= v[u].x + v[u].y + v[u].z + v[u].w;
    }
    for (; i < hi; i += blockDim.x) {
        const uint4 v = __ldg(p + i);
        acc ^= v.x + v.y + v.z + v.w;
    }
    if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;
}
extern "C" __global__ void read_u4(const uint4* p, long long words, unsigned int* sink) { read_share<4>(p, words, sink); }
extern "C" __global__ void read_u8(const uint4* p, long long words, unsigned int* sink) { read_share<8>(p, words, sink); }
"""
READ_GRIDS = ((2, 512, "read_u4"), (4, 256, "read_u4"), (4, 512, "read_u4"), (8, 256, "read_u4"),
              (4, 256, "read_u8"), (8, 256, "read_u8"), (16, 128, "read_u8"))  # (blocks per SM, threads, kernel)


def read_ceiling(evaluator) -> dict:
    """The time of a plain read of A (its whole 16-byte words) on the evaluator's cold input sets:
    the best of READ_GRIDS, each timed as the kernels are."""
    from autogen.gpu.compile import compile_cubin
    from autogen.gpu.measure import time_enqueue

    cupy, device = evaluator.cupy, evaluator.device
    module = cupy.cuda.function.Module()
    module.load(compile_cubin(READ_KERNEL, device.arch))
    sets = evaluator.timing_inputs()
    words = np.int64(sets[0]["A"].nbytes // 16)
    sink = cupy.zeros(16 * 1024, dtype=cupy.uint32)
    timed = {}
    for per_sm, threads, name in READ_GRIDS:
        kernel, blocks = module.get_function(name), per_sm * device.sm_count
        timing = time_enqueue(cupy, lambda i, k=kernel, b=blocks, t=threads: k((b,), (t,), (sets[i]["A"], words, sink)),
                              len(sets))
        timed[f"{name}_{per_sm}x{threads}"] = round(statistics.median(timing.samples_us), 3)
    best = min(timed, key=timed.get)
    return {"read_us": timed[best], "read_grid": best, "read_grids_us": timed}


def figures(us: float, floor: float, peer_us: float | None) -> dict:
    return {"us": us, "pct_of_weights_floor": round(100 * floor / us, 1),
            "speedup_vs_peer": round(peer_us / us, 3) if peer_us else None}


def summarize(family, problem, row: dict, tags: dict) -> dict:
    """The problem's figures: the best kernel of each side and of all ("best"), and the plain read
    of A ("read": what a kernel doing nothing but read its weights takes, as x torch and % floor)."""
    floor = family.weight_bytes(problem) / (row["copy_gbs"] * 1e9) * 1e6
    peer_us = row.get("peer_us")
    out = {"problem": row["problem"], "gpu": row["gpu"], "copy_gbs": row["copy_gbs"],
           "weights_floor_us": round(floor, 3), "peer": row.get("peer"), "peer_us": peer_us,
           "failed": row["failed"], "medians_us": row["medians_us"]}
    for side in (*SIDES, "best"):
        timed = {name: us for name, us in row["medians_us"].items() if side in ("best", tags[name])}
        if timed:
            name = min(timed, key=timed.get)
            out[side] = {"kernel": name, **figures(timed[name], floor, peer_us)}
    if "read_us" in row:
        out["read"] = {"grid": row["read_grid"], "grids_us": row["read_grids_us"],
                       **figures(row["read_us"], floor, peer_us)}
        if "best" in out:
            out["best"]["pct_of_read"] = round(100 * row["read_us"] / out["best"]["us"], 1)
    return out


def side_cells(side: dict) -> tuple:
    return (num(side.get("us"), ".2f"), num(side.get("speedup_vs_peer"), ".2f"),
            num(side.get("pct_of_weights_floor"), ".1f"))


def parse_list(text: str | None, item) -> list | None:
    return None if text is None else [item(part) for part in text.split(",")]


def problems(dtypes: list[str], shapes: list[tuple[int, int]] | None, batches: list[int] | None) -> list[tuple]:
    """(dtype, m, n, batch) to measure: float16's first (batches 1, 3, 8 first), then EXTRA (unless
    shapes are chosen), then the other bfloat16 ones."""
    todo = [(d, m, n, b) for b in batches or BATCHES for d in dtypes for m, n in shapes or SHAPES]
    todo += [p for p in EXTRA if shapes is None and p[0] in dtypes and p[3] in (batches or BATCHES) and p not in todo]
    return sorted(todo, key=lambda p: (p[0] != "float16", p not in EXTRA, p[3] not in (1, 3, 8)))


def timed_configs(family, problem, dtype: str, n: int, batch: int) -> tuple[dict, list]:
    """({kernel name: side}, configs) the search could time on this problem."""
    tags, configs = {}, []
    for side, params in candidate_params(batch, n):
        params = {**family.default_params, **params}
        if family.space.violations(params):
            continue  # e.g. min_blocks=3 where A's registers would spill
        config = family.space.check(params)
        if family.reject_reason(problem, config):
            continue  # the search would not time it here (a split where row blocks fill the GPU, ...)
        tags[family.kernel_name(dtype, config)] = side
        configs.append(config)
    return tags, configs


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget", type=float, default=300.0, help="no new problem starts after this many seconds")
    parser.add_argument("--dtypes", default="float16,bfloat16")
    parser.add_argument("--shapes", help="MxN,MxN,... (default: SHAPES, and EXTRA)")
    parser.add_argument("--batches", help="B,B,... (default: 1,2,3,4,8)")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    from autogen.core.registry import get_family

    family = get_family("hgemv")
    shapes = parse_list(args.shapes, lambda text: tuple(int(v) for v in text.split("x")))
    todo = problems(args.dtypes.split(","), shapes, parse_list(args.batches, int))
    started, rows = time.monotonic(), []
    for dtype, m, n, batch in todo:
        if time.monotonic() - started > args.budget:
            print(f"budget spent: {dtype} {m}x{n}x{batch} and later problems not measured")
            break
        problem = family.problem(dtype, m=m, n=n, batch=batch)
        tags, configs = timed_configs(family, problem, dtype, n, batch)
        row = ab_problem(family, problem, configs, args.rounds, probe=read_ceiling)
        rows.append(summarize(family, problem, row, tags))
        write_results(args.out, "hgemv_odd", rows[0]["gpu"], {"problems": rows})
        r = rows[-1]
        print(f"{dtype:>8} {m:>6}x{n:<6}x{batch}  torch {r['peer_us']:8.2f} us  "
              + "  ".join(f"{side} {r[side]['us']:8.2f} us {r[side]['speedup_vs_peer']:.2f}x "
                          f"{r[side]['pct_of_weights_floor']:5.1f}%" for side in (*SIDES, "read") if side in r)
              + (f"  FAILED {len(r['failed'])}" if r["failed"] else ""), flush=True)

    gpu = rows[0]["gpu"] if rows else None
    write_results(args.out, "hgemv_odd", gpu, {"wall_s": round(time.monotonic() - started, 1), "problems": rows})
    print(f"\nhgemv, n % 8 != 0, on {gpu}, cold, kernel and torch in the same process")
    sides = ("peeled", "rows", "flight", "best", "read")
    print(table(("problem", "torch us", *(f"{side} {what}" for side in sides for what in ("us", "x", "%fl")),
                 "best % read", "best kernel"),
                ((r["problem"], num(r["peer_us"], ".2f"),
                  *(cell for side in sides for cell in side_cells(r.get(side, {}))),
                  num(r.get("best", {}).get("pct_of_read"), ".1f"), r.get("best", {}).get("kernel"))
                 for r in rows)))
    for r in rows:
        for name, reason in r["failed"].items():
            print(f"FAILED {r['problem']} {name}: {reason[:200]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
