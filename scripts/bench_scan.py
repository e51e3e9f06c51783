"""The scan (prefix sum) benchmark: tune each problem (winners land in --db), then time each
winner, CUB's DeviceScan (scripts/cub_peers.cu, built with nvcc at the start) and torch.cumsum
(out=, in a torch.cuda.CUDAGraph) in this process, on the same cold input sets, and print a table.

Targets (issue 37), at n = 2^24 and 2^28: >= 1.0x CUB, >= 1.5x torch.cumsum, and at 2^28 >= 90% of
the device-to-device copy bandwidth measured in the same run (bytes moved: x read once, out
written once). Three odd n show the tails.

    python scripts/bench_scan.py --out DIR [--db URL] [--trials N] [--budget S] [--dtypes float32,int32]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_histogram_copy_if import cub_ready, graph_us, start_gpu_and_cub, torch_graph_us, winner_launcher  # noqa: E402
from benchlib import Budget, cold_input_sets, num, table, tune_each, write_results  # noqa: E402

SIZES = (2**24, 2**28, 1_000_003, 16_777_259, 123_456_791)  # the two, then three odd n
TARGET_SIZES = (2**24, 2**28)


def problems_of(dtypes: list[str], exclusive: bool) -> list[tuple[str, dict]]:
    scan = "exclusive" if exclusive else "inclusive"
    return [(dtype, {"n": n, "scan": scan, "acc_dtype": "auto"}) for dtype in dtypes for n in SIZES]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON, the CUB library and logs")
    parser.add_argument("--db", help="tuning database URL (default: DIR/bench_scan.db)")
    parser.add_argument("--trials", type=int, default=12, help="variants measured per problem (default 12)")
    parser.add_argument("--budget", type=float, default=150.0, help="seconds for the whole run (default 150)")
    parser.add_argument("--dtypes", default="float32,int32", help="comma-separated x dtypes (default float32,int32)")
    parser.add_argument("--exclusive", action="store_true", help="exclusive scans (default inclusive)")
    return parser.parse_args(argv)


def measure(cupy, torch, family, problem, params: dict, arch: str) -> dict:
    """Winner, CUB and torch.cumsum on the same cold input sets; each one's output checked once."""
    from autogen.families.cub_peers import cub_library
    from autogen.families.scan import torch_cumsum_into
    from autogen.gpu.peers import as_tensor
    from autogen.gpu.measure import judge

    sets = cold_input_sets(cupy, family, problem)
    k = len(sets)
    expected = family.reference(problem, sets[0], cupy)
    magnitude = family.reference_magnitude(problem, sets[0], cupy)
    times, checks = {}, {}

    def timed(name: str, run) -> None:
        times[name] = graph_us(cupy, lambda i: run(sets[i]), k)
        sets[0]["out"].fill(0)
        run(sets[0])
        checks[name] = judge(family, problem, sets[0], expected, magnitude, cupy)[1] or "ok"

    timed("autogen", winner_launcher(cupy, family, problem, params, arch))
    cub = cub_library()
    if cub is not None and problem.dtype in ("float32", "int32"):
        timed("cub", cub.scan_peer(cupy, problem.dtype, family.out_dtype(problem), problem["n"],
                                   problem["scan"] == "exclusive").run)
    if torch is not None:  # in torch's own CUDA graph, on torch tensors viewing the same sets
        cupy.cuda.get_current_stream().synchronize()
        into = torch_cumsum_into(torch, problem["scan"] == "exclusive")
        xs = [as_tensor(torch, s["x"], problem.dtype) for s in sets]
        outs = [as_tensor(torch, s["out"], family.out_dtype(problem)) for s in sets]
        times["torch.cumsum"] = torch_graph_us(torch, lambda i: into(xs[i], outs[i]), k)
        sets[0]["out"].fill(0)
        into(xs[0], outs[0])
        torch.cuda.synchronize()
        checks["torch.cumsum"] = judge(family, problem, sets[0], expected, magnitude, cupy)[1] or "ok"
    del sets
    cupy.get_default_memory_pool().free_all_blocks()
    return {"us": times, "check": checks}


def summarise(doc: dict, problem, measured: dict) -> None:
    us = measured["us"]
    doc["measured"] = measured
    copy_gbs = doc.get("copy_bandwidth_gb_per_s")
    doc["gb_per_s"] = round(doc["bytes_moved"] / (us["autogen"] * 1e-6) / 1e9, 1)
    doc["pct_of_copy"] = round(100 * doc["gb_per_s"] / copy_gbs, 1) if copy_gbs else None
    doc["vs_cub"] = round(us["cub"] / us["autogen"], 3) if "cub" in us else None
    doc["vs_torch"] = round(us["torch.cumsum"] / us["autogen"], 3) if "torch.cumsum" in us else None
    if problem["n"] in TARGET_SIZES:
        doc["targets"] = {"vs CUB >= 1.0": doc["vs_cub"] is not None and doc["vs_cub"] >= 1.0,
                          "vs torch.cumsum >= 1.5": doc["vs_torch"] is not None and doc["vs_torch"] >= 1.5}
        if problem["n"] == 2**28:
            doc["targets"]["copy bandwidth >= 90%"] = doc["pct_of_copy"] is not None and doc["pct_of_copy"] >= 90
    else:
        doc["targets"] = {}


def row_cells(doc: dict) -> tuple:
    p = doc["problem"]
    label = f"{p['dtype']} n={p['shape']['n']} {p['shape']['scan'][:4]}"
    m = doc.get("measured")
    if not m:
        return (label, "no winner")
    us = m["us"]
    met = "-" if not doc["targets"] else "yes" if all(doc["targets"].values()) else "NO"
    return (label, num(us["autogen"], ".1f"), num(doc["gb_per_s"], ".0f"), num(doc["pct_of_copy"], ".1f"),
            num(us.get("cub"), ".1f"), num(doc["vs_cub"], ".2f"), num(us.get("torch.cumsum"), ".1f"),
            num(doc["vs_torch"], ".2f"), met, doc["winner"]["kernel"])


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    from autogen.core.registry import get_family

    cupy, torch, arch, build = start_gpu_and_cub(args.out)
    family = get_family("scan")
    db_url = args.db or f"sqlite:///{args.out / 'bench_scan.db'}"
    selected = problems_of(args.dtypes.split(","), args.exclusive)
    # A search's limit covers its tune's start: on session 18's H200 a scan problem spent 5-7 s
    # starting its GPU worker and timing its peer before its first variant, so a limit of 3 s
    # measured nothing.
    budget = Budget(total_s=args.budget, fixed_s=3.0, at_least_s=10.0, reserve_s=2.0 * len(selected))
    weights = [4.0 if dims["n"] > 2**26 else 1.0 for _dtype, dims in selected]
    options = {"trials": args.trials, "db_url": db_url, "top_k": 3, "retime_rounds": 5}
    docs = []
    cub_ready(build, wait=False)
    problems = [family.problem(dtype, **dims) for dtype, dims in selected]
    for problem, _result, doc in tune_each(problems, options, budget, weights, started):
        docs.append((problem, doc))
        print(f"tuned {problem} in {doc['bench_wall_s']} s", file=sys.stderr, flush=True)
        write_results(args.out, "scan", doc["gpu"], {"problems": [d for _p, d in docs]})
        cub_ready(build, wait=False)
    cub_ready(build, wait=True)
    rows = []
    for problem, doc in docs:
        if doc["winner"] is not None:
            summarise(doc, problem, measure(cupy, torch, family, problem, doc["winner"]["params"], arch))
        rows.append(doc)
        write_results(args.out, "scan", doc["gpu"], {"problems": rows + [d for _p, d in docs[len(rows):]]})
    total = time.monotonic() - started
    write_results(args.out, "scan", rows[0]["gpu"] if rows else None,
                  {"problems": rows, "wall_s": round(total, 1), "database": db_url})
    print(table(("problem", "us", "GB/s", "%copy", "CUB us", "xCUB", "torch us", "xtorch", "met", "kernel"),
                map(row_cells, rows)))
    print(f"\nGB/s = (x read + out written) / time; %copy = that over the copy bandwidth measured in the same run; "
          f"wall {total:.0f} s; winners in {db_url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
