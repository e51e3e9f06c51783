"""The transpose and concat benchmark: tune each problem, then time in torch's own CUDA graphs, on
cold rotating input sets, autogen's call against x.t().contiguous() / torch.cat (both allocating
their result, as user code does); the tuner's figures (its peer: torch's out= form, in the same
CuPy graphs) and the share of the copy bandwidth measured in the same run come with them. Writes
transpose_concat_<gpu>.json and prints a table.

Targets (issue 37): >= 95% of the copy bandwidth at >= 64 MiB, >= 1.2x torch on odd shapes.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from benchlib import (Budget, num, render_table, shape_text, table, torch_graph, torch_graph_medians, tune_each,
                      write_results)

MIB64 = 64 << 20
PROBLEMS = [
    ("transpose", "float32", {"rows": 4096, "cols": 4096}),
    ("transpose", "float16", {"rows": 4096, "cols": 8192}),
    ("transpose", "float32", {"rows": 4099, "cols": 3001}),
    ("transpose", "bfloat16", {"rows": 4099, "cols": 3001}),
    ("transpose", "float16", {"rows": 1025, "cols": 12289}),
    ("concat", "float32", {"k": 4, "rows": 4096, "cols": 4096, "axis": "0"}),
    ("concat", "float16", {"k": 4, "rows": 4096, "cols": 8192, "axis": "1"}),
    ("concat", "float32", {"k": 3, "rows": 4099, "cols": 3001, "axis": "1"}),
    ("concat", "bfloat16", {"k": 5, "rows": 4099, "cols": 3001, "axis": "0"}),
    ("concat", "float16", {"k": 9, "rows": 2047, "cols": 3001, "axis": "1"}),
]
ROUNDS = 5


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON and the database")
    parser.add_argument("--trials", type=int, default=40, help="variants measured per problem (default 40)")
    parser.add_argument("--timeout", type=float, help="stop each problem's search after this many seconds")
    parser.add_argument("--budget", type=float, help="seconds for the whole run's searches, shared out")
    parser.add_argument("--only", choices=["transpose", "concat"], help="benchmark one family only")
    return parser.parse_args(argv)


def torch_calls(torch, problem, inputs: dict):
    """(autogen's call, torch's) on one input set's tensors, each allocating its result."""
    import autogen

    if problem.family == "transpose":
        x = inputs["x"]
        return (lambda: autogen.transpose(x)), (lambda: x.t().contiguous())
    arrays, axis = [inputs[f"x{s}"] for s in range(problem["k"])], int(problem["axis"])
    return (lambda: autogen.concat(arrays, axis=axis)), (lambda: torch.cat(arrays, dim=axis))


def time_in_torch(problem, family) -> dict:
    """autogen vs torch, both allocating, in torch's graphs on cold rotating sets; failures reported."""
    try:
        import torch
    except ImportError:
        return {"unavailable": "PyTorch is not importable"}
    import cupy

    import autogen
    from autogen.gpu.device import device_identity
    from autogen.gpu.peers import as_tensor

    set_bytes = family.bytes_moved(problem)
    count = max(2, min(16, math.ceil(4 * device_identity().l2_bytes / set_bytes) + 1))
    rng = cupy.random.default_rng(7)
    sets = []
    for _ in range(count):
        made = family.make_inputs(problem, cupy, rng, family.timing_case(problem))
        sets.append({k: as_tensor(torch, v, problem.dtype) for k, v in made.items() if k != "y"})
    calls = [torch_calls(torch, problem, s) for s in sets]
    result: dict = {"input_sets": count}
    try:
        served = autogen.lookup(problem.family, **dict(problem.sizes), **dict(problem.traits), dtype=problem.dtype)
        result["served"] = {"kernel": served.name, "served_by": served.served_by}
        ours, theirs = calls[0][0](), calls[0][1]()
        result["agree"] = bool(torch.equal(ours, theirs))
        graphs = {label: torch_graph(torch, lambda i, j=j: calls[i][j](), count)
                  for j, label in enumerate(("autogen", "torch"))}
        for label, (median, spread) in torch_graph_medians(torch, graphs, ROUNDS).items():
            result[label] = {"time_us": round(median, 3), "spread_us": round(spread, 3)}
        del graphs
    except Exception as exc:  # report and go on: one failure must not end the benchmark
        result["failed"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
    del sets, calls
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    cupy.get_default_memory_pool().free_all_blocks()
    return result


def summarize(doc: dict) -> dict:
    w = doc.get("winner") or {}
    t = doc.get("torch", {})
    ours, theirs = t.get("autogen", {}).get("time_us"), t.get("torch", {}).get("time_us")
    return {"ours_us": w.get("time_us"), "peer_us": w.get("peer_time_us"), "peer_speedup": w.get("speedup_vs_peer"),
            "pct_copy": w.get("pct_of_floor"), "torch_graph_ours_us": ours, "torch_graph_torch_us": theirs,
            "torch_speedup": round(theirs / ours, 3) if ours and theirs else None}


HEADER = ("family", "dtype", "shape", "kernel", "us", "out= us", "x out=", "%copy", "torch g ours", "torch g torch",
          "x torch")


def row_cells(doc: dict) -> tuple:
    p, s = doc["problem"], doc["summary"]
    w = doc.get("winner") or {}
    return (p["family"], p["dtype"].replace("float", "f"), shape_text(doc), w.get("kernel", doc.get("no_winner")),
            num(s["ours_us"], ".2f"), num(s["peer_us"], ".2f"), num(s["peer_speedup"], ".2f"), num(s["pct_copy"], ".1f"),
            num(s["torch_graph_ours_us"], ".2f"), num(s["torch_graph_torch_us"], ".2f"), num(s["torch_speedup"], ".2f"))


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    from autogen.core.registry import get_family

    db_url = f"sqlite:///{args.out / 'bench_transpose_concat.db'}"
    from autogen.runtime import dispatch
    dispatch._default_dispatcher = dispatch.Dispatcher(db_url)  # autogen's calls serve this run's winners
    problems = [get_family(name).problem(dtype, **dims) for name, dtype, dims in PROBLEMS
                if not args.only or name == args.only]
    rows = []
    budget = Budget(total_s=args.budget, timeout_s=args.timeout)
    for problem, _result, doc in tune_each(problems, {"trials": args.trials, "db_url": db_url}, budget):
        family = get_family(problem.family)
        doc["torch"] = time_in_torch(problem, family) if doc.get("winner") else {}
        doc["summary"] = summarize(doc)
        rows.append(doc)
        write_results(args.out, "transpose_concat", rows[0]["gpu"], {"problems": rows})
        print(render_table([row_cells(doc)]), file=sys.stderr, flush=True)

    copy = next((d["copy_bandwidth_gb_per_s"] for d in rows if d.get("copy_bandwidth_gb_per_s")), None)
    print(f"\n{rows[0]['gpu'] if rows else '?'}, copy bandwidth {copy} GB/s; us: the tuner's time (CuPy graphs, cold); "
          "out= us: torch's out= form there; torch g: autogen's call and x.t().contiguous() / torch.cat in torch's "
          "graphs, both allocating")
    print(table(HEADER, map(row_cells, rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
